"""Classify as the Router asks for it (surfaces.go ``encodeClassify``: item lists, overflow, max_tokens,
window, threshold; fusion.go fuses several calls into one item list) and reads it (``decodeClassify``,
serving/classify.go, windows.go, spans.go, validate.go)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.router import api
from tests.router.client import (
    bind_head,
    check_classify_results,
    check_distribution,
    check_scores,
    check_spans,
    check_window_coverage,
    classify_request,
    exchange,
    server_timing,
    status_error,
)
from tests.router.conftest import Router

TEXTS = ["What is 2 + 2?", "I was charged twice for one order", "😀 Tom Baker lives in Paris, 東京"]
PAIRS = [{"text": "A man is eating.", "text_pair": "Someone eats."}, {"text": "It rains.", "text_pair": "東京"}]
GROUNDED = [{"context": "The Eiffel Tower is in Paris.", "question": "Where is it?", "answer": "It is in Rome, 東京."},
            {"context": "Water boils at 100 C.", "answer": "Water boils at 90 C."}]
#: About 100 tokens with the fixtures' tokenizer: several 32-token windows, inside their 128-token budget.
WINDOWED = " ".join(["alpha beta gamma delta"] * 10)


def classify(router: Router, body: dict[str, Any]) -> api.ClassifyResponse:
    ex = exchange(router.server.client, "/v1/classify", body)
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.ClassifyResponse) and server_timing(ex.headers).reported
    return ex.body


def contract_shape(body: api.ClassifyResponse, head: api.HeadCard, model: str) -> None:
    """Issue 22 item 4: the answer names its model, head, kind and label order; usage sums the inputs."""
    assert (body.model, body.head, body.kind, body.labels) == (model, head.name, head.kind, head.labels)
    results = body.results or []
    assert body.usage.input_tokens == sum(r.input.tokens for r in results if r.input is not None)
    for result in results:
        assert result.error is not None or result.input is not None, f"input {result.index} has no usage"


@pytest.mark.parametrize("form, inputs", [
    ("text", [{"text": t} for t in TEXTS]),
    ("pair", PAIRS),
])
def test_sequence_head(router: Router, form: str, inputs: list[dict[str, str]]) -> None:
    head = bind_head(router.card("cls"), "", "sequence", form)
    for batch in ([inputs[0]], inputs):  # one call per input, and the fused item list of several
        body = classify(router, classify_request("cls", batch, head=head.name))
        contract_shape(body, head, "cls")
        for result in check_classify_results(body, len(batch), head):
            assert result.error is None, result
            check_distribution(result.probabilities, len(head.labels or []))
            assert result.label == (head.labels or [])[max(range(len(head.labels or [])),
                                                              key=lambda i: (result.probabilities or [])[i])]


@pytest.mark.parametrize("name", ["ml", "vela-hazard"])
def test_scores_head_with_its_operating_point(router: Router, name: str) -> None:
    head = bind_head(router.card(name), "", "scores", "text")
    body = classify(router, classify_request(name, [{"text": t} for t in TEXTS]))
    contract_shape(body, head, name)
    thresholds = head.thresholds or []
    for result in check_classify_results(body, len(TEXTS), head):
        assert result.error is None, result
        check_scores(result.scores, len(head.labels or []))
        scores = result.scores or []
        expected = [label for label, s, t in zip(head.labels or [], scores, thresholds) if s >= t]
        assert result.selected == expected


@pytest.mark.parametrize("threshold", [None, 0.2, 0.6])
def test_token_head_over_text(router: Router, threshold: float | None) -> None:
    head = bind_head(router.card("tok"), "", "token", "text")
    body = classify(router, classify_request("tok", [{"text": t} for t in TEXTS], threshold=threshold))
    contract_shape(body, head, "tok")
    for text, result in zip(TEXTS, check_classify_results(body, len(TEXTS), head)):
        assert result.error is None, result
        check_spans(text, result.spans)
        assert all(span.label for span in result.spans or [])


@pytest.mark.parametrize("name", ["tok", "vela-halu"])
def test_token_head_over_grounded_items(router: Router, name: str) -> None:
    head = bind_head(router.card(name), "", "token", "grounded")
    body = classify(router, classify_request(name, GROUNDED, threshold=0.3))
    contract_shape(body, head, name)
    for item, result in zip(GROUNDED, check_classify_results(body, len(GROUNDED), head)):
        assert result.error is None, result
        check_spans(item["answer"], result.spans)


@pytest.mark.parametrize("name, kind", [("cls", "sequence"), ("ml", "scores"), ("tok", "token"),
                                        ("vela-hazard", "scores")])
def test_windows(router: Router, name: str, kind: str) -> None:
    """serving/windows.go ``prepareWindows``: overflow window, the deployment budget as max_tokens (at most
    the card's max_input_tokens) and the window geometry; the answer covers every content token."""
    card = router.card(name)
    head = bind_head(card, "", kind, "text")
    budget = (card.limits.max_input_tokens if card.limits else None) or 0
    assert budget >= 64
    body = classify(router, classify_request(name, [{"text": WINDOWED}, {"text": "short"}], head=head.name,
                                             overflow="window", max_tokens=budget, window=(32, 8)))
    contract_shape(body, head, name)
    long_result, short_result = check_classify_results(body, 2, head)
    for result in (long_result, short_result):
        assert result.error is None and result.input is not None, result
        assert not result.input.truncated and result.input.tokens == result.input.processed_tokens
    assert long_result.input is not None and (long_result.input.windows or 0) > 1
    if kind == "token":
        check_spans(WINDOWED, long_result.spans)
        if long_result.windows:
            check_window_coverage(long_result)
        return
    check_window_coverage(long_result)
    assert len(long_result.windows or []) == long_result.input.windows
    for window in long_result.windows or []:
        if kind == "sequence":
            check_distribution(window.probabilities, len(head.labels or []))
        else:
            check_scores(window.scores, len(head.labels or []))


@pytest.mark.parametrize("name, kind", [("cls", "sequence"), ("ml", "scores"), ("tok", "token"),
                                        ("vela-hazard", "scores")])
def test_truncate(router: Router, name: str, kind: str) -> None:
    head = bind_head(router.card(name), "", kind, "text")
    long_text = "word " * 300
    body = classify(router, classify_request(name, [{"text": long_text}, {"text": TEXTS[0]}], overflow="truncate",
                                             max_tokens=32))
    contract_shape(body, head, name)
    long_result, short_result = check_classify_results(body, 2, head)
    assert long_result.error is None and long_result.input is not None
    assert long_result.input.truncated and long_result.input.processed_tokens <= 32 < long_result.input.tokens
    assert short_result.input is not None and not short_result.input.truncated
