"""The question-type registry: one module per type, and the refusals a card's question_types drive."""

from __future__ import annotations

import pytest

from edge_runtime.questions import (
    QUESTION_TYPES,
    REGISTRY,
    InvalidQuestion,
    Question,
    answer,
    check_clashes,
    parse_question,
    refusal,
)


def test_the_contract_types_are_registered_in_order() -> None:
    assert QUESTION_TYPES == ("choice", "noul", "score", "set", "span", "box", "track")
    for name, kind in REGISTRY.items():
        assert kind.name == name and "type" in kind.fields


@pytest.mark.parametrize(("qtype", "reason"), [
    ("box", "box_unsupported"), ("track", "track_unsupported"),
    ("set", "question_type_unsupported"), ("span", "question_type_unsupported"),
])
def test_refusal_reason_is_the_types(qtype: str, reason: str) -> None:
    raw = {"type": qtype, "instructions": "Find the cat."}
    if qtype in ("set", "span"):
        raw["labels"] = [{"key": "cat"}]
    q = parse_question("q", raw)
    assert isinstance(q, Question)
    refused = refusal(q, "m", ("choice", "noul", "score"))
    assert isinstance(refused, InvalidQuestion) and refused.reason == reason
    assert refusal(q, "m", (qtype,)) is None


def test_a_set_label_may_not_shadow_another_question() -> None:
    s = parse_question("topic", {"type": "set", "labels": [{"key": "a"}, {"key": "b"}]})
    other = parse_question("topic.b", {"type": "noul", "instructions": "Is it b?"})
    checked = check_clashes([s, other])
    assert isinstance(checked[0], InvalidQuestion) and "topic.b" in checked[0].message
    assert checked[1] == other


def test_two_sets_may_not_write_one_answer_key() -> None:
    p = parse_question("p", {"type": "set", "labels": [{"key": "q.r"}, {"key": "s"}]})
    pq = parse_question("p.q", {"type": "set", "labels": [{"key": "r"}]})
    fine = parse_question("t", {"type": "set", "labels": [{"key": "r"}]})
    checked = check_clashes([p, pq, fine])
    assert all(isinstance(c, InvalidQuestion) and "p.q.r" in c.message for c in checked[:2])
    assert checked[2] == fine


@pytest.mark.parametrize("raw", [
    {"type": ["choice"]}, {"type": {"choice": 1}}, {"type": None}, "choice", 7, None, [],
    {"type": "choice", "criteria": {"a": "x", "b": "y"}, "colour": "red"},
])
def test_malformed_questions_fail_in_place_whatever_their_shape(raw: object) -> None:
    q = parse_question("q", raw)
    assert isinstance(q, InvalidQuestion) and q.reason == "question_malformed"


def test_vector_answers_and_invalid_outputs() -> None:
    q = parse_question("q", {"type": "choice", "choices": [{"key": "a"}, {"key": "b"}]})
    assert isinstance(q, Question)
    assert answer(q, [0.25, 0.75])["choice"] == "b"
    failed = answer(q, [float("nan"), 1.0])
    assert failed["error"] == "invalid_model_output"
    span = parse_question("s", {"type": "span", "labels": [{"key": "name"}]})
    assert isinstance(span, Question)
    with pytest.raises(ValueError):
        answer(span, [0.5, 0.5])  # a span is not read from one vector over options
