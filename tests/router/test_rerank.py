"""Rerank as the Router's relevance binding asks for it (serving/relevance.go: the card's exit as layer and
dimensions, overflow reject, every document) and reads it (surfaces.go ``decodeRerank``, tasks
``ValidateRelevanceScores``)."""

from __future__ import annotations

import math

import pytest

from tests.router import api
from tests.router.client import (
    bind_rerank,
    check_relevance,
    decode_rerank,
    exchange,
    rerank_request,
    server_timing,
    status_error,
)
from tests.router.conftest import RERANKERS, Router

QUERY = "How do I reset my password?"
DOCS = ["Open Settings, then Security.", "Our offices are closed on Sunday.", "Reset it from the login page. 東京"]


def rerank(router: Router, body: dict) -> api.RerankResponse:
    ex = exchange(router.server.client, "/v1/rerank", body)
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.RerankResponse) and server_timing(ex.headers).reported
    return ex.body


@pytest.mark.parametrize("name", RERANKERS)
def test_every_exit_scores_every_document(router: Router, name: str) -> None:
    card = router.card(name)
    bind_rerank(card)
    assert card.rerank is not None
    for exit_ in card.rerank.exits or []:
        chosen = bind_rerank(card, exit_.layer, exit_.dimension)
        body = rerank(router, rerank_request(name, QUERY, DOCS, layer=chosen.layer, dimensions=chosen.dimension,
                                             overflow="reject"))
        results = decode_rerank(body, len(DOCS))
        check_relevance(results)
        for result in results:
            assert result.logit is not None and result.relevance_score is not None
            assert math.isclose(result.relevance_score, 1 / (1 + math.exp(-result.logit)), rel_tol=1e-6)
        assert body.usage.input_tokens == sum(r.input.tokens for r in results if r.input is not None)


def test_default_exit_without_layer(router: Router) -> None:
    body = rerank(router, rerank_request("rr", QUERY, DOCS[:1], overflow="reject", max_tokens=64))
    check_relevance(decode_rerank(body, 1))
