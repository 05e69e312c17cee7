"""Health and model polling as the Router does it (group.go ``refresh``, health.go, client.go ``Models``,
cards.go, serving/prepare.go): every served model reaches "ready" with a card it can bind."""

from __future__ import annotations

import pytest

from tests.router import api
from tests.router.client import (
    CONTRACT_MAJOR,
    acquire,
    answers_type,
    bind_embedding,
    bind_head,
    bind_rerank,
    exchange,
    has_preset,
    health_state,
    ready_models,
)
from tests.router.conftest import BUNDLE_CAP, DECIDERS, EMBEDDERS, ENCODERS, RERANKERS, TASK_HEADS, Router
from tests.router.goshapes import DecodeError, decode

SERVED = [*ENCODERS, *TASK_HEADS, *DECIDERS, "minilm-embedding", "siglip"]
SURFACES = {"decisions", "classify", "embeddings", "rerank"}


def test_health_decodes_and_every_model_is_ready(router: Router) -> None:
    ex = exchange(router.server.client, "/health")
    assert ex.status == 200
    health = ex.body
    assert isinstance(health, api.Health)
    assert health.api_version.split(".")[0] == CONTRACT_MAJOR and health.status == "ready"
    for name in SERVED:
        assert health_state(health, name, len(SERVED)) == ("ready", ""), name
    for name, state in (health.models or {}).items():
        assert state.status in api.STATES, (name, state.status)
    assert ready_models(health, router.models.data or [], SERVED) == dict.fromkeys(SERVED, True)


def test_health_models_is_an_object_keyed_by_model() -> None:
    """The shape the poller needs: a list of models fails ``json.Unmarshal`` (the Router then sees no state)."""
    with pytest.raises(DecodeError):
        decode(api.Health, {"api_version": "5.0.0", "status": "ready", "models": [{"name": "m", "status": "ready"}]})
    ok = decode(api.Health, {"api_version": "5.0.0", "status": "ready", "models": {"m": {"status": "ready"}}})
    assert health_state(ok, "m", 2) == ("ready", "")


def test_liveness_decodes(router: Router) -> None:
    ex = exchange(router.server.client, "/health/live")
    assert ex.status == 200 and isinstance(ex.body, api.Liveness)
    assert ex.body.status == "alive" and ex.body.api_version.split(".")[0] == CONTRACT_MAJOR


def test_models_decode_with_process_limits_and_ready_cards(router: Router) -> None:
    ex = exchange(router.server.client, "/v1/models")
    assert ex.status == 200 and isinstance(ex.body, api.ModelList)
    listed = ex.body
    assert listed.object == "list" and listed.api_version.split(".")[0] == CONTRACT_MAJOR
    assert listed.limits.max_bundle_tasks == BUNDLE_CAP and listed.limits.max_request_bytes == 8 << 20
    ids = [card.id for card in listed.data or []]
    assert sorted(ids) == sorted(SERVED)
    for card in listed.data or []:
        assert card.object == "model" and card.family, card.id
        assert set(card.surfaces or []) <= SURFACES and card.surfaces, (card.id, card.surfaces)
        assert card.status in api.STATES and card.status == "ready", (card.id, card.status)
        assert card.ready is True, f"{card.id}: every card carries ready (issue 22 item 5)"
        acquire(card)
        assert card.limits is not None and (card.limits.max_input_tokens or 0) > 0, card.id


@pytest.mark.parametrize("name, kind, forms", [
    ("cls", "sequence", ("text", "pair")),
    ("ml", "scores", ("text",)),
    ("tok", "token", ("text", "grounded")),
    ("vela-hazard", "scores", ("text",)),
    ("vela-halu", "token", ("grounded",)),
])
def test_classify_cards_bind_their_heads(router: Router, name: str, kind: str, forms: tuple[str, ...]) -> None:
    card = router.card(name)
    for form in forms:
        head = bind_head(card, "", kind, form)
        assert bind_head(card, head.name, kind, form) == head
    head = (card.heads or [])[0]
    assert head.kind in api.HeadCardKind.values and head.name and head.labels
    assert len(set(head.labels or [])) == len(head.labels or [])
    if head.thresholds is not None:
        assert len(head.thresholds) == len(head.labels or []) and all(0 <= t <= 1 for t in head.thresholds)
    if head.overflow is not None:
        assert head.overflow in api.HeadCardOverflow.values
    if head.window is not None:
        assert 0 <= head.window.overlap < head.window.tokens
    if kind == "scores":
        assert head.thresholds is not None, "a multi-label head's operating point is its thresholds"


@pytest.mark.parametrize("name", EMBEDDERS)
def test_embedding_cards_bind_every_view(router: Router, name: str) -> None:
    card = router.card(name)
    embedding = bind_embedding(card)
    assert embedding.dimensions and embedding.layers and embedding.pooling, embedding
    assert "text" in (embedding.modalities or []), embedding.modalities
    for dimension in embedding.dimensions:
        bind_embedding(card, dimension=dimension)
    for layer in embedding.layers:
        bind_embedding(card, layer=layer)
    assert all(t in ("query", "document") for t in embedding.input_types or [])
    if name == "siglip":
        assert "image" in (embedding.modalities or [])


@pytest.mark.parametrize("name", RERANKERS)
def test_rerank_card_binds_every_exit(router: Router, name: str) -> None:
    card = router.card(name)
    default = bind_rerank(card)
    assert card.rerank is not None and card.rerank.exits
    assert default == card.rerank.default and default in card.rerank.exits
    for exit_ in card.rerank.exits:
        assert bind_rerank(card, exit_.layer, exit_.dimension) == exit_
        assert exit_.layer > 0 and exit_.dimension > 0


@pytest.mark.parametrize("name", DECIDERS)
def test_decision_cards_answer_their_types_and_presets(router: Router, name: str) -> None:
    card = router.card(name)
    acquire(card)
    for question_type in ("choice", "noul", "score"):
        assert answers_type(card, question_type), (name, question_type)
    for question_type in card.question_types or []:
        assert answers_type(card, question_type)
    for preset in card.presets or []:
        assert has_preset(card, preset)
    if name == "vela2":
        assert answers_type(card, "set") and answers_type(card, "span")
        assert {"pii", "halu", "relevance"} <= set(card.presets or [])
        assert card.limits is not None and (card.limits.max_scan_tokens or 0) > 0
