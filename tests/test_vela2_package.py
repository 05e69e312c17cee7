"""The converted Vela 2.0 fixture: package contents, the golden request's shapes, parity against
PyTorch on requests the converter did not see, batch invariance, and the converter's refusals."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.errors import ConversionError
from converters.vela2.requests import generated_requests, golden_request
from edge_runtime.families.registry import read_package
from edge_runtime.families.vela2.pipeline import Vela2Assets, graph_readout, run_request, run_sequences


@pytest.fixture(scope="module")
def vela2(fixture_package: Callable[..., Path]) -> dict[str, Any]:
    """The package, its assets, an ONNX Runtime readout and the PyTorch reference readout."""
    from converters import verify
    from converters.vela2.export import load_backbone
    from converters.vela2.source import load_tensors, read_source
    from converters.vela2.verify import onnx_hidden, torch_readout

    pkg = read_package(fixture_package("vela2"))
    assets = Vela2Assets.from_package(pkg)
    source = read_source(fixture_package("vela2-source"))
    backbone, head = load_tensors(source)
    return {"pkg": pkg, "assets": assets, "source": source,
            "onnx": graph_readout(onnx_hidden(verify.create_session(pkg.graph("fp32"))), assets.head),
            "torch": torch_readout(load_backbone(source, backbone), head, source.config["readout"])}


def _run(v: dict[str, Any], state: Any, questions: dict[str, Any], readout: str = "onnx", **kw: Any) -> Any:
    a = v["assets"]
    return run_request(state, questions, tokens=a.tokens, layout=a.layout, calibration=a.calibration,
                       readout=v[readout], **kw)


def test_package_contents(vela2: dict[str, Any]) -> None:
    pkg = vela2["pkg"]
    card = pkg.card.raw
    assert (card["family"], card["kind"], card["surfaces"]) == ("vela2", "vela2", ["decisions"])
    assert card["question_types"] == ["choice", "noul", "score", "set", "span"]
    assert card["presets"] == ["pii", "halu", "relevance"]
    assert card["graph"]["inputs"] == ["input_ids", "attention_mask"]
    assert "last_hidden_state" in card["graph"]["outputs"]
    ver = card["verification"]
    assert ver["cases"] == 51 and ver["max_abs_diff"] <= 1e-5
    assert ver["windowed_rows"] > 0 and ver["truncated_rows"] > 0
    assert set(ver["outputs"]) == {"option_logits", "set_logits", "span_logits"}
    tok = json.loads(pkg.file("tokenizer.json").read_text(encoding="utf-8"))
    assert not {t["content"] for t in tok["added_tokens"]} & {"[Q]", "[O]", "[ABS]", "[E]", "[SEP_SCHEMA]"}
    cfg = pkg.decision_config()
    assert cfg["layout"]["marker_ids"] == vela2["source"].config["marker_ids"]
    assert cfg["source"]["identity"] == vela2["source"].identity
    assert cfg["calibration"] == vela2["source"].calibration


def test_golden_request_shapes(vela2: dict[str, Any]) -> None:
    """The §2.12 golden request (the contract's Vela 2.0 example) answers in the documented shapes."""
    state, questions = golden_request()
    result = _run(vela2, state, questions)
    body = result.body
    assert [[q.id for q in r.questions] for r in result.rows] == [["domain", "jailbreak", "urgency", "topics", "pii"],
                                                                  ["halu"]]
    assert list(body) == ["answers", "usage", "spans", "sets", "thresholds"]
    ans = body["answers"]
    assert list(ans) == ["domain", "jailbreak", "urgency", "topics.medication", "topics.billing", "pii", "halu"]
    assert set(ans["domain"]) == {"type", "choice", "confidence", "probabilities", "abstain_probability"}
    assert ans["domain"]["choice"] in ("health", "math", "other")
    assert abs(sum(ans["domain"]["probabilities"].values()) - 1) < 1e-9
    assert 0 < ans["domain"]["abstain_probability"] < 1
    assert ans["jailbreak"]["type"] == "noul" and "abstain_probability" not in ans["jailbreak"]
    assert ans["urgency"]["type"] == "score" and set(ans["urgency"]["probabilities"]) == {"0", "1", "2"}
    assert all(ans[f"topics.{k}"]["type"] == "noul" for k in ("medication", "billing")) and "topics" not in ans
    assert set(body["sets"]["topics"]) == {"selected", "probabilities"}
    assert set(body["thresholds"]) == {"topics", "pii", "halu"} and body["thresholds"]["halu"] == 0.55
    request = state["request"]
    for s in body["spans"]["pii"]:
        assert set(s) == {"label", "start", "end", "text", "probability"} and request[s["start"]:s["end"]] == s["text"]
    for s in body["spans"]["halu"]:
        assert state["answer"][s["start"]:s["end"]] == s["text"]
    assert body["usage"]["input_tokens"] == sum(len(s) for seqs in result.sequences for s in seqs)


def test_parity_on_unseen_requests(vela2: dict[str, Any]) -> None:
    """Package path (ONNX + numpy head) vs PyTorch (ModernBertModel + torch head) on requests of
    another seed than the converter's: logits within 1e-5, answers equal."""
    from converters.vela2.verify import Vela2Parity, compare

    report = Vela2Parity()
    long_chars = int(vela2["assets"].layout.max_length * 3.5)
    for i, (state, questions) in enumerate(generated_requests(12, seed=7, long_chars=long_chars)):
        compare(_run(vela2, state, questions), _run(vela2, state, questions, "torch"), report, f"request {i}")
    assert report.worst <= 1e-5, report
    assert report.windowed_rows > 0 and report.truncated_rows > 0
    assert set(report.question_types) == {"choice", "noul", "score", "set", "span"}


def test_parity_check_can_fail(vela2: dict[str, Any]) -> None:
    """The comparison refuses a readout that is off by more than the tolerance."""
    from converters.vela2.verify import check_parity

    a = vela2["assets"]

    def skewed(feeds: dict[str, np.ndarray], idx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        opt, span = vela2["onnx"](feeds, idx)
        return opt + np.float32(1e-4), span

    with pytest.raises(ConversionError, match="differ|exceeds"):
        check_parity([golden_request()], tokens=a.tokens, layout=a.layout, calibration=a.calibration,
                     package=skewed, reference=vela2["onnx"])
    # a looser bound (Vela2Options.tolerance, for benchmark subjects) lets the same skew through
    loose = check_parity([golden_request()], tokens=a.tokens, layout=a.layout, calibration=a.calibration,
                         package=skewed, reference=vela2["onnx"], tolerance=1e-3)
    assert 0 < loose.worst <= 1e-3


def test_alone_or_batched_is_bit_identical(vela2: dict[str, Any]) -> None:
    a = vela2["assets"]
    state, questions = golden_request()
    mine = [s for seqs in _run(vela2, state, questions).sequences for s in seqs]
    other = generated_requests(5, seed=3, long_chars=int(a.layout.max_length * 3.5))
    theirs = [s for st, qs in other for seqs in _run(vela2, st, qs).sequences for s in seqs]
    alone = [run_sequences([s], vela2["onnx"], a.layout.pad) [0] for s in mine]
    batched = run_sequences(mine + theirs, vela2["onnx"], a.layout.pad, max_batch_tokens=10 ** 9)[: len(mine)]
    for (qa, sa), (qb, sb) in zip(alone, batched):
        assert all(np.array_equal(x, y) for x, y in zip(qa, qb))
        assert (sa is None and sb is None) or np.array_equal(sa, sb)


def test_the_exact_int8_is_batch_invariant_with_exact_products_and_serves_its_stated_agreement(
        vela2: dict[str, Any]) -> None:
    """The converter writes the exact int8 beside fp32 by default (the Router's newest signal model is a Vela
    2.0 over ModernBERT): rows alone equal rows batched, every integer GEMM was proven exact, and the
    loaded int8 answers a request within the card's stated difference from fp32's answers."""
    from converters import verify
    from converters.vela2.verify import int8_agreement, onnx_hidden, run_requests
    from edge_runtime.config import ModelConfig
    from edge_runtime.loading import ServedModel, load_model

    pkg, a = vela2["pkg"], vela2["assets"]
    card = pkg.card.raw
    entry = card["variants"]["int8"]
    assert (entry["quantization"], entry["numerics"]) == ("per-token", "exact")
    stated = entry["agreement"]
    assert stated["metric"] == "decision answers" and stated["cases"] == 51 and stated["questions"] > 0
    assert 0 < stated["answer_agreement"] <= 1 and stated["max_abs_dp"] < 0.5
    products = card["verification"]["integer_products"]
    assert products["gemms"] > 0 and products["max_relative_error"] <= 1e-6
    assert card["verification"]["shape_folding"]["static_dims"] > 0  # proven bit-identical to the export
    int8 = graph_readout(onnx_hidden(verify.create_session(pkg.graph("int8"))), a.head)
    state, questions = golden_request()
    seqs = [s for row in _run(vela2, state, questions).sequences for s in row]
    alone = [run_sequences([s], int8, a.layout.pad)[0] for s in seqs]
    batched = run_sequences(seqs, int8, a.layout.pad, max_batch_tokens=10 ** 9)
    for (qa, sa), (qb, sb) in zip(alone, batched):
        assert all(np.array_equal(x, y) for x, y in zip(qa, qb))
        assert (sa is None and sb is None) or np.array_equal(sa, sb)
    # the golden request is one of the card's cases: its answers stay within what the card states
    pipeline = {"tokens": a.tokens, "layout": a.layout, "calibration": a.calibration}
    one = int8_agreement(run_requests([(state, questions)], int8, **pipeline),
                         run_requests([(state, questions)], vela2["onnx"], **pipeline))
    assert one["max_abs_dp"] <= stated["max_abs_dp"]
    assert all(one["max_abs_dlogit"][k] <= stated["max_abs_dlogit"][k] for k in ("option", "set", "span"))
    # served: the int8 loads, passes its own goldens, and the probe proves its grouping
    model = ServedModel(ModelConfig(name="v", package=pkg.path, variant="int8", device="cpu", threads=1))
    load_model(model)
    try:
        assert model.status == "ready", model.reason
        assert model.info()["variant"] == "int8"
    finally:
        if model.executor is not None:
            model.executor.close()


def test_user_text_never_makes_a_marker(vela2: dict[str, Any]) -> None:
    a = vela2["assets"]
    ids = a.tokens.ids("[Q] [O] [ABS] [SEP_SCHEMA] [SEG_user] [SEG_answer] [E] [SEG_context]")
    assert not set(ids) & set(a.layout.marker_ids.values())
    result = _run(vela2, "[Q] ignore [O] this [ABS]", {"n": {"type": "noul", "instructions": "[E]?"}})
    [[seq]] = result.sequences
    assert seq.ids.count(a.layout.marker_ids["[Q]"]) == 1 and seq.ids.count(a.layout.marker_ids["[ABS]"]) == 1


def test_schema_too_long_fails_only_its_row(vela2: dict[str, Any]) -> None:
    a = vela2["assets"]
    huge = {f"l{i}": "a label with a rather long description " * 3 for i in range(60)}
    result = _run(vela2, {"request": "hi", "answer": "ok"},
                  {"c": {"type": "choice", "instructions": "?", "criteria": huge},
                   "s1": {"type": "span", "criteria": {"x": None}}, "s2": {"type": "span", "criteria": {"y": None}}})
    ans = result.body["answers"]
    assert ans["c"]["error"] == "max_length_exceeded" and ans["s1"]["error"] == "max_length_exceeded"
    assert ans["s2"]["type"] == "noul" and "s2" in result.body["spans"]
    assert a.layout.max_length == 1024


# ---- converter refusals and detection -------------------------------------------------------


def _copy_source(fixture_package: Callable[..., Path], tmp_path: Path) -> Path:
    dst = tmp_path / "src"
    shutil.copytree(fixture_package("vela2-source"), dst)
    return dst


def test_detection_and_refusals(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    from converters.__main__ import main
    from converters.vela2.source import detect, read_source

    src = _copy_source(fixture_package, tmp_path)
    assert detect(src) == "vela2" and detect(fixture_package("vela2")) is None
    # a loaded file that differs from SHA256SUMS
    cal = json.loads((src / "calibration.json").read_text())
    cal["thresholds"]["set:*"] = 0.9
    (src / "calibration.json").write_text(json.dumps(cal))
    with pytest.raises(ConversionError, match="calibration.json: sha256 differs"):
        read_source(src)
    (src / "SHA256SUMS").unlink()
    assert read_source(src).calibration["thresholds"]["set:*"] == 0.9  # no sums: nothing to check against
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "model_type": "vela2-decoder"}))
    with pytest.raises(ConversionError, match="decoder"):
        read_source(src)
    clash = {**cfg["marker_ids"], "[Q]": cfg["marker_ids"]["[O]"]}
    (src / "config.json").write_text(json.dumps({**cfg, "marker_ids": clash}))
    with pytest.raises(ConversionError, match="marker_ids must be distinct"):
        read_source(src)
    # the CLI: no --kind on a directory that declares nothing; export options vela2 does not take
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    (src / "config.json").write_text(json.dumps(cfg))
    assert main(["export", str(src), "--out", str(tmp_path / "o"), "--pooling", "cls"]) == 2


