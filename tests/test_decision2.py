"""Decision 2.0: the candidate head and answers in numpy, the segmented prompt, the converted
fixtures (qwen-full and qwen-adapter) and the converter's refusals."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from converters.errors import ConversionError
from edge_runtime.families.decision2.candidate import HEAD_TENSORS, CandidateHead, answer
from edge_runtime.families.decision2.prompt import PromptTooLong, option_text, prefix_text, render
from edge_runtime.families.registry import read_package


def _head(h: int = 16, d: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"candidate_norm.weight": (h,), "candidate_norm.bias": (h,), "query_norm.weight": (h,),
              "query_norm.bias": (h,), "key.weight": (d, h), "query.weight": (d, h), "candidate_mlp.weight": (d, h),
              "candidate_mlp.bias": (d,), "query_mlp.weight": (d, h), "scalar.weight": (1, d)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def test_candidate_head_matches_torch_and_formula() -> None:
    torch = pytest.importorskip("torch")
    from converters.decision2.verify import torch_head_logits
    from edge_runtime.families.decision2.prompt import PromptRow

    arrays = _head()
    head = CandidateHead.from_arrays(arrays)
    hidden = np.random.default_rng(1).standard_normal((10, 16)).astype(np.float32)
    row = PromptRow(list(range(10)), [2, 5, 7], 9)
    got = head.logits(hidden[row.endpoints], hidden[row.query])
    want = torch_head_logits(arrays, torch.from_numpy(hidden), row)
    assert np.max(np.abs(got - want)) < 1e-5 and np.ptp(got) > 0.01

    def ln(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (x - x.mean()) / np.sqrt(x.var() + 1e-5) * w + b

    c = ln(hidden[5].astype(np.float64), arrays["candidate_norm.weight"], arrays["candidate_norm.bias"])
    q = ln(hidden[9].astype(np.float64), arrays["query_norm.weight"], arrays["query_norm.bias"])
    pre = arrays["candidate_mlp.weight"] @ c + arrays["candidate_mlp.bias"] + arrays["query_mlp.weight"] @ q
    gelu = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    bilinear = (arrays["key.weight"] @ c) @ (arrays["query.weight"] @ q) / math.sqrt(8)
    by_hand = bilinear + arrays["scalar.weight"][0] @ gelu
    assert abs(float(got[1]) - by_hand) < 1e-4
    with pytest.raises(ValueError, match="ten"):
        CandidateHead.from_arrays({k: v for k, v in arrays.items() if k != "scalar.weight"})
    assert len(HEAD_TENSORS) == 10


def test_answers() -> None:
    p = [math.exp(x / 2) for x in (1.0, 3.0, 0.0)]
    p = [x / sum(p) for x in p]
    a = answer("choice", ["code", "math", "other"], [1.0, 3.0, 0.0], 2.0)
    assert a["choice"] == "math" and a["probabilities"] == pytest.approx(dict(zip(["code", "math", "other"], p)))
    assert a["confidence"] == pytest.approx(1 + sum(x * math.log(x) for x in p) / math.log(3))
    assert answer("choice", ["a", "b"], [1.0, 1.0], 1.0)["choice"] == "a"  # exact tie: first
    assert answer("noul", ["false", "true"], [0.0, math.log(3)], 1.0) == {"type": "noul",
                                                                          "noul": pytest.approx(0.75)}
    # score bias is added to the raw logits before the temperature
    s = answer("score", ["0", "1", "2"], [0.0, 0.0, 0.0], 0.5, {3: [0.05, -0.02, 0.01]}, ["lo", {"x": 1}, "hi"])
    e = [math.exp(b / 0.5) for b in (0.05, -0.02, 0.01)]
    probs = [x / sum(e) for x in e]
    assert s["score"] == pytest.approx(probs[1] + 2 * probs[2]) and s["legend"] == {"0": "lo", "1": '{"x":1}',
                                                                                    "2": "hi"}
    assert answer("score", ["0", "1"], [0.0, 0.0], 1.0, {3: [1, 2, 3]})["score"] == pytest.approx(0.5)
    with pytest.raises(ValueError):
        answer("choice", ["a", "b"], [0.0, float("nan")], 1.0)
    with pytest.raises(ValueError):
        answer("choice", ["a", "b", "c"], [0.0, 1.0], 1.0)


def test_prompt_segments(fixture_package: Callable[..., Path]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(fixture_package("decision2-source") / "tokenizer.json"))
    assert prefix_text({"b": 1, "a": "x"}, "choice", "Which?") == 'Context:\n{"a":"x","b":1}\n\nTask type: choice\n' \
                                                                  "Question:\nWhich?\nOptions:"
    assert option_text("x", None) == '\n<option>\n{"description":null,"key":"x"}\n</option>'
    row = render(tok, "state", "noul", "Is it?", [("false", None), ("true", "yes, clearly")], 2048)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    segs = [enc(prefix_text("state", "noul", "Is it?")), enc(option_text("false", "No")),
            enc(option_text("true", "yes, clearly"))]
    suffix = enc("\n\nSelect the single option best supported by the context and instructions.\nDecision:")
    assert row.ids == segs[0] + segs[1] + segs[2] + suffix
    assert row.endpoints == [len(segs[0]) + len(segs[1]) - 1, len(segs[0]) + len(segs[1]) + len(segs[2]) - 1]
    assert row.query == len(row.ids) - 1
    with pytest.raises(PromptTooLong):
        render(tok, "state " * 500, "noul", "Is it?", [("false", None), ("true", None)], 64)


@pytest.mark.parametrize("kind", ["decision2", "decision2-lora"])
def test_converted_packages(fixture_package: Callable[..., Path], kind: str) -> None:
    pkg = read_package(fixture_package(kind))
    card = pkg.card.raw
    assert (card["family"], card["kind"], card["question_types"]) == ("decision2", "decision2",
                                                                       ["choice", "noul", "score"])
    ver = card["verification"]
    assert ver["max_abs_diff"] <= 1e-5 and ver["cases"] == 27
    cfg = pkg.decision_config()
    assert set(pkg.head_weights()) == HEAD_TENSORS and cfg["temperature_by_type"] == {"choice": 1.0, "noul": 1.0,
                                                                                     "score": 1.0}
    if kind == "decision2-lora":
        assert cfg["source"]["lora_merged"] and ver["outputs"]["lora_merge_hidden"] <= 1e-4
        assert cfg["score_bias"] is None
    else:
        assert cfg["score_bias"] == {"3": [0.05, -0.02, 0.01], "5": [0.04, 0.2, 0.08, -0.15, -0.17]}


def test_merged_adapter_is_not_the_base(fixture_package: Callable[..., Path]) -> None:
    """The LoRA really changed the exported weights: the two packages' goldens differ."""
    full = read_package(fixture_package("decision2")).golden("fp32")[0]
    lora = read_package(fixture_package("decision2-lora")).golden("fp32")[0]
    assert np.array_equal(full.feeds["input_ids"], lora.feeds["input_ids"])
    assert not np.allclose(full.outputs["last_hidden_state"], lora.outputs["last_hidden_state"], atol=1e-3)


