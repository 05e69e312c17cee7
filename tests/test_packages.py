"""The package reader/verifier and the package writer (no torch: packages are built by hand here)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.package_writer import write_package
from edge_runtime.families.registry import read_package, validate_card
from edge_runtime.packages import PackageError, build_manifest, compute_digest, file_sha256
from edge_runtime.packages.golden import golden_bytes

ROOT = Path(__file__).resolve().parents[1]


def _card(**overrides: Any) -> dict[str, Any]:
    card = {
        "format": "edge-runtime-package/1",
        "name": "tiny-classifier",
        "family": "encoder",
        "kind": "sequence-classification",
        "surfaces": ["classify"],
        "description": "hand-made package for reader tests",
        "version": "0.1.0",
        "release_date": "2025-01-02",
        "revision": "abc123",
        "source": {"name": "tests", "architecture": "BertForSequenceClassification", "license": "Apache-2.0"},
        "modalities": ["text"],
        "labels": ["negative", "positive"],
        "head": {"output": "logits", "activation": "softmax"},
        "limits": {"max_input_tokens": 16},
        "graph": {"inputs": ["input_ids", "attention_mask"], "outputs": ["logits"], "opset": 18},
        "variants": {"fp32": {"file": "model.onnx", "dtype": "fp32", "golden": "golden.npz"}},
        "verification": {"reference": "hand-made", "max_abs_diff": 0.0, "tolerance": 1e-4, "cases": 1},
    }
    card.update(overrides)
    return card


def _golden() -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    ids = np.array([[2, 7, 9, 3]], dtype=np.int64)
    return [({"input_ids": ids, "attention_mask": np.ones_like(ids)},
             {"logits": np.array([[0.25, -1.5]], dtype=np.float32)})]


def _write(out: Path, card: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> str:
    files: dict[str, Any] = {"model.onnx": b"\x08\x09not-a-real-graph", "tokenizer.json": b'{"model": {}}'}
    files.update(extra or {})
    return write_package(out, card or _card(), files, {"fp32": _golden()})


def _remanifest(pkg: Path) -> None:
    """Rewrite MANIFEST.json for the directory as it is, so that a later check is the one that fires."""
    (pkg / "MANIFEST.json").write_text(json.dumps(build_manifest(pkg)))


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    out = tmp_path / "pkg"
    _write(out)
    return out


def _refused(pkg: Path, file: str, *words: str) -> PackageError:
    with pytest.raises(PackageError) as info:
        read_package(pkg)
    err = info.value
    assert err.file == file, str(err)
    assert str(err).startswith(f"{file}: ")
    for w in words:
        assert w in str(err), str(err)
    return err


def test_valid_package_loads(pkg: Path) -> None:
    p = read_package(pkg)
    manifest = json.loads((pkg / "MANIFEST.json").read_text())
    assert p.digest == manifest["digest"]
    assert p.digest == compute_digest({rel: e["sha256"] for rel, e in manifest["files"].items()})
    assert sorted(manifest["files"]) == ["card.json", "golden.npz", "model.onnx", "tokenizer.json"]
    for rel, entry in manifest["files"].items():
        assert entry == {"sha256": file_sha256(pkg / rel), "size": (pkg / rel).stat().st_size}
    assert p.card.name == "tiny-classifier" and p.card.kind == "sequence-classification"
    assert p.card.labels == ("negative", "positive")
    assert p.card.variants["fp32"].golden == "golden.npz"
    assert p.graph("fp32") == pkg.resolve() / "model.onnx"
    (case,) = p.golden("fp32")
    np.testing.assert_array_equal(case.feeds["input_ids"], [[2, 7, 9, 3]])
    np.testing.assert_array_equal(case.outputs["logits"], np.array([[0.25, -1.5]], dtype=np.float32))
    assert p.head_weights() == {} and p.decision_config() is None
    with pytest.raises(PackageError, match="no variant 'int8'"):
        p.graph("int8")
    with pytest.raises(PackageError, match="not in the package"):
        p.file("../card.json")


def test_digest_is_canonical_json_of_file_digests() -> None:
    import hashlib

    files = {"b.txt": "11" * 32, "a.txt": "22" * 32}
    expect = hashlib.sha256(json.dumps(files, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert compute_digest(files) == expect
    assert compute_digest(dict(reversed(list(files.items())))) == expect


def test_tampered_file_refused(pkg: Path) -> None:
    data = bytearray((pkg / "model.onnx").read_bytes())
    data[-1] ^= 0x01  # same size, different bytes
    (pkg / "model.onnx").write_bytes(bytes(data))
    _refused(pkg, "model.onnx", "sha256", "altered")


def test_resized_file_refused(pkg: Path) -> None:
    with open(pkg / "tokenizer.json", "ab") as f:
        f.write(b" ")
    _refused(pkg, "tokenizer.json", "size", "altered")


def test_missing_file_refused(pkg: Path) -> None:
    (pkg / "golden.npz").unlink()
    _refused(pkg, "golden.npz", "missing")


def test_missing_manifest_refused(pkg: Path) -> None:
    (pkg / "MANIFEST.json").unlink()
    _refused(pkg, "MANIFEST.json", "missing")


def test_extra_file_refused(pkg: Path) -> None:
    (pkg / "LICENSES").mkdir()
    (pkg / "LICENSES" / "sneaky.py").write_text("print('hi')")
    _refused(pkg, "LICENSES/sneaky.py", "not listed")


def test_symlink_refused(pkg: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.json").write_text("{}")
    os.symlink(tmp_path / "outside.json", pkg / "extra.json")
    _remanifest(pkg)
    _refused(pkg, "extra.json", "symbolic link")


def test_a_hugging_face_snapshot_may_link_into_its_own_blobs_only(pkg: Path, tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for path in sorted(pkg.iterdir()):
        blob = repo / "blobs" / path.name
        shutil.copyfile(path, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / path.name)
    assert read_package(snapshot).digest == read_package(pkg).digest
    (tmp_path / "outside.json").write_text("{}")
    os.symlink(tmp_path / "outside.json", snapshot / "extra.json")
    (snapshot / "MANIFEST.json").unlink()
    (snapshot / "MANIFEST.json").write_text(json.dumps(build_manifest(snapshot)))
    _refused(snapshot, "extra.json", "symbolic link")


def test_manifest_path_outside_package_refused(pkg: Path) -> None:
    manifest = json.loads((pkg / "MANIFEST.json").read_text())
    manifest["files"]["../escape"] = {"sha256": "0" * 64, "size": 1}
    (pkg / "MANIFEST.json").write_text(json.dumps(manifest))
    _refused(pkg, "MANIFEST.json", "bad path")


def test_digest_mismatch_refused(pkg: Path) -> None:
    manifest = json.loads((pkg / "MANIFEST.json").read_text())
    manifest["digest"] = "f" * 64
    (pkg / "MANIFEST.json").write_text(json.dumps(manifest))
    _refused(pkg, "MANIFEST.json", "digest")


def test_bad_json_refused(pkg: Path) -> None:
    (pkg / "card.json").write_text('{"name": "x",')
    _remanifest(pkg)
    _refused(pkg, "card.json", "not valid JSON")


def test_bad_manifest_json_refused(pkg: Path) -> None:
    (pkg / "MANIFEST.json").write_text("[not json")
    _refused(pkg, "MANIFEST.json", "not valid JSON")


@pytest.mark.parametrize("mutate, words", [
    (lambda c: c.pop("labels"), ["labels"]),
    (lambda c: c.update(release_date="2025-13-01"), ["release_date"]),
    (lambda c: c["limits"].update(max_input_tokens="512"), ["max_input_tokens"]),
    (lambda c: c.update(surfaces=["embeddings"]), ["surfaces"]),
    (lambda c: c.update(kind="sparrow"), ["kind"]),
    (lambda c: c["head"].update(output="probs"), ["head.output", "graph output"]),
    (lambda c: c["variants"]["fp32"].update(file="../model.onnx"), ["file"]),
])
def test_malformed_card_refused(pkg: Path, mutate: Any, words: list[str]) -> None:
    card = json.loads((pkg / "card.json").read_text())
    mutate(card)
    (pkg / "card.json").write_text(json.dumps(card))
    _remanifest(pkg)
    _refused(pkg, "card.json", *words)


def test_unknown_family_refused(pkg: Path) -> None:
    card = json.loads((pkg / "card.json").read_text())
    card["family"] = "llama"
    (pkg / "card.json").write_text(json.dumps(card))
    _remanifest(pkg)
    _refused(pkg, "card.json", "llama", "family")


def test_head_npz_with_pickled_object_refused(tmp_path: Path) -> None:
    import io

    buf = io.BytesIO()
    np.savez(buf, weights=np.array([{"__reduce__": "os.system"}], dtype=object))
    out = tmp_path / "pkg"
    with pytest.raises(PackageError, match="head.npz"):  # the writer verifies with the reader too
        _write(out, extra={"head.npz": buf.getvalue()})
    assert not out.exists()
    # a package that carries it anyway is refused by the reader, naming the file
    _write(out)
    (out / "head.npz").write_bytes(buf.getvalue())
    _remanifest(out)
    _refused(out, "head.npz", "refused")


def test_head_npz_plain_arrays_load(tmp_path: Path) -> None:
    import io

    buf = io.BytesIO()
    np.savez(buf, readout=np.arange(6, dtype=np.float32).reshape(2, 3))
    out = tmp_path / "pkg"
    _write(out, extra={"head.npz": buf.getvalue()})
    w = read_package(out).head_weights()
    np.testing.assert_array_equal(w["readout"], np.arange(6, dtype=np.float32).reshape(2, 3))


def test_golden_with_pickled_object_refused(pkg: Path) -> None:
    np.savez(pkg / "golden.npz", **{"0/in/input_ids": np.array([[object()]], dtype=object)})
    _remanifest(pkg)
    _refused(pkg, "golden.npz")


def test_decision_family_needs_decision_config(tmp_path: Path) -> None:
    card = _card(family="sparrow", kind="sparrow", surfaces=["decisions"], labels=[],
                 head={"output": "probs"}, graph={"inputs": ["state_ids"], "outputs": ["probs"], "opset": 18})
    with pytest.raises(PackageError) as info:
        _write(tmp_path / "dec", card=card)
    assert info.value.file == "decision_config.json"
    _write(tmp_path / "dec", card=card, extra={"decision_config.json": b'{"format": "x"}'})
    assert read_package(tmp_path / "dec").decision_config() == {"format": "x"}


def test_card_consistency_rules() -> None:
    ml = _card(kind="multi-label", labels=["a", "b"],
               head={"output": "logits", "activation": "sigmoid", "thresholds": {"a": 0.5}})
    with pytest.raises(PackageError, match="one threshold per label"):
        validate_card(ml)
    emb = _card(kind="embedding", surfaces=["embeddings"], labels=[],
                head={"pooling": "mean", "normalize": True, "dimension": 32, "dimensions": [32, 16],
                      "layers": {"1": "hidden_states.1", "2": "last_hidden_state"}},
                graph={"inputs": ["input_ids"], "outputs": ["last_hidden_state"], "opset": 18})
    with pytest.raises(PackageError, match="hidden_states.1"):
        validate_card(emb)
    good = copy.deepcopy(emb)
    good["graph"]["outputs"].append("hidden_states.1")
    validate_card(good)
    bad_dims = copy.deepcopy(good)
    bad_dims["head"]["dimensions"] = [64, 32]
    with pytest.raises(PackageError, match="dimensions"):
        validate_card(bad_dims)
    tok = _card(kind="token-classification", labels=["O", "PER"], head={"output": "logits", "scheme": "BIO"})
    with pytest.raises(PackageError, match="PER"):
        validate_card(tok)


def test_writer_replaces_existing_package(tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    first = _write(out)
    (out / "stale-marker").write_text("x")  # would be an extra file if the old directory survived
    second = _write(out, card=_card(description="second build"))
    assert first != second
    assert read_package(out).card.description == "second build"
    assert not (out / "stale-marker").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no temporary directories left


def test_writer_never_replaces_a_non_package(tmp_path: Path) -> None:
    keep = tmp_path / "home"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="not a package"):
        _write(keep)
    assert (keep / "notes.txt").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    _write(empty)
    assert read_package(empty).card.name == "tiny-classifier"


def test_writer_validates_card_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    with pytest.raises(PackageError, match="family"):
        _write(out, card=_card(family="unknown"))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="written by write_package"):
        write_package(out, _card(), {"card.json": b"{}"}, {"fp32": _golden()})


def test_writer_is_deterministic(tmp_path: Path) -> None:
    assert _write(tmp_path / "a") == _write(tmp_path / "b")
    assert (tmp_path / "a" / "golden.npz").read_bytes() == golden_bytes(_golden())


def test_reader_imports_no_runtime_or_torch(pkg: Path) -> None:
    code = ("import sys; from edge_runtime.families.registry import read_package; "
            f"read_package({str(pkg)!r}); "
            "bad = [m for m in ('onnxruntime', 'torch', 'transformers', 'optimum') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_real_fixture_package_reads(fixture_package: Any) -> None:
    p = read_package(fixture_package("sequence-classification"))
    assert p.card.family == "encoder" and p.card.surfaces == ("classify",)
    copy_dir = Path(str(p.path) + "-copy")
    shutil.copytree(p.path, copy_dir)
    try:
        assert read_package(copy_dir).digest == p.digest  # the digest does not depend on where it lies
    finally:
        shutil.rmtree(copy_dir)


def test_the_reader_knows_only_the_families_it_is_handed(pkg: Path) -> None:
    """packages/ names no family: the card rules come from the caller (the registry in the server)."""
    from edge_runtime import packages
    from edge_runtime.packages import CardRules, FamilyCard

    with pytest.raises(PackageError, match="is not one of"):
        packages.read_package(pkg, CardRules({"other": FamilyCard(kinds={"other": ("classify",)})}))
    loose = CardRules({"encoder": FamilyCard(kinds={"sequence-classification": ("classify",)})})
    assert packages.read_package(pkg, loose).card.kind == "sequence-classification"
    wrong = CardRules({"encoder": FamilyCard(kinds={"sequence-classification": ("rerank",)})})
    with pytest.raises(PackageError, match="rerank"):
        packages.read_package(pkg, wrong)
    with pytest.raises(ValueError, match="one family"):
        CardRules({"a": FamilyCard(kinds={"k": ("classify",)}), "b": FamilyCard(kinds={"k": ("rerank",)})})