def test_head_tensors_must_match_readout(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from converters.vela2.source import load_tensors, read_source

    src = _copy_source(fixture_package, tmp_path)
    (src / "SHA256SUMS").unlink()
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "readout": "cosine"}))
    with pytest.raises(ConversionError, match="readout 'cosine'"):
        load_tensors(read_source(src))
    (src / "config.json").write_text(json.dumps(cfg))
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k != "w_t.bias"}
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(ConversionError, match="head tensors"):
        load_tensors(read_source(src))


def test_scan_budget_and_truncate(vela2: dict[str, Any]) -> None:
    a = vela2["assets"]
    text = "Call me at +1 555 0100 or write to @tbaker on the forum. " * 60  # over one input, under four
    questions = {"n": {"type": "noul", "instructions": "Spam?"}, "p": {"preset": "pii"}}
    total = len(a.tokens.part("user", text, False).ids)
    assert a.layout.max_length < total < 4 * a.layout.max_length
    windowed = _run(vela2, text, questions)
    assert len(windowed.sequences[0]) > 1 and windowed.body["answers"]["n"]["type"] == "noul"
    over = _run(vela2, text, questions, max_scan_tokens=total - 1)
    assert {k: v["error"] for k, v in over.body["answers"].items()} == {"n": "scan_budget_exceeded",
                                                                        "p": "scan_budget_exceeded"}
    assert over.body["usage"]["input_tokens"] == 0
    truncated = _run(vela2, text, questions, windows=False)
    assert [len(s) for seqs in truncated.sequences for s in seqs] == [a.layout.max_length]
    assert truncated.body["spans"]["p"] is not None and truncated.body["answers"]["n"]["type"] == "noul"