def test_refusals(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    from converters.decision2.source import detect, read_decision2

    src = tmp_path / "pkg"
    shutil.copytree(fixture_package("decision2-source"), src)
    assert detect(src) == "decision2" and read_decision2(src).profile == "qwen-full"
    (src / "extra.txt").write_text("not listed")
    with pytest.raises(ConversionError, match="extra"):
        read_decision2(src)
    (src / "extra.txt").unlink()
    cfg = json.loads((src / "decision_config.json").read_text())
    (src / "decision_config.json").write_text(json.dumps({**cfg, "head_dim": 16}))
    with pytest.raises(ConversionError, match="changed"):
        read_decision2(src)

    lora_src = fixture_package("decision2-lora-source")
    moved = tmp_path / "adapter"
    shutil.copytree(lora_src, moved)
    with pytest.raises(ConversionError, match="pinned base"):
        read_decision2(moved)  # no adapter-base beside it
    base = tmp_path / "adapter-base"
    shutil.copytree(lora_src.parent / f"{lora_src.name}-base", base)
    assert read_decision2(moved).profile == "qwen-adapter"
    with (base / "config.json").open("a") as f:
        f.write("\n")
    with pytest.raises(ConversionError, match="fingerprint"):
        read_decision2(moved)


def test_qwen3_5_is_refused(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    from converters.decision2.source import read_decision2

    src = tmp_path / "pkg"
    shutil.copytree(fixture_package("decision2-source"), src)
    cfg = json.loads((src / "decision_config.json").read_text())
    cfg["architecture"] = "qwen3.5-text-endpoints-global-query-shared-bilinear-mlp"
    (src / "decision_config.json").write_text(json.dumps(cfg))
    from converters.decision2.source import checkpoint_files, sha256_json
    from edge_runtime.packages.manifest import file_sha256

    def reseal() -> None:
        manifest = json.loads((src / "MODEL_MANIFEST.json").read_text())
        for rel in ("decision_config.json", "backbone/config.json"):
            manifest["files_sha256"][rel] = file_sha256(src / rel)
        manifest["identity"]["model_sha256"] = sha256_json(checkpoint_files(src))
        (src / "MODEL_MANIFEST.json").write_text(json.dumps(manifest))

    reseal()
    with pytest.raises(ConversionError, match="does not match the architecture"):
        read_decision2(src)  # the backbone config still says qwen3
    backbone = json.loads((src / "backbone" / "config.json").read_text())
    (src / "backbone" / "config.json").write_text(json.dumps({**backbone, "model_type": "qwen3_5"}))
    reseal()
    with pytest.raises(ConversionError, match="Qwen3.5 text model"):
        read_decision2(src)


def test_pipeline_golden_questions_against_torch(fixture_package: Callable[..., Path]) -> None:
    """The server-side pipeline on the Decision 2.0 golden questions: answers equal the torch
    reference's (Qwen3Model + torch head from the source), alone or batched bit-identical."""
    import torch

    from converters import verify
    from converters.decision2.export import _load_weights, build_model
    from converters.decision2.source import read_decision2
    from converters.decision2.verify import GOLDEN_STATE, torch_head_logits
    from converters.vela2.verify import onnx_hidden
    from edge_runtime.families.decision2.pipeline import Decision2Assets, question_options, run_questions

    pkg = read_package(fixture_package("decision2"))
    assets = Decision2Assets.from_package(pkg)
    run = onnx_hidden(verify.create_session(pkg.graph("fp32")))
    questions = {
        "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
                   "criteria": {"code": "Programming", "math": "Mathematics", "other": "Anything else"}},
        "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
        "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                       "criteria": ["Trivial", "Moderate", "Hard"]},
        "long": {"type": "noul", "instructions": "x " * 3000},
    }
    body = run_questions(GOLDEN_STATE, questions, assets, run)
    assert body["answers"]["long"]["error"] == "max_length_exceeded"
    assert set(body["answers"]["domain"]) == {"type", "choice", "probabilities", "confidence"}
    assert set(body["answers"]["difficulty"]) == {"type", "score", "probabilities", "confidence", "legend"}
    src = read_decision2(fixture_package("decision2-source"))
    model = build_model(src.backbone_config, _load_weights(sorted((src.root / "backbone").glob("*.safetensors"))))
    from safetensors.numpy import load_file

    head = load_file(str(src.root / "decision_head.safetensors"))
    for qid in ("domain", "reasoning", "difficulty"):
        kind, opts = question_options(questions[qid])
        from edge_runtime.families.decision2.prompt import render

        row = render(assets.tokenizer, GOLDEN_STATE, kind, questions[qid]["instructions"], opts, 2048)
        with torch.no_grad():
            h = model(input_ids=torch.tensor([row.ids])).last_hidden_state[0]
        ref = answer(kind, [k for k, _ in opts], torch_head_logits(head, h, row).tolist(), 1.0,
                     src.score_bias, [d for _, d in opts])
        got = body["answers"][qid]
        assert got.get("choice") == ref.get("choice")
        for key in ("noul", "score", "confidence"):
            if key in ref:
                assert abs(got[key] - ref[key]) < 1e-5
        for k, p in ref.get("probabilities", {}).items():
            assert abs(got["probabilities"][k] - p) < 1e-5
    alone = run_questions(GOLDEN_STATE, {"domain": questions["domain"]}, assets, run)
    assert alone["answers"]["domain"] == body["answers"]["domain"]


def test_cli_detects_a_lora_package(fixture_package: Callable[..., Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from converters.__main__ import main

    src = fixture_package("decision2-lora-source")
    assert main(["export", str(src), "--out", str(tmp_path / "pkg"), "--license", "Apache-2.0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["max_abs_diff"] <= 1e-5
    assert read_package(tmp_path / "pkg").decision_config()["source"]["profile"] == "qwen-adapter"
    assert main(["export", str(src), "--out", str(tmp_path / "p2"), "--base", str(tmp_path / "nowhere")]) == 2
    assert main(["fixture", "--kind", "decision2-lora-source", "--out", str(tmp_path / "f")]) == 0
    assert json.loads(capsys.readouterr().out)["base"] == str(tmp_path / "f-base")
