"""decision-codes Set questions: one Noul row per label, with ``sets`` and ``thresholds``.

Over HTTP on the decision-codes fixture (causal, plain layout) and a state-once header-v1 build of
it: each label's Noul is bit-identical to the same label asked as a plain Noul, ``selected`` holds
the labels at or above the threshold, a label ID that clashes fails in place, Span stays refused,
a card that does not list set refuses it, and /v1/systemone (vllm-sr/5.0 and 4.0) renders sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.decision_codes.fixture import build_decision_codes_fixture
from edge_runtime.api.schema import validate_response
from edge_runtime.engine import create_session
from edge_runtime.engine.causal import BranchRow, causal_row
from edge_runtime.errors import ItemError
from edge_runtime.families.decision_codes.family import DecisionCodesFamily, label_instructions, label_nouls
from edge_runtime.families.registry import read_package
from edge_runtime.questions import answer
from edge_runtime.questions.sets import DEFAULT_THRESHOLD
from edge_runtime.requests.decisions import parse_decisions_request
from edge_runtime.requests.systemone import SCHEMA_4
from tests.support.server_harness import Server, write_models_file

STATE = "My card was charged twice and the parcel never arrived. Write to me at jane.doe@example.com."
PROBLEMS = {
    "type": "set",
    "instructions": "Which problems does the customer report?",
    "labels": [
        {"key": "billing", "description": "A payment or charge problem"},
        {"key": "shipping", "description": "A delivery problem"},
        {"key": "account", "description": "A login or account problem"},
        {"key": "other"},
    ],
}
LABELS = [label["key"] for label in PROBLEMS["labels"]]


def plain_nouls(set_question: dict[str, Any], qid: str) -> dict[str, Any]:
    """Each label of a Set asked as a plain Noul question, under the ID its answer takes."""
    q = parse_decisions_request({"state": "s", "questions": {qid: set_question}}).single.valid[0]
    return {f"{qid}.{o.key}": {"type": "noul", "instructions": label_instructions(q, o)} for o in q.options}


@pytest.fixture(scope="module")
def packages(fixture_package, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The causal fixture, and a state-once build of it that lists the questions (header-v1)."""
    once = build_decision_codes_fixture(tmp_path_factory.mktemp("codes-set") / "once", seed=0,
                                        attention_mode="prefix_causal", prompt_layout="header-v1")
    return {"codes": fixture_package("decision-codes"), "codes-once": once}


def _family(path: Path) -> DecisionCodesFamily:
    package = read_package(path)
    return DecisionCodesFamily(package, create_session(package.graph("fp32"), "cpu", 1))


