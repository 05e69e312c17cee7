"""decision3: upstream fixtures converted as a user would (parity with Transformers 5 recorded in the card),
the family in process (rows, state-once, refusals) and over HTTP against the contract."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.decision3.convert import IMAGE_HIDDEN_TOLERANCE, PROBABILITY_TOLERANCE, build_fixture
from converters.decision3.vision import GOLDEN_QUESTIONS, GOLDEN_STATE, data_url, golden_image
from edge_runtime.api.schema import validate_response
from edge_runtime.engine import create_session
from edge_runtime.engine.causal import BranchRow, CausalRow, causal_row
from edge_runtime.families.decision3.family import Decision3Family
from edge_runtime.families.registry import read_package
from edge_runtime.questions import Question, answer, parse_question
from edge_runtime.requests.decisions import parse_decisions_request
from tests.support.d3_models import NO_REFERENCE, QUESTIONS, reference_environment
from tests.support.server_harness import ROOT, Server, write_models_file

STATE = "Write a Python function that merges two sorted lists and explain its running time."


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A causal text package (state-once) and a noncausal pruned one (irregular layers), converted; the
    noncausal one checked against Transformers 5 when the reference environment exists."""
    root = tmp_path_factory.mktemp("d3pkg")
    causal = build_fixture(root / "causal", variant="text", attention_mode="causal", seed=1)
    noncausal = build_fixture(root / "noncausal", variant="pruned", attention_mode="noncausal_full_attention",
                              seed=2, reference=reference_environment() is not None)
    return {"causal": causal.path, "noncausal": noncausal.path}


def _family(path: Path) -> Decision3Family:
    package = read_package(path)
    return Decision3Family(package, create_session(package.graph("fp32"), "cpu", 1))


def _whole_row_answers(family: Decision3Family, state: Any, questions: dict[str, Any]) -> dict[str, Any]:
    """Each question's answer from its whole prompt run alone (batch 1): the reference for the server."""
    out = {}
    for qid, raw in questions.items():
        q = parse_question(qid, raw)
        assert isinstance(q, Question)
        tokens = family.prompt.tokens(state, q, family.max_input_tokens)
        hidden = family.forward([causal_row(tokens.ids)])[0]  # type: ignore[union-attr]
        out[qid] = answer(q, family.probabilities(hidden, len(q.options)))
    return out


def test_conversion_matches_transformers_5(packages: dict[str, Path]) -> None:
    if reference_environment() is None:
        pytest.skip(NO_REFERENCE)
    card = read_package(packages["noncausal"]).card.raw
    v = card["verification"]
    assert v["transformers"] is True and v["max_abs_diff"] <= PROBABILITY_TOLERANCE == v["tolerance"]
    assert v["outputs"]["last_hidden_state"] < 1e-4 and v["cases"] >= 12
    assert 0.5 <= v["bf16"]["argmax_agreement"] <= 1.0 and v["bf16"]["cases"] == v["cases"]
    assert card["attention_mode"] == "noncausal_full_attention" and card["usage"] == "per_question"
    assert "attend to the question" in card["state_once"]
    assert card["graph"]["layer_types"] == ["linear_attention", "linear_attention", "full_attention",
                                            "linear_attention", "full_attention"]
    # the pruned fixture has a vision tower: its image path against Qwen3_5Model given the same pixels
    assert card["upstream"]["vision_tower"].startswith("converted") and card["graph"]["vision"]["file"] == "vision.onnx"
    images = v["images"]
    assert images["max_abs_diff_probabilities"] <= PROBABILITY_TOLERANCE == images["tolerance"]
    assert images["max_abs_diff_last_hidden_state"] <= IMAGE_HIDDEN_TOLERANCE == images["hidden_tolerance"]
    # three image questions and a video's (its timestamped pairs given as pixel_values_videos and video_grid_thw)
    assert images["cases"] == 4 and images["video_cases"] == 1
    assert images["grids"] == [[1, 14, 20], [1, 14, 22], [1, 34, 8]]
    assert images["max_abs_diff_processor_pixels"] <= 1e-6  # our processor vs Qwen2VLImageProcessorPil


def test_causal_card_and_files(packages: dict[str, Path]) -> None:
    package = read_package(packages["causal"])
    card = package.card.raw
    assert (card["family"], card["kind"], card["surfaces"]) == ("decision3", "decision3", ["decisions"])
    assert card["verification"]["transformers"] is False and "not verified" in card["verification"]["reference"]
    assert card["verification"]["outputs"]["state_once_vs_whole"] <= PROBABILITY_TOLERANCE
    assert card["usage"] == "state_once" and card["limits"]["max_input_tokens"] == 4096
    config = package.decision_config()
    assert config is not None and config["temperature"] == 0.75 and len(config["codes"]) == 255
    assert package.head_weights()["readout"].shape == (255, 64)
    assert np.load(package.file("embeddings.npy")).dtype == np.float32


