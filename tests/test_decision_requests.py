"""The decisions internal form: the contract's examples validate, and each malformed case fails as it should."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from edge_runtime.api.statuses import status_of
from edge_runtime.errors import ApiError
from edge_runtime.questions import DecisionOption, InvalidQuestion, Question
from edge_runtime.requests.decisions import NoValidQuestion, parse_decisions_request
from tests.support.contract_examples import (
    BUNDLE_EXAMPLE,
    DECISIONS_EXAMPLE_1,
    DECISIONS_EXAMPLE_2,
    DECISIONS_EXAMPLE_BATCH,
    SYSTEMONE_EXAMPLE_ASSETS,
    SYSTEMONE_EXAMPLE_MEDIA,
)

# The contract's examples are in tests/contract_examples.py. BUNDLE_TASK is the decisions task
# of its Bundle example, a minimal valid request that the malformed cases below build on.
BUNDLE_TASK = BUNDLE_EXAMPLE["tasks"][1]["decisions"]


def test_general_example() -> None:
    req = parse_decisions_request(DECISIONS_EXAMPLE_1)
    assert req.model == "Vela-2.0-0.3B" and not req.is_batch
    domain, reasoning, difficulty = req.single.questions
    assert domain == Question("domain", "choice", "Which domain does this request belong to?", (
        DecisionOption("code", "Programming"), DecisionOption("math", "Mathematics"), DecisionOption("other", None)))
    assert reasoning.options == (DecisionOption("false", None), DecisionOption("true", None))
    assert [o.key for o in difficulty.options] == ["0", "1", "2"]
    assert [o.description for o in difficulty.options] == ["Trivial", "Moderate", "Hard"]


def test_set_and_span_example() -> None:
    problems, contacts = parse_decisions_request(DECISIONS_EXAMPLE_2).single.questions
    assert problems.type == "set" and [o.key for o in problems.options] == ["billing", "shipping", "account"]
    assert problems.threshold is None
    assert contacts.type == "span" and contacts.options == (DecisionOption("EMAIL_ADDRESS", "An email address"),)


def test_batch_example() -> None:
    req = parse_decisions_request(DECISIONS_EXAMPLE_BATCH)
    assert req.is_batch and req.single is None
    assert [name for name, _ in req.entries()] == ["doc_1", "doc_2"]
    assert all(e.valid[0].id == "relevance" for _, e in req.entries())


def test_bundle_media_and_assets_examples() -> None:
    assert parse_decisions_request(BUNDLE_TASK).single.valid[0].type == "noul"
    media = parse_decisions_request(SYSTEMONE_EXAMPLE_MEDIA).single
    assert (media.images == (SYSTEMONE_EXAMPLE_MEDIA["images"][0],)
            and media.videos == (SYSTEMONE_EXAMPLE_MEDIA["videos"][0],))
    assets = parse_decisions_request(SYSTEMONE_EXAMPLE_ASSETS)
    assert set(assets.assets) == {"<receipt>"} and assets.single.roles_given is False


def test_options_and_roles() -> None:
    req = parse_decisions_request({**BUNDLE_TASK, "options": {
        "return_meta": True, "deadline_ms": 80, "max_tokens": 64, "long_context": True}})
    assert (req.options.return_meta, req.options.deadline_ms, req.options.max_tokens, req.options.long_context) == (
        True, 80.0, 64, True)
    state = {"question": "Is it late?", "doc": "Shipped Monday."}
    with_roles = parse_decisions_request({"state": state, "roles": {"question": "user", "doc": "context"},
                                          "questions": BUNDLE_TASK["questions"]}).single
    assert with_roles.roles == {"question": "user", "doc": "context"} and with_roles.roles_given
    no_roles = parse_decisions_request({"state": state, "roles": None, "questions": BUNDLE_TASK["questions"]}).single
    assert no_roles.roles is None and no_roles.roles_given


def test_requests_are_frozen() -> None:
    req = parse_decisions_request(DECISIONS_EXAMPLE_1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.model = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.single.questions[0].type = "noul"  # type: ignore[misc]


# ---- valid forms -------------------------------------------------------------------------


def _one(question: Any, state: Any = "a state") -> Question | InvalidQuestion:
    """Parse one question next to a valid one (so the request itself stays valid)."""
    req = parse_decisions_request({"state": state, "questions": {
        "q": question, "ok": {"type": "noul", "instructions": "fine?"}}})
    return req.single.questions[0]


@pytest.mark.parametrize("question", [
    {"type": "choice", "criteria": {"a": None, "b": "bee"}},                     # null description, no instructions
    {"type": "choice", "instructions": {"question": "Which?", "fields": ["x"]},
     "criteria": {"a": ["x"], "b": {"y": 1}}},
    {"type": "choice", "instructions": ["Which", "one?"], "choices": [{"key": "a"}, {"key": "b", "description": None}]},
    {"type": "choice", "criteria": {str(i): f"option {i}" for i in range(255)}},
    {"type": "score", "levels": [f"level {i}" for i in range(10)]},
    {"type": "score", "criteria": ["low", {"level": "high"}]},
    {"type": "noul", "instructions": "Bare?"},
    {"type": "noul", "criteria": {"true": "the user is upset"}},                   # criteria describe an outcome
    {"type": "noul", "instructions": "x", "criteria": None},
    {"type": "noul", "instructions": "x", "choices": [{"key": "true", "description": "yes"}, {"key": "false"}]},
    {"type": "choice", "instructions": "x", "preset": "domain", "criteria": {"a": None, "b": None}},
    {"type": "set", "criteria": {"only": None}, "threshold": 0.3},
    {"type": "span", "labels": [{"key": "EMAIL"}], "threshold": 1},
    {"type": "box", "instructions": "the red car", "at": 4.5},
    {"type": "track", "instructions": "the red car", "rate": 2},
])
def test_valid_questions(question: dict[str, Any]) -> None:
    q = _one(question)
    assert isinstance(q, Question), q


def test_noul_options_are_false_then_true() -> None:
    q = _one({"type": "noul", "instructions": "x", "criteria": {"true": "yes", "false": "no"}})
    assert q.options == (DecisionOption("false", "no"), DecisionOption("true", "yes"))
    q = _one({"type": "noul", "instructions": "x", "choices": [{"key": "true", "description": "yes"}]})
    assert q.options == (DecisionOption("false", None), DecisionOption("true", "yes"))


def test_box_and_track_defaults() -> None:
    assert _one({"type": "track", "instructions": "the dog"}).rate == 1
    assert _one({"type": "box", "instructions": "the dog"}).at is None


# ---- invalid questions, answered in place ------------------------------------------------


@pytest.mark.parametrize("question, field", [
    ({"type": "choice", "criteria": {"only": "one"}}, "criteria"),
    ({"type": "choice", "choices": [{"key": "only"}]}, "choices"),
    ({"type": "choice", "criteria": {str(i): None for i in range(256)}}, "criteria"),
    ({"type": "choice", "choices": [{"key": "a"}, {"key": "a"}]}, "duplicate"),
    ({"type": "choice", "choices": [{"key": "a"}, {"key": " "}]}, "choices[1].key"),
    ({"type": "choice", "criteria": {"a": None, "": None}}, "criteria"),
    ({"type": "choice", "criteria": {"a": "", "b": None}}, "criteria['a']"),
    ({"type": "choice", "choices": [{"key": "a", "description": "  "}, {"key": "b"}]}, "choices[0].description"),
    ({"type": "choice", "criteria": {"a": None, "b": None}, "choices": [{"key": "a"}, {"key": "b"}]}, "not both"),
    ({"type": "choice", "choices": [{"key": "a", "label": "x"}, {"key": "b"}]}, "['label']"),
    ({"type": "choice", "instructions": "x"}, "criteria or choices"),
    ({"type": "score", "levels": [f"l{i}" for i in range(11)]}, "levels"),
    ({"type": "score", "criteria": ["only"]}, "criteria"),
    ({"type": "score", "levels": ["low", None, "high"]}, "levels[1]"),
    ({"type": "score", "criteria": {"0": "low", "1": "high"}}, "criteria"),
    ({"type": "score", "criteria": ["a", "b"], "levels": ["a", "b"]}, "not both"),
    ({"type": "noul", "instructions": "x", "criteria": {"maybe": "perhaps"}}, "['maybe']"),
    ({"type": "noul", "instructions": "x", "choices": [{"key": "yes"}]}, "['yes']"),
    ({"type": "noul", "instructions": "x", "colour": "red"}, "noul questions do not take ['colour']"),
    ({"type": "noul"}, "instructions"),
    ({"type": "noul", "criteria": {"true": None}}, "instructions"),
    ({"type": "noul", "instructions": "   "}, "instructions is blank"),
    ({"type": "noul", "instructions": {}}, "instructions is empty"),
    ({"type": "noul", "instructions": 7}, "instructions"),
    ({"instructions": "no type"}, "type must be one of"),
    ({"type": "ranking", "instructions": "x"}, "type must be one of"),
    ("a string, not a question", "object"),
    ({"type": "set", "criteria": {"a": None}, "threshold": 1.5}, "threshold"),
    ({"type": "set", "labels": []}, "labels"),
    ({"type": "span", "criteria": {"a": None}, "threshold": True}, "threshold"),
    ({"type": "box"}, "instructions"),
    ({"type": "box", "instructions": "x", "at": -1}, "at"),
    ({"type": "box", "instructions": "x", "criteria": {"a": None}}, "box questions do not take ['criteria']"),
    ({"type": "track", "instructions": "x", "rate": 3}, "rate"),
    ({"type": "choice", "instructions": "x", "preset": "", "criteria": {"a": None, "b": None}}, "preset"),
])
def test_invalid_questions(question: Any, field: str) -> None:
    q = _one(question)
    assert isinstance(q, InvalidQuestion), q
    assert q.reason == "question_malformed" and field in q.message, q.message
    answer = q.answer()
    assert answer == {"type": question.get("type") if isinstance(question, dict) else None,
                      "error": "invalid_question", "reason": "question_malformed", "message": q.message}


def test_set_label_shadowing_another_question_is_invalid() -> None:
    req = parse_decisions_request({"state": "s", "questions": {
        "p": {"type": "set", "labels": [{"key": "billing"}, {"key": "x"}]},
        "p.billing": {"type": "noul", "instructions": "Billing?"}}})
    p, other = req.single.questions
    assert isinstance(p, InvalidQuestion) and "['p.billing']" in p.message
    assert isinstance(other, Question)


def test_unpaired_surrogates() -> None:
    q = _one({"type": "choice", "criteria": {"\ud800": None, "b": None}})
    assert isinstance(q, InvalidQuestion) and "surrogate" in q.message
    with pytest.raises(ApiError) as e:
        parse_decisions_request({"state": "bad \udc00", "questions": BUNDLE_TASK["questions"]})
    assert status_of(e.value) == 400
    with pytest.raises(ApiError):
        parse_decisions_request({"state": "s", "questions": {"\ud800": {"type": "noul", "instructions": "x"}}})


# ---- request-level errors ----------------------------------------------------------------


def _fails(body: Any, *words: str) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse_decisions_request(body)
    assert (status_of(e.value), e.value.code) == (400, "invalid_request")
    for w in words:
        assert w in e.value.message, e.value.message
    return e.value


def test_request_level_errors() -> None:
    q = BUNDLE_TASK["questions"]
    _fails({"state": "s", "questions": {"": {"type": "noul", "instructions": "x"}}}, "question IDs")
    _fails({"state": "s", "questions": {"  ": {"type": "noul", "instructions": "x"}}}, "question IDs")
    _fails({**DECISIONS_EXAMPLE_BATCH, "state": "s"}, "['state']")
    _fails({**DECISIONS_EXAMPLE_BATCH, "questions": q}, "['questions']")
    _fails({"state": "s", "questions": q, "colour": "red"}, "['colour']")
    _fails({"state": "s", "questions": q, "options": {"overflow": "truncate"}}, "['overflow']")
    _fails({"state": "s", "questions": q, "options": {"deadline_ms": 0}}, "deadline_ms")
    _fails({"state": "s", "questions": q, "options": {"long_context": "yes"}}, "long_context")
    _fails({"state": "s", "questions": {}}, "questions")
    _fails({"state": "s"}, "questions")
    _fails({"questions": q}, "state")
    _fails({"state": None, "questions": q}, "state")
    _fails({"state": 42, "questions": q}, "state")
    _fails({"state": "s", "roles": {"a": "user"}, "questions": q}, "roles")
    _fails({"state": {"a": "x"}, "roles": {"b": "user"}, "questions": q}, "'b'")
    _fails({"state": {"a": "x"}, "roles": {"a": "boss"}, "questions": q}, "roles.a")
    _fails({"state": "s", "images": "data:...", "questions": q}, "images")
    _fails({"states": {}}, "states")
    _fails({"states": {" ": {"state": "s", "questions": q}}}, "states names")
    _fails({"states": {"a": {"state": "s", "questions": q, "options": {}}}}, "['options']")
    _fails({"model": "", "state": "s", "questions": q}, "model")
    _fails(["not", "an", "object"])


def test_no_valid_question_is_400_with_every_reason() -> None:
    e = _fails({"state": "s", "questions": {
        "bad": {"type": "noul", "instructions": "x", "colour": "red"},
        "worse": {"instructions": "no type"}}})
    assert isinstance(e, NoValidQuestion)
    assert "bad (question_malformed): noul questions do not take ['colour']" in e.message
    assert "worse (question_malformed): type must be one of" in e.message
    assert e.reason == "question_malformed"
    assert e.body()["error"] == {"code": "invalid_request", "message": e.message,
                                 "reason": "question_malformed", "question": "bad"}


def test_batch_needs_one_valid_question_somewhere() -> None:
    bad = {"q": {"type": "choice", "criteria": {"one": None}}}
    e = _fails({"states": {"a": {"state": "s", "questions": bad}, "b": {"state": "t", "questions": bad}}},
               "a.q (question_malformed)", "b.q")
    assert e.body()["error"]["state"] == "a"
    req = parse_decisions_request({"states": {"a": {"state": "s", "questions": bad},
                                              "b": {"state": "t", "questions": BUNDLE_TASK["questions"]}}})
    (_, a), (_, b) = req.entries()
    assert not a.valid and isinstance(a.questions[0], InvalidQuestion) and len(b.valid) == 1


def test_question_count_limit_is_413() -> None:
    questions = {f"q{i}": {"type": "noul", "instructions": "x"} for i in range(5)}
    assert len(parse_decisions_request({"state": "s", "questions": questions}, 5).single.questions) == 5
    with pytest.raises(ApiError) as e:
        parse_decisions_request({"state": "s", "questions": questions}, 4)
    assert (status_of(e.value), e.value.code, e.value.limit) == (413, "request_too_large", 4)
    with pytest.raises(ApiError) as e:
        parse_decisions_request({"states": {"a": {"state": "s", "questions": questions},
                                            "b": {"state": "t", "questions": questions}}}, 9)
    assert status_of(e.value) == 413


def test_a_set_counts_one_answer_per_label_against_the_limit() -> None:
    labels = {"t": {"type": "set", "labels": [{"key": f"l{i}"} for i in range(4)]}}
    assert parse_decisions_request({"state": "s", "questions": labels}, 4).single is not None
    with pytest.raises(ApiError) as e:
        parse_decisions_request({"state": "s", "questions": {**labels, "n": {"type": "noul", "instructions": "x"}}}, 4)
    assert (status_of(e.value), e.value.limit) == (413, 4) and "5 items" in e.value.message
