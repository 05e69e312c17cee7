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


def test_repeated_questions_are_parsed_once_and_owned_by_the_cache() -> None:
    raw = {"type": "choice", "instructions": {"ask": ["Which team?"]}, "criteria": {"a": None, "b": "bugs"}}
    first = parse_question("q", raw)
    assert parse_question("q", dict(raw)) is first  # equal JSON: the cached parse
    raw["instructions"]["ask"].append("mutated after parsing")  # the request's own objects
    assert isinstance(first, Question) and first.instructions == {"ask": ["Which team?"]}
    again = parse_question("q", raw)
    assert again is not first and isinstance(again, Question) and again.instructions == raw["instructions"]
    assert parse_question("other id", {"type": "choice", "criteria": {"a": None, "b": None}}).id == "other id"
    reordered = parse_question("q", {"type": "choice", "criteria": {"b": "bugs", "a": None},
                                     "instructions": {"ask": ["Which team?"]}})
    assert isinstance(reordered, Question) and [o.key for o in reordered.options] == ["b", "a"]


def test_questions_that_are_not_plain_json_are_parsed_and_refused_uncached() -> None:
    q = parse_question("q", {"type": "noul", "instructions": "broken \ud800"})
    assert isinstance(q, InvalidQuestion) and "surrogate" in q.message
    long = parse_question("q", {"type": "noul", "instructions": "x " * 4096})
    assert isinstance(long, Question) and parse_question("q", {"type": "noul", "instructions": "x " * 4096}) is not long


def test_overflow_is_reject_or_truncate_and_only_truncating_families_take_truncate() -> None:
    from edge_runtime.questions import parse_question, refusal

    base = {"type": "noul", "instructions": "Is it a complaint?"}
    assert parse_question("q", {**base, "overflow": "reject"}) == parse_question("q", base)
    cut = parse_question("q", {**base, "overflow": "truncate"})
    assert isinstance(cut, Question) and cut.overflow == "truncate"
    bad = parse_question("q", {**base, "overflow": "window"})
    assert isinstance(bad, InvalidQuestion) and bad.reason == "question_malformed" and "overflow" in bad.message
    assert refusal(cut, "m", ("noul",), truncates=True) is None
    refused = refusal(cut, "m", ("noul",))
    assert refused is not None and refused.reason == "question_malformed" and "overflow truncate" in refused.message
    box = parse_question("b", {"type": "box", "instructions": "the cat", "overflow": "truncate"})
    assert isinstance(box, InvalidQuestion)  # box and track read media, never a cut state
