"""The decision2 family over HTTP: the converted Decision 2.0 fixtures (qwen-full, and qwen-adapter with
its LoRA merged) served by the real server on 127.0.0.1, answers checked bit for bit against the
pipeline's ``run_questions`` run in process through the same ONNX graph, every body against the
contract (openapi.yaml)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.api.schema import validate_response
from edge_runtime.engine import create_session
from edge_runtime.families.decision2.pipeline import Decision2Assets, run_questions
from edge_runtime.families.registry import read_package
from tests.support.server_harness import Server, write_models_file

STATE = "Write a Python function that merges two sorted lists and explain its running time."
QUESTIONS: dict[str, Any] = {
    "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
               "criteria": {"code": "Programming", "math": "Mathematics", "other": "Anything else"}},
    "tone": {"type": "choice", "instructions": {"task": "tone"},
             "choices": [{"key": "formal"}, {"key": "casual", "description": {"register": ["chat", "slang"]}}]},
    "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
    "polite": {"type": "noul", "instructions": "Is the request polite?", "criteria": {"true": "yes, clearly"}},
    "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                   "criteria": ["Trivial", "Moderate", "Hard"]},
    "effort": {"type": "score", "levels": ["none", "little", "some", "much", "all"]},
}
MODELS = {"d2": "decision2", "d2-lora": "decision2-lora"}


@pytest.fixture(scope="module")
def server(fixture_package: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server over both converted fixtures, one thread each (as the in-process reference)."""
    models = [{"name": name, "package": str(fixture_package(kind)), "device": "cpu", "threads": 1}
              for name, kind in MODELS.items()]
    srv = Server(write_models_file(tmp_path_factory.mktemp("decision2-server") / "models.yaml", models))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference(fixture_package: Callable[..., Path]) -> Callable[[str, Any, dict[str, Any]], dict[str, Any]]:
    """``reference(model, state, questions)``: run_questions in process through the package's graph."""
    cache: dict[str, tuple[Decision2Assets, Any]] = {}

    def run(model: str, state: Any, questions: dict[str, Any]) -> dict[str, Any]:
        if model not in cache:
            pkg = read_package(fixture_package(MODELS[model]))
            cache[model] = (Decision2Assets.from_package(pkg), create_session(pkg.graph("fp32"), "cpu", threads=1))
        assets, session = cache[model]

        def hidden(feeds: dict[str, np.ndarray]) -> np.ndarray:
            names = session.input_names
            return session.run({n: feeds[n] for n in names}, ["last_hidden_state"])["last_hidden_state"]

        return run_questions(state, questions, assets, hidden)

    return run


