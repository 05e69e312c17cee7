"""Embeddings as the Router asks for them (surfaces.go ``encodeEmbed``: content parts, base64, dimensions,
layer, input_type, overflow) and as it reads them (``decodeEmbed``, serving/embedding.go)."""

from __future__ import annotations

import pytest

from tests.router import api
from tests.router.client import (
    bind_embedding,
    check_embeddings,
    content_part,
    decode_embed,
    embed_request,
    exchange,
    server_timing,
    status_error,
)
from tests.router.conftest import EMBEDDERS, Router
from tests.support.media_samples import data_url, image_bytes, picture

TEXTS = ["How do I reset my password?", "Où est la gare ? 東京 🚀"]


def embed(router: Router, body: dict) -> api.EmbeddingsResponse:
    ex = exchange(router.server.client, "/v1/embeddings", body)
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.EmbeddingsResponse) and server_timing(ex.headers).reported
    return ex.body


@pytest.mark.parametrize("name", EMBEDDERS)
def test_every_declared_view_embeds(router: Router, name: str) -> None:
    card = router.card(name)
    embedding = bind_embedding(card)
    views = [(0, 0)] + [(d, 0) for d in embedding.dimensions or []] + [(0, layer) for layer in embedding.layers or []]
    for dimension, layer in views:
        bind_embedding(card, dimension, layer)
        body = embed(router, embed_request(name, [content_part(t) for t in TEXTS], dimensions=dimension, layer=layer))
        assert body.model == name and body.object == "list"
        embedded = decode_embed(body)
        check_embeddings(embedded, len(TEXTS), dimension)
        width = dimension or max(embedding.dimensions or [0])
        assert all(len(v or []) == width for v in embedded.vectors), (dimension, layer)
        assert body.usage.prompt_tokens == sum(u.tokens for u in embedded.inputs if u is not None) > 0


@pytest.mark.parametrize("name", EMBEDDERS)
def test_full_input_call_proves_coverage(router: Router, name: str) -> None:
    """embedding.go ``EmbedFullInput`` / ``FitsInput``: overflow reject, and every input's usage proves it
    was read whole (tokens == processed_tokens, not truncated, not a lower bound)."""
    body = embed(router, embed_request(name, [content_part(t) for t in TEXTS], overflow="reject"))
    embedded = decode_embed(body)
    check_embeddings(embedded, len(TEXTS), full_input=True)


def test_truncated_input_says_so(router: Router) -> None:
    long_text = "word " * 400
    body = embed(router, embed_request("emb", [content_part(long_text), content_part("short")],
                                       overflow="truncate", max_tokens=16))
    embedded = decode_embed(body)
    check_embeddings(embedded, 2)
    first, second = embedded.inputs
    assert first is not None and first.truncated and first.processed_tokens <= 16 < first.tokens
    assert second is not None and not second.truncated and second.processed_tokens == second.tokens


def test_image_and_text_parts_in_one_call(router: Router) -> None:
    card = router.card("siglip")
    assert "image" in (bind_embedding(card).modalities or [])
    url = data_url(image_bytes(picture(24, 24, seed=3)), "image/png")
    parts = [content_part("a photo of a cat"), content_part(image_url=url), content_part("a dog")]
    body = embed(router, embed_request("siglip", parts))
    embedded = decode_embed(body)
    check_embeddings(embedded, 3)
    assert all(u is not None for u in embedded.inputs[::2]), "text parts report their tokens"


def test_image_to_a_text_only_embedder_is_a_bad_request(router: Router) -> None:
    """Issue 22 item 6: 400 invalid_request for that model, not 422 unsupported_surface."""
    url = data_url(image_bytes(picture(24, 24, seed=3)), "image/png")
    ex = exchange(router.server.client, "/v1/embeddings", embed_request("emb", [content_part(image_url=url)]))
    assert ex.status == 400 and isinstance(ex.body, api.ErrorResponse)
    assert ex.body.error.code == "invalid_request" and ex.body.error.message


@pytest.mark.parametrize("name", EMBEDDERS)
def test_input_type(router: Router, name: str) -> None:
    """input_type: a card that lists no input_types reads queries and documents alike (the same vector
    as without one); a role outside query and document is a bad request, never ignored."""
    assert bind_embedding(router.card(name)).input_types == []
    plain = embed(router, embed_request(name, [content_part(TEXTS[0])]))
    for input_type in ("query", "document"):
        typed = embed(router, embed_request(name, [content_part(TEXTS[0])], input_type=input_type))
        assert decode_embed(typed).vectors == decode_embed(plain).vectors
    ex = exchange(router.server.client, "/v1/embeddings",
                  embed_request(name, [content_part(TEXTS[0])], input_type="passage"))
    assert ex.status == 400 and isinstance(ex.body, api.ErrorResponse) and ex.body.error.code == "invalid_request"