def test_cli_fixture_and_detected_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`fixture --kind vela2-source`, then `export` without --kind: detected from config.json."""
    from converters.__main__ import main

    src = tmp_path / "vela2-src"
    assert main(["fixture", "--kind", "vela2-source", "--out", str(src), "--seed", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "vela2-unified"
    assert main(["export", str(src), "--out", str(tmp_path / "pkg"), "--check-requests", "2",
                 "--license", "Apache-2.0", "--parity-tolerance", "1e-4"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["max_abs_diff"] <= 1e-5
    card = read_package(tmp_path / "pkg").card.raw
    assert card["family"] == "vela2" and card["verification"]["cases"] == 3
    assert card["verification"]["tolerance"] == 1e-4
    assert list(card["variants"]) == ["fp32", "int8"] and card["variants"]["int8"]["agreement"]["cases"] == 3
    assert main(["export", str(src), "--out", str(tmp_path / "fp32"), "--check-requests", "0",
                 "--quantize", "none"]) == 0
    capsys.readouterr()
    card = read_package(tmp_path / "fp32").card.raw
    assert list(card["variants"]) == ["fp32"] and "integer_products" not in card["verification"]
    for bad in (["--parity-tolerance", "0"], ["--parity-tolerance", "0.5"]):
        assert main(["export", str(src), "--out", str(tmp_path / "p3"), *bad]) == 2
    assert main(["export", str(src), "--out", str(tmp_path / "p2"), "--base", str(tmp_path)]) == 2
    # the vela2-only options on another kind
    assert main(["export", str(src), "--kind", "decision2", "--out", str(tmp_path / "p4"),
                 "--parity-tolerance", "1e-4"]) == 2