def _start(packages: dict[str, Path], root: Path, *extra: str) -> Server:
    models = write_models_file(root / "models.yaml", [
        {"name": name, "package": str(path), "device": "cpu", "threads": 1} for name, path in packages.items()])
    server = Server(models, *extra)
    try:
        server.wait()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def server(packages, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = _start(packages, tmp_path_factory.mktemp("codes-set-server"))
    yield srv
    srv.stop()


def decide(server: Server, body: dict[str, Any], path: str = "/v1/decisions") -> dict[str, Any]:
    """A 200 answer, checked against the contract."""
    r = server.client.post(path, json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    validate_response(path, "post", 200, got)
    return got


def test_labels_are_the_plain_nouls_and_selected_follows_the_threshold(server) -> None:
    """Causal rows: every label's Noul is bit-identical to the label asked as a plain Noul."""
    plain = decide(server, {"model": "codes", "state": STATE, "questions": plain_nouls(PROBLEMS, "problems")})
    probabilities = {key.split(".", 1)[1]: a["noul"] for key, a in plain["answers"].items()}
    assert len(set(probabilities.values())) == len(LABELS)  # distinct, so the threshold below splits them

    got = decide(server, {"model": "codes", "state": STATE, "questions": {"problems": PROBLEMS}})
    assert got["answers"] == plain["answers"]  # the same keys, in label order, and the same floats
    assert got["usage"] == plain["usage"]  # each label is one row, counted as the Noul's
    assert got["sets"] == {"problems": {"selected": [k for k in LABELS if probabilities[k] >= DEFAULT_THRESHOLD],
                                        "probabilities": probabilities}}
    assert got["thresholds"] == {"problems": DEFAULT_THRESHOLD}

    # "at or above": the threshold equal to a label's own probability selects that label
    middle = sorted(probabilities.values())[len(LABELS) // 2]
    got = decide(server, {"model": "codes", "state": STATE,
                          "questions": {"problems": {**PROBLEMS, "threshold": middle}}})
    assert got["sets"]["problems"]["selected"] == [k for k in LABELS if probabilities[k] >= middle]
    assert len(got["sets"]["problems"]["selected"]) == len(LABELS) - len(LABELS) // 2
    assert got["thresholds"] == {"problems": middle} and got["answers"] == plain["answers"]


def test_state_once_header_v1_labels_branch_from_the_state(server, packages) -> None:
    """State-once with header-v1: each label is a branch of the state's row, and equals the plain Noul
    built the same way in-process (the same header, the label's row run alone)."""
    once = _family(packages["codes-once"])
    body = {"state": STATE, "questions": {
        "domain": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "logistics": None}},
        "problems": PROBLEMS,
        "urgent": {"type": "noul", "instructions": "Is it urgent?"}}}
    got = decide(server, {"model": "codes-once", **body})
    assert list(got["answers"]) == ["domain", *(f"problems.{k}" for k in LABELS), "urgent"]

    plan = once.plan_request(parse_decisions_request(body))
    (row,) = plan.rows
    assert isinstance(row, BranchRow) and len(row.branches) == 2 + len(LABELS)
    entry = parse_decisions_request(body).single
    prompt = once.prompt
    state_text = prompt.state_text(entry.state, entry.valid)
    assert ("2. Which problems does the customer report?\n   - billing: A payment or charge problem\n"
            "   - shipping: A delivery problem\n   - account: A login or account problem\n   - other\n3. Is it urgent?"
            in state_text)
    state_ids = prompt.state_ids(entry.state, entry.valid, once.max_input_tokens)
    assert state_ids is not None and row.prefix.tolist() == state_ids
    assert got["usage"]["input_tokens"] == len(row.prefix) + sum(len(b) for b in row.branches)
    for noul in label_nouls(entry.valid[1]):
        plain = parse_decisions_request({"state": "s", "questions": {noul.id: {
            "type": "noul", "instructions": noul.instructions}}}).single.valid[0]
        ids = prompt.question_ids(plain, 2, once.max_input_tokens)  # titled with the Set's number
        assert ids is not None and prompt.question_text(plain, 2).startswith("Question 2:\n")
        alone = once.forward([causal_row([*state_ids, *ids])])[0]
        want = answer(plain, once.probabilities(alone, 2, plan.entries[0].temperature))
        assert got["answers"][noul.id] == want
        key = noul.id.split(".", 1)[1]
        assert got["sets"]["problems"]["probabilities"][key] == want["noul"]
    assert got["thresholds"] == {"problems": DEFAULT_THRESHOLD}


def test_clash_span_and_too_long_fail_in_place(server) -> None:
    got = decide(server, {"model": "codes", "state": STATE, "questions": {
        "t": {"type": "set", "labels": [{"key": "a"}, {"key": "b"}]},
        "t.a": {"type": "noul", "instructions": "Is it urgent?"},
        "contacts": {"type": "span", "instructions": "Find the contact details.", "labels": [{"key": "EMAIL"}]},
        "fits": {"type": "set", "labels": [{"key": "x"}], "threshold": 0.0},
        "long": {"type": "set", "labels": [{"key": "short"}, {"key": "long", "description": "word " * 2000}]}}})
    a = got["answers"]
    assert (a["t"]["error"], a["t"]["reason"]) == ("invalid_question", "question_malformed")
    assert "t.a" in a["t"]["message"]
    assert a["t.a"]["type"] == "noul"
    assert (a["contacts"]["type"], a["contacts"]["reason"]) == ("span", "question_type_unsupported")
    assert (a["long"]["type"], a["long"]["error"], a["long"]["reason"]) == ("set", "max_length_exceeded",
                                                                           "question_tokens")
    assert not any(k.startswith("long.") for k in a)  # a Set too long has no label answers at all
    assert got["sets"] == {"fits": {"selected": ["x"], "probabilities": {"x": a["fits.x"]["noul"]}}}
    assert got["thresholds"] == {"fits": 0.0}


def test_a_card_without_set_refuses_it(packages) -> None:
    package = read_package(packages["codes"])
    raw = {**package.card.raw, "question_types": ["choice", "noul", "score"]}
    older = dataclasses.replace(package, card=dataclasses.replace(package.card, raw=raw))
    family = DecisionCodesFamily(older)
    plan = family.plan_request(parse_decisions_request({"state": STATE, "questions": {
        "problems": PROBLEMS, "urgent": {"type": "noul", "instructions": "Is it urgent?"}}}))
    assert len(plan.rows) == 1
    refused = plan.entries[0].slots[0].question
    assert (refused.type, refused.reason) == ("set", "question_type_unsupported")
    assert "choice, noul, score" in refused.message


def test_systemone_renders_sets_in_both_schemas(server, packages, tmp_path) -> None:
    body = {"model": "codes", "state": STATE, "questions": {"problems": {**PROBLEMS, "threshold": 0.01}}}
    want = decide(server, body)
    assert want["sets"]["problems"]["selected"]  # the fixture's labels clear a 0.01 threshold
    got = decide(server, body, "/v1/systemone")  # this server speaks vllm-sr/5.0, the default
    assert _answered(got) == _answered(want)
    old = _start({"codes": packages["codes"]}, tmp_path, "--systemone-schema", SCHEMA_4)
    try:
        got = decide(old, body, "/v1/systemone")
    finally:
        old.stop()
    assert _answered(got) == _answered(want)


def _answered(body: dict[str, Any]) -> dict[str, Any]:
    """What a Set's answer carries, whichever endpoint rendered it."""
    return {k: body[k] for k in ("answers", "sets", "thresholds")}


def test_a_deadline_or_an_unusable_label_fails_the_whole_set_in_place(packages) -> None:
    family = _family(packages["codes"])
    plan = family.plan_request(parse_decisions_request({"state": STATE, "questions": {
        "problems": PROBLEMS, "urgent": {"type": "noul", "instructions": "Is it urgent?"}}}))
    assert len(plan.rows) == len(LABELS) + 1
    late = family.finish(plan, ItemError("deadline_exceeded", "options.deadline_ms passed"))
    assert (late["answers"]["problems"]["type"], late["answers"]["problems"]["error"]) == ("set", "deadline_exceeded")
    assert "sets" not in late and "thresholds" not in late
    outputs = family.forward(plan.rows)
    label_row = plan.entries[0].slots[0].labels[2].row
    outputs[label_row] = np.full_like(outputs[label_row], np.nan)  # one label's output unusable
    body = family.finish(plan, outputs)
    failed = body["answers"]["problems"]
    assert (failed["type"], failed["error"]) == ("set", "invalid_model_output")
    assert not any(k.startswith("problems.") for k in body["answers"]) and "sets" not in body
    assert body["answers"]["urgent"]["type"] == "noul"