def _decide(server: Server, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    r = server.client.post("/v1/decisions", json=body)
    assert r.status_code == status, r.text
    validate_response("/v1/decisions", "post", status, r.json())
    return dict(r.json())


@pytest.mark.parametrize("model", list(MODELS))
def test_answers_equal_the_pipeline_bit_for_bit(server: Server, reference: Any, model: str) -> None:
    """Choice (both forms), noul and score (with and without the package's score bias) answers equal
    run_questions' exactly: the same rows, padding, head and §1.8 answers, over HTTP."""
    got = _decide(server, {"model": model, "state": STATE, "questions": QUESTIONS})
    want = reference(model, STATE, QUESTIONS)
    assert got["model"] == model
    assert got["answers"] == want["answers"] and got["usage"] == want["usage"]
    assert set(got["answers"]["domain"]) == {"type", "choice", "probabilities", "confidence"}
    assert set(got["answers"]["effort"]) == {"type", "score", "probabilities", "confidence", "legend"}
    assert 0.0 <= got["answers"]["reasoning"]["noul"] <= 1.0
    structured = {"order": {"id": 1182, "items": ["a", None]}, "user": "Où est ma commande ?"}
    assert _decide(server, {"model": model, "state": structured, "questions": QUESTIONS})["answers"] == \
        reference(model, structured, QUESTIONS)["answers"]


def test_the_merged_adapter_answers_differently(server: Server) -> None:
    body = {"state": STATE, "questions": QUESTIONS}
    full = _decide(server, {"model": "d2", **body})["answers"]
    lora = _decide(server, {"model": "d2-lora", **body})["answers"]
    assert full["domain"]["probabilities"] != lora["domain"]["probabilities"]


def test_a_batch_answers_each_state_as_alone(server: Server) -> None:
    states = {"a": {"state": STATE, "questions": QUESTIONS},
              "b": {"state": {"user": "hi"}, "questions": {"reasoning": QUESTIONS["reasoning"]}},
              "c": {"state": "x", "questions": {"effort": QUESTIONS["effort"], "domain": QUESTIONS["domain"]}}}
    got = _decide(server, {"model": "d2", "states": states})
    total = 0
    for name, entry in states.items():
        alone = _decide(server, {"model": "d2", **entry})
        assert got["states"][name]["answers"] == alone["answers"] and got["states"][name]["usage"] == alone["usage"]
        total += alone["usage"]["input_tokens"]
    assert got["usage"] == {"input_tokens": total, "output_tokens": 0}


def test_unanswered_types_and_long_questions_fail_in_place(server: Server, reference: Any) -> None:
    questions = {"s": {"type": "set", "labels": [{"key": "l"}]},
                 "p": {"type": "span", "labels": [{"key": "name"}]},
                 "long": {"type": "noul", "instructions": "x " * 3000},
                 "reasoning": QUESTIONS["reasoning"]}
    got = _decide(server, {"model": "d2", "state": STATE, "questions": questions})["answers"]
    for qid in ("s", "p"):
        assert got[qid]["error"] == "invalid_question" and got[qid]["reason"] == "question_type_unsupported"
    assert got["long"]["error"] == "max_length_exceeded" and got["long"]["reason"] == "question_tokens"
    assert got["reasoning"] == reference("d2", STATE, {"reasoning": QUESTIONS["reasoning"]})["answers"]["reasoning"]
    # options.max_tokens lowers the limit per question; above the model's limit it is refused
    short = _decide(server, {"model": "d2", "state": STATE, "questions": {"r": QUESTIONS["reasoning"]},
                             "options": {"max_tokens": 16}})
    assert short["answers"]["r"]["error"] == "max_length_exceeded" and short["usage"]["input_tokens"] == 0
    refused = _decide(server, {"model": "d2", "state": STATE, "questions": {"r": QUESTIONS["reasoning"]},
                               "options": {"max_tokens": 4096}}, 400)
    assert refused["error"]["code"] == "invalid_request"
    none = _decide(server, {"model": "d2", "state": STATE, "questions": {"s": questions["s"]}}, 400)
    assert none["error"]["reason"] == "question_type_unsupported"


def test_models_lists_the_decision2_models(server: Server) -> None:
    r = server.client.get("/v1/models")
    assert r.status_code == 200
    validate_response("/v1/models", "get", 200, r.json())
    listed = {m["id"]: m for m in r.json()["data"]}
    for name in MODELS:
        entry = listed[name]
        assert (entry["status"], entry["family"], entry["kind"]) == ("ready", "decision2", "decision2")
        assert entry["question_types"] == ["choice", "noul", "score"]
        assert entry["limits"]["max_input_tokens"] == 2048
        assert entry["self_check"]["status"] == "passed" and entry["engine_args"]["grouping"] == "padded"
        assert entry["numerics"] == "exact"
    assert {m["name"] for m in r.json()["models"]} >= set(MODELS)


def test_systemone_answers_as_decisions_does(server: Server) -> None:
    body = {"model": "d2", "state": STATE, "questions": {k: QUESTIONS[k] for k in ("domain", "reasoning")}}
    r = server.client.post("/v1/systemone", json=body)
    assert r.status_code == 200, r.text
    validate_response("/v1/systemone", "post", 200, r.json())
    assert r.json()["answers"] == _decide(server, body)["answers"]


@pytest.mark.parametrize("unit", ["the quick brown fox jumps ", "!?", "a", "\u4e2d\u6587"])
def test_a_long_state_is_too_long_at_the_cost_of_the_limit(unit: str, fixture_package: Any) -> None:
    """A 2 MiB state is refused in place after tokenizing about max_input_tokens of it, and a state
    that fits reads the same ids as the whole-text tokenization."""
    from dataclasses import replace

    from edge_runtime.families.decision2.family import Decision2Family
    from edge_runtime.requests.decisions import parse_decisions_request

    family = Decision2Family(read_package(fixture_package("decision2")))
    family.warm()
    noul = {"r": {"type": "noul", "instructions": "Is it?"}}
    plan = family.plan("decisions", parse_decisions_request({"state": unit * (2 << 20), "questions": noul}))
    assert not plan.rows
    assert plan.finish([])["answers"]["r"]["reason"] == "question_tokens"
    short = unit * 20
    bounded = family.assets.render(short, "noul", "Is it?", [("false", None), ("true", None)])
    whole = replace(family.assets, reader=None).render(short, "noul", "Is it?", [("false", None), ("true", None)])
    assert bounded == whole
