"""Converters: every kind through fixtures, refusals, int8, determinism, CLI errors, MiniLM parity."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from converters.encoder.export import ExportOptions, export_model
from converters.encoder.fixture import build_fixture, build_fixture_result, build_source
from converters.errors import ConversionError
from converters.samples import SAMPLE_TEXTS
from edge_runtime.families.registry import read_package

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank")


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def _torch_reference(kind: str, src: Path, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """An independent PyTorch run of the fixture's source model, outputs named as in the graph."""
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = {"embedding": AutoModel, "token-classification": AutoModelForTokenClassification}.get(
        kind, AutoModelForSequenceClassification)
    model = cls.from_pretrained(src).eval()
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feeds.items()}, output_hidden_states=True)
    return {n: (out.hidden_states[int(n.split(".")[1])] if n.startswith("hidden_states.") else getattr(out, n)).numpy()
            for n in names}


EXPECTED = {
    "embedding": (["last_hidden_state", "hidden_states.1"], [], ("embeddings",)),
    "sequence-classification": (["logits"], ["negative", "neutral", "positive"], ("classify",)),
    "multi-label": (["logits"], ["billing", "shipping", "technical", "urgent"], ("classify",)),
    "token-classification": (["logits"], ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"], ("classify",)),
    "rerank": (["logits"], [], ("rerank",)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_fixture_kind(kind: str, fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    pkg = read_package(fixture_package(kind))
    card = pkg.card
    outputs, labels, surfaces = EXPECTED[kind]
    assert card.kind == kind and card.family == "encoder" and card.surfaces == surfaces
    assert list(card.labels) == labels
    assert card.raw["graph"] == {"inputs": ["input_ids", "attention_mask", "token_type_ids"],
                                 "outputs": outputs, "opset": 18}
    assert card.limits == {"max_input_tokens": 128}
    v = card.raw["verification"]
    assert 0 <= v["max_abs_diff"] <= v["tolerance"] == 1e-4 and v["batch_sizes"] == [1, 4]
    assert max(v["lengths"]) == 128  # the long sample reaches the limit
    assert (pkg.path / "model.onnx").stat().st_size < 600_000  # "a few hundred KB"
    tok = json.loads((pkg.path / "tokenizer.json").read_text())
    assert tok["padding"] is None and tok["truncation"] is None

    session = _session(pkg.graph("fp32"))
    assert [o.name for o in session.get_outputs()] == outputs
    for i in session.get_inputs():  # dynamic batch and sequence axes
        assert isinstance(i.shape[0], str) and isinstance(i.shape[1], str)
    cases = pkg.golden("fp32")
    assert len(cases) == 3 and len({c.feeds["input_ids"].shape[1] for c in cases}) == 3
    src = build_source(kind, tmp_path / "src", seed=0)  # the same seed rebuilds the same weights
    for case in cases:
        got = dict(zip(outputs, session.run(outputs, case.feeds)))
        ref = _torch_reference(kind, src, case.feeds, outputs)
        n = case.feeds["input_ids"].shape[1]
        for name in outputs:
            np.testing.assert_array_equal(got[name], case.outputs[name])  # golden reproduced
            np.testing.assert_allclose(got[name], ref[name], atol=1e-4, rtol=0)
        shape = {"embedding": (1, n, 32), "sequence-classification": (1, 3), "multi-label": (1, 4),
                 "token-classification": (1, n, 7), "rerank": (1, 1)}[kind]
        assert got[outputs[0]].shape == shape
    if kind == "rerank":  # pairs: the document's tokens have type 1
        assert all(c.feeds["token_type_ids"].max() == 1 for c in cases)


def test_embedding_head(fixture_package: Callable[..., Path]) -> None:
    head = read_package(fixture_package("embedding")).card.head
    assert head == {"pooling": "mean", "normalize": True, "dimension": 32, "dimensions": [32, 16],
                    "layers": {"1": "hidden_states.1", "2": "last_hidden_state"}}


def test_classifier_heads(fixture_package: Callable[..., Path]) -> None:
    assert read_package(fixture_package("sequence-classification")).card.head == {
        "output": "logits", "activation": "softmax"}
    assert read_package(fixture_package("multi-label")).card.head == {
        "output": "logits", "activation": "sigmoid",
        "thresholds": {"billing": 0.5, "shipping": 0.5, "technical": 0.5, "urgent": 0.5}}
    assert read_package(fixture_package("token-classification")).card.head == {"output": "logits", "scheme": "BIO"}
    assert read_package(fixture_package("rerank")).card.head == {"output": "logits", "activation": "sigmoid",
                                                                 "layer": 2, "dimension": 32}


@pytest.mark.parametrize("pooling, normalize", [("cls", False), ("last", True)])
def test_pooling_read_from_sentence_transformers_config(pooling: str, normalize: bool, tmp_path: Path) -> None:
    pkg = build_fixture("embedding", tmp_path / "p", pooling=pooling, normalize=normalize, layers=[], dimensions=[])
    head = read_package(pkg).card.head
    assert (head["pooling"], head["normalize"]) == (pooling, normalize)
    assert head["layers"] == {"2": "last_hidden_state"} and head["dimensions"] == [32]


def test_thresholds_override(tmp_path: Path) -> None:
    pkg = build_fixture("multi-label", tmp_path / "p", thresholds={"urgent": 0.3})
    assert read_package(pkg).card.head["thresholds"]["urgent"] == 0.3
    with pytest.raises(ConversionError, match="unknown label 'nope'"):
        build_fixture("multi-label", tmp_path / "q", thresholds={"nope": 0.3})
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("kind", KINDS)
def test_int8_variant(kind: str, fixture_package: Callable[..., Path]) -> None:
    pkg = read_package(fixture_package(kind, quantize=True))
    int8 = pkg.card.variants["int8"]
    assert (int8.file, int8.dtype, int8.golden) == ("model.int8.onnx", "int8", "golden.int8.npz")
    a = int8.agreement
    assert a is not None and a["cases"] >= 10
    if kind == "embedding":
        assert 0.9 <= a["min_cosine"] <= a["mean_cosine"] <= 1.0
    elif kind == "rerank":
        assert 0 <= a["mean_abs_dp"] <= a["max_abs_dp"] < 0.5
    else:
        assert 0.5 <= a["top_label_agreement"] <= 1.0 and 0 <= a["max_abs_dp"] < 0.5
    session = _session(pkg.graph("int8"))
    names = [o.name for o in session.get_outputs()]
    import onnx

    from converters.small_forward import bodies

    ops = {n.op_type for body in bodies(onnx.load(str(pkg.graph("int8")))) for n in body.graph.node}
    assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops  # int8 is the per-token variant
    for case in pkg.golden("int8"):
        for name, value in zip(names, session.run(names, case.feeds)):
            np.testing.assert_allclose(value, case.outputs[name], atol=1e-3, rtol=0)
    fp32_cases = pkg.golden("fp32")
    assert [c.feeds["input_ids"].tolist() for c in fp32_cases] == [c.feeds["input_ids"].tolist()
                                                                     for c in pkg.golden("int8")]


def test_quantize_leaves_no_files_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    build_fixture("sequence-classification", tmp_path / "p", quantize="int8-dynamic")  # onnxruntime's quantizer
    assert list(cwd.iterdir()) == []


def test_same_seed_same_digest(tmp_path: Path, fixture_package: Callable[..., Path]) -> None:
    first = read_package(fixture_package("token-classification")).digest
    again = build_fixture_result("token-classification", tmp_path / "again", seed=0).digest
    other = build_fixture_result("token-classification", tmp_path / "other", seed=1).digest
    assert again == first
    assert other != first


def test_refused_when_graph_disagrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import numpy_helper

    import converters.onnx_export as onnx_export

    real = onnx_export.export_onnx

    def corrupted(*args: Any, **kwargs: Any) -> Path:
        path = real(*args, **kwargs)
        model = onnx.load(str(path))
        init = max(model.graph.initializer, key=lambda t: np.prod(t.dims))  # the embedding table
        arr = numpy_helper.to_array(init).copy()
        # noise, not a shift: LayerNorm hides those
        arr += np.random.default_rng(0).normal(0.0, 0.05, arr.shape).astype(arr.dtype)
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
        onnx.save(model, str(path))
        return path

    monkeypatch.setattr(onnx_export, "export_onnx", corrupted)
    with pytest.raises(ConversionError, match="parity check failed.*no package written"):
        build_fixture("sequence-classification", tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_refused_above_tolerance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import converters.encoder.verify as verify

    monkeypatch.setattr(verify, "FP32_TOLERANCE", 1e-15)  # fixture diffs are ~1e-6: far above
    with pytest.raises(ConversionError, match="exceeds the tolerance 1e-15"):
        build_fixture("rerank", tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_kind_mismatch_errors(tmp_path: Path) -> None:
    src = build_source("sequence-classification", tmp_path / "src")
    with pytest.raises(ConversionError, match="exactly one output logit"):
        export_model(src, tmp_path / "out", ExportOptions(kind="rerank"))
    # the sequence head's pooler has no place in a token classifier: refused before its labels are read
    with pytest.raises(ConversionError, match=r"not loaded: bert\.pooler\.dense\.bias"):
        export_model(src, tmp_path / "out", ExportOptions(kind="token-classification"))
    (src / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()),
                                                 "architectures": ["BertForTokenClassification"]}))
    _drop_pooler(src)
    with pytest.raises(ConversionError, match="BIO"):
        export_model(src, tmp_path / "out", ExportOptions(kind="token-classification"))
    with pytest.raises(ConversionError, match="layers 1..2"):
        export_model(build_source("embedding", tmp_path / "emb"), tmp_path / "out",
                     ExportOptions(kind="embedding", layers=[3]))
    assert not (tmp_path / "out").exists()


def _drop_pooler(src: Path) -> None:
    from safetensors.numpy import load_file, save_file

    weights = load_file(src / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".pooler." not in k}, src / "model.safetensors",
              metadata={"format": "pt"})


def _st_dir(d: Path, modules: list[dict[str, Any]], pooling: dict[str, Any] | None = None) -> Path:
    d.mkdir()
    (d / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (d / "1_Pooling").mkdir()
        (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return d


def test_sentence_transformers_declarations(tmp_path: Path) -> None:
    from converters.sentence_transformers import read_sentence_transformer

    tr = {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}
    po = {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    no = {"idx": 3, "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}
    dense = {"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    cls = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    info = read_sentence_transformer(_st_dir(tmp_path / "a", [tr, po, no], cls))
    assert info is not None and (info.pooling, info.normalize, info.max_seq_length) == ("cls", True, None)
    assert info.dense == () and info.prompts == {} and info.dimension is None
    assert read_sentence_transformer(tmp_path) is None  # no modules.json: not a sentence-transformers dir
    with pytest.raises(ConversionError, match="Dense.* before Pooling"):
        read_sentence_transformer(_st_dir(tmp_path / "b", [tr, {**dense, "idx": 0}, po], cls))
    with pytest.raises(ConversionError, match="after Normalize"):
        read_sentence_transformer(_st_dir(tmp_path / "c", [tr, po, {**no, "idx": 2}, {**dense, "idx": 3}], cls))
    with pytest.raises(ConversionError, match="pooling_mode_max_tokens"):
        read_sentence_transformer(_st_dir(tmp_path / "d", [tr, po], {"pooling_mode_max_tokens": True}))
    # a Dense module whose weights are only pickled is never loaded; a known one is read with its prompts
    d = _st_dir(tmp_path / "e", [tr, po, dense, no], cls)
    (d / "2_Dense").mkdir()
    (d / "2_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 4, "out_features": 2, "bias": True, "activation_function": "torch.nn.modules.activation.Tanh"}))
    (d / "2_Dense" / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ConversionError, match="never loaded"):
        read_sentence_transformer(d)
    from safetensors.numpy import save_file

    save_file({"linear.weight": np.ones((2, 4), np.float32), "linear.bias": np.zeros(2, np.float32)},
              str(d / "2_Dense" / "model.safetensors"))
    (d / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "q: ", "Clustering": "c: "}, "default_prompt_name": "query"}))
    info = read_sentence_transformer(d)
    assert info is not None and info.dimension == 2 and info.dense[0].activation == "tanh"
    assert info.input_prompts == {"query": "q: "} and info.default_prompt_name == "query"


def test_export_refuses_to_overwrite_non_package(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(ConversionError, match="not a package"):
        build_fixture("rerank", tmp_path / "out")
    assert (tmp_path / "out" / "keep.txt").exists()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "converters", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=full_env)


def test_cli_nonexistent_path_one_line_error(tmp_path: Path) -> None:
    proc = _cli("export", str(tmp_path / "no" / "such" / "dir"), "--out", str(tmp_path / "o"), "--kind", "embedding")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no such directory" in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_cli_offline_hub_id_one_line_error(tmp_path: Path) -> None:
    proc = _cli("export", "sentence-transformers/not-cached-model", "--out", str(tmp_path / "o"), "--kind",
                "embedding", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "HF_HUB_OFFLINE" in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_cli_fixture(tmp_path: Path) -> None:
    proc = _cli("fixture", "--kind", "sequence-classification", "--out", str(tmp_path / "p"), "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["digest"] == read_package(tmp_path / "p").digest
    assert "parity fp32: max |onnx - torch|" in proc.stderr  # progress and the parity figure go to stderr


# ---- the real MiniLM package -------------------------------------------------------------------

def _pool_mean_normalized(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float64)
    v = (hidden.astype(np.float64) * m).sum(1) / m.sum(1)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.minilm
def test_minilm_matches_sentence_transformers(minilm_package: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from converters.default import minilm_source

    texts = list(SAMPLE_TEXTS[:50])
    assert len(set(texts)) == 50
    reference = SentenceTransformer(str(minilm_source()), device="cpu").encode(texts, convert_to_numpy=True)

    pkg = read_package(minilm_package)
    tok = Tokenizer.from_file(str(pkg.file("tokenizer.json")))
    tok.enable_truncation(pkg.card.limits["max_input_tokens"])
    session = _session(pkg.graph("fp32"))
    got = []
    for text in texts:
        enc = tok.encode(text)
        feeds = {"input_ids": np.array([enc.ids]), "attention_mask": np.array([enc.attention_mask]),
                 "token_type_ids": np.array([enc.type_ids])}
        got.append(_pool_mean_normalized(session.run(["last_hidden_state"], feeds)[0], feeds["attention_mask"]))
    vectors = np.concatenate(got)
    ref = reference.astype(np.float64)
    cos = (vectors * ref).sum(1) / np.linalg.norm(ref, axis=1)
    print(f"MiniLM package vs sentence-transformers: cosine min {cos.min():.9f} mean {cos.mean():.9f}")
    assert cos.min() >= 0.99999


@pytest.mark.minilm
def test_minilm_card(minilm_package: Path) -> None:
    pkg = read_package(minilm_package)
    card = pkg.card
    assert card.name == "minilm-embedding" and card.kind == "embedding"
    assert card.head == {"pooling": "mean", "normalize": True, "dimension": 384, "dimensions": [384],
                         "layers": {"6": "last_hidden_state"}}
    assert card.limits["max_input_tokens"] == 256
    assert card.raw["source"]["license"] == "apache-2.0"
    assert "LICENSES/NOTICE.txt" in pkg.files
    tok = json.loads(pkg.file("tokenizer.json").read_text())
    assert tok["padding"] is None and tok["truncation"] is None  # the source bakes in Fixed 128 / 128
    agreement = card.variants["int8"].agreement
    print(f"MiniLM int8 agreement: {agreement}; fp32 max |diff| {card.raw['verification']['max_abs_diff']}")
    assert 0.95 <= agreement["min_cosine"] <= agreement["mean_cosine"] < 1.0
    assert card.raw["verification"]["max_abs_diff"] <= 1e-4


@pytest.mark.minilm
def test_default_is_idempotent(minilm_package: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import converters.default as default

    before = {p: p.stat().st_mtime_ns for p in minilm_package.rglob("*")}
    line = default.build_minilm(minilm_package.parent)
    assert "up to date" in line and "nothing to do" in line
    assert {p: p.stat().st_mtime_ns for p in minilm_package.rglob("*")} == before

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(default.importlib.util, "find_spec",
                        lambda name, *a: None if name == "converters.sparrow.export" else real_find_spec(name, *a))
    assert "skipped" in default.build_sparrow(minilm_package.parent)
