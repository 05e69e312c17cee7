"""Decisions as the Router asks them (client.go ``encodeDecisionRequest`` / ``encodeQuestion``: choices with
null descriptions, levels, Set/Span labels as ordered criteria, presets, thresholds, scan options) and
reads them (``decodeResponse``, answer_check.go ``checkAnswers``), for every decision family; and
/v1/systemone, whose 200 body the generated client decodes as the same ``DecisionResponse``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.router import api
from tests.router.client import (
    Question,
    answers_type,
    checked_answers,
    decisions_request,
    exchange,
    has_preset,
    scans,
    server_timing,
    status_error,
)
from tests.router.conftest import DECIDERS, Router

STATE = "My card was charged twice and the parcel never arrived. Write to me at jane.doe@example.com."
PARTS = {"request": "Summarise the refund policy.", "answer": "Refunds within 30 days; call 555 0100.",
         "document": "Refunds are accepted within 30 days of purchase."}


def typed_questions(card: api.ModelCard) -> list[Question]:
    """Every question form the Router builds that the card answers."""
    questions = [
        Question("domain", "choice", "Which domain does this request belong to?",
                 choices=[("billing", "A payment or charge problem"), ("shipping", "A delivery problem"),
                          ("other", "")]),
        Question("urgent", "noul", "Does the customer need an answer today?"),
        Question("difficulty", "score", "How difficult is this request?", levels=["Trivial", "Moderate", "Hard"]),
    ]
    if answers_type(card, "set"):
        questions.append(Question("problems", "set", "Which problems does the customer report?",
                                  labels=[("billing", "A payment problem"), ("shipping", ""), ("account", "A login")],
                                  threshold=0.3))
    if answers_type(card, "span"):
        questions.append(Question("contacts", "span", "Find the personal contact details.",
                                  labels=[("EMAIL_ADDRESS", "An email address")], threshold=0.5))
    return questions


def decide(router: Router, body: dict[str, Any], path: str = "/v1/decisions") -> api.DecisionResponse:
    ex = exchange(router.server.client, path, body)
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.DecisionResponse) and server_timing(ex.headers).reported
    return ex.body


def assert_usable(body: api.DecisionResponse, questions: list[Question], model: str) -> None:
    """Every question answered, none failed, none turned into invalid_model_output by the Router's checks."""
    assert body.model == model and body.usage.input_tokens > 0
    answers = checked_answers(body, questions)
    assert set(answers) == {q.id for q in questions}
    for question in questions:
        answer = answers[question.id]
        assert not answer.error, (question.id, answer, (body.answers or {}).get(question.id))
        if question.type:
            assert answer.type == question.type


@pytest.mark.parametrize("name", DECIDERS)
def test_typed_questions(router: Router, name: str) -> None:
    card = router.card(name)
    questions = typed_questions(card)
    body = decide(router, decisions_request(name, STATE, questions, card, deadline_ms=60_000))
    assert_usable(body, questions, name)
    for question in questions:
        if question.type in ("set", "span"):
            assert (body.thresholds or {})[question.id] == question.threshold


@pytest.mark.parametrize("name", DECIDERS)
def test_one_question_at_a_time(router: Router, name: str) -> None:
    """The Router asks a signal's question alone when a stage has no other (one task per call)."""
    card = router.card(name)
    for question in typed_questions(card):
        body = decide(router, decisions_request(name, STATE, [question], card))
        assert_usable(body, [question], name)


def test_presets_typed_parts_and_scan_options(router: Router) -> None:
    card = router.card("vela2")
    assert scans(card)
    presets = [Question(p, preset=p) for p in ("pii", "halu", "relevance") if has_preset(card, p)]
    assert len(presets) == 3
    presets[0].threshold, presets[1].truncate = 0.4, True
    questions = [*presets, *typed_questions(card)]
    limits = card.limits
    assert limits is not None and limits.max_scan_tokens
    body = decide(router, decisions_request("vela2", PARTS, questions, card, max_tokens=limits.max_scan_tokens))
    assert_usable(body, questions, "vela2")
    truncated = [Question("urgent", "noul", "Is it urgent?", truncate=True)]
    body = decide(router, decisions_request("vela2", STATE, truncated, card, max_tokens=limits.max_scan_tokens))
    assert_usable(body, [Question("urgent", "noul")], "vela2")


def test_bounded_models_never_get_scan_options(router: Router) -> None:
    """client.go ``boundedRead``: a card without max_scan_tokens gets no max_tokens and no overflow."""
    card = router.card("sparrow-nano")
    assert not scans(card)
    body = decisions_request("sparrow-nano", STATE, [Question("urgent", "noul", "Urgent?", truncate=True)], card,
                             max_tokens=4096)
    assert "max_tokens" not in body["options"] and "overflow" not in body["questions"]["urgent"]
    assert_usable(decide(router, body), [Question("urgent", "noul")], "sparrow-nano")


def test_model_named_by_alias_and_by_default(router: Router) -> None:
    card = router.card("sparrow-nano")
    question = typed_questions(card)[0]
    body = decide(router, decisions_request("jev-latest", STATE, [question], card))
    assert_usable(body, [question], "sparrow-nano")


def test_systemone_answer_decodes_as_a_decision_response(router: Router) -> None:
    card = router.card("sparrow-nano")
    questions = typed_questions(card)
    body = decisions_request("sparrow-nano", STATE, questions, card)
    body.pop("options")  # the 5.0 System One schema refuses members it does not define
    assert_usable(decide(router, body, "/v1/systemone"), questions, "sparrow-nano")


def test_failed_question_is_a_string_code_with_a_message(router: Router) -> None:
    """A malformed question is answered in place: ``error`` a string the Go ``ItemError`` takes, ``message``
    beside it, and the other questions answered."""
    card = router.card("decision2")
    good = typed_questions(card)[0]
    body = decisions_request("decision2", STATE, [good], card)
    body["questions"]["bad"] = {"type": "choice", "instructions": "Pick one.", "choices": [{"key": "only"}]}
    decided = decide(router, body)
    bad = (decided.answers or {})["bad"]
    assert bad.error == "invalid_question" and bad.message and bad.type == "choice"
    answers = checked_answers(decided, [good, Question("bad", "choice")])
    assert not answers[good.id].error and answers["bad"].error == "invalid_question"