def test_rows_state_once_and_refusals(packages: dict[str, Path]) -> None:
    family = _family(packages["causal"])
    request = parse_decisions_request({"model": "m", "state": STATE, "questions": {
        **QUESTIONS, "long": {"type": "noul", "instructions": "x " * 5000},
        "set": {"type": "set", "labels": [{"key": "a"}]},
        "dup": {"type": "score", "criteria": ["same", "same"]}}})
    plan = family.plan_request(request)
    assert len(plan.rows) == 1 and isinstance(plan.rows[0], BranchRow)
    row = plan.rows[0]
    assert len(row.branches) == 4 and len(row.prefix) > 40
    assert plan.input_tokens == len(row.prefix) + sum(len(b) for b in row.branches)
    body = family.finish(plan, family.forward(plan.rows))
    got = body["answers"]
    assert got["long"]["error"] == "max_length_exceeded"
    assert got["set"]["reason"] == "question_type_unsupported" and got["dup"]["error"] == "invalid_question"
    alone = _whole_row_answers(family, STATE, QUESTIONS)
    for qid in QUESTIONS:
        for key in ("probabilities", "noul"):
            if key in alone[qid]:
                a, b = alone[qid][key], got[qid][key]
                if isinstance(a, dict):
                    assert max(abs(a[k] - b[k]) for k in a) < 1e-5
                else:
                    assert abs(a - b) < 1e-5
    # noncausal: every question runs its whole prompt, batched bit-identically to running alone
    family = _family(packages["noncausal"])
    plan = family.plan_request(parse_decisions_request({"model": "m", "state": STATE, "questions": QUESTIONS}))
    assert len(plan.rows) == 4 and all(isinstance(r, CausalRow) for r in plan.rows)
    assert family.finish(plan, family.forward(plan.rows))["answers"] == _whole_row_answers(family, STATE, QUESTIONS)


@pytest.fixture(scope="module")
def server(packages: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = [{"name": f"d3-{k}", "package": str(p), "device": "cpu", "threads": 1} for k, p in packages.items()]
    srv = Server(write_models_file(tmp_path_factory.mktemp("decision3-server") / "models.yaml", models))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _decide(server: Server, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = server.client.post("/v1/decisions", json=body)
    assert r.status_code == status, r.text
    validate_response("/v1/decisions", "post", status, r.json())
    return dict(r.json())


def test_server_answers_over_http(server: Server, packages: dict[str, Path]) -> None:
    noncausal = _family(packages["noncausal"])
    got = _decide(server, {"model": "d3-noncausal", "state": STATE, "questions": QUESTIONS})
    assert got["answers"] == _whole_row_answers(noncausal, STATE, QUESTIONS)
    assert set(got["answers"]["domain"]) == {"type", "choice", "probabilities", "confidence"}
    once = _decide(server, {"model": "d3-causal", "state": STATE, "questions": QUESTIONS})
    assert once["answers"].keys() == QUESTIONS.keys() and once["usage"]["input_tokens"] > 0
    # a batch answers each state as alone; the text package refuses images
    states = {"a": {"state": STATE, "questions": QUESTIONS}, "b": {"state": {"user": "hi"},
                                                                    "questions": {"r": QUESTIONS["reasoning"]}}}
    batch = _decide(server, {"model": "d3-noncausal", "states": states})
    for name, entry in states.items():
        assert batch["states"][name]["answers"] == _decide(server, {"model": "d3-noncausal", **entry})["answers"]
    refused = _decide(server, {"model": "d3-causal", "state": STATE, "questions": QUESTIONS,
                               "images": ["data:image/png;base64,iVBORw0KGgo="]}, 400)
    assert (refused["error"]["code"], refused["error"]["reason"]) == ("invalid_request", "image_unsupported")
    # the pruned package has a vision tower: noncausal image rows run whole, batched across the request's
    # questions and the batch's states, each answered exactly as alone
    image = {"state": GOLDEN_STATE, "images": [data_url(golden_image())], "questions": GOLDEN_QUESTIONS}
    alone = {qid: _decide(server, {"model": "d3-noncausal", **image, "questions": {qid: q}})["answers"][qid]
             for qid, q in GOLDEN_QUESTIONS.items()}
    assert _decide(server, {"model": "d3-noncausal", **image})["answers"] == alone
    mixed = _decide(server, {"model": "d3-noncausal", "states": {"i": image, **states}})
    assert mixed["states"]["i"]["answers"] == alone
    models = {m["id"]: m for m in server.client.get("/v1/models").json()["data"]}
    assert models["d3-causal"]["family"] == "decision3" and models["d3-causal"]["status"] == "ready"


def test_cli_fixture_and_detection(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "converters"]
    done = subprocess.run([*run, "fixture", "--kind", "decision3-source", "--variant", "text", "--out",
                           str(tmp_path / "src")], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["format"] == "d3-package-manifest/1"
    exported = subprocess.run([*run, "export", str(tmp_path / "src"), "--out", str(tmp_path / "out"),
                               "--no-reference"], cwd=ROOT, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr  # the kind is detected from decision_config.json
    assert read_package(tmp_path / "out").card.raw["family"] == "decision3"
    refused = subprocess.run([*run, "fixture", "--kind", "decision2-source", "--no-reference", "--out",
                              str(tmp_path / "d2")], cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode == 2 and "apply to kind decision3 only" in refused.stderr
