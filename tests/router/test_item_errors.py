"""One over-long input under ``overflow: reject`` fails alone on every surface: the other inputs are
answered, and the failed one decodes into the Go ``ItemError`` (a string) with a sibling ``message``
(issue 22 item 2), directly and inside a bundle."""

from __future__ import annotations

from typing import Any

import pytest

from tests.router import api
from tests.router.client import (
    Question,
    bind_head,
    check_embeddings,
    check_relevance,
    classify_request,
    content_part,
    decisions_request,
    decode_answers,
    decode_classify,
    decode_embed,
    decode_rerank,
    embed_request,
    exchange,
    rerank_request,
    send_bundle,
    status_error,
)
from tests.router.conftest import DECIDERS, Router

#: Over every budget the fixtures have: the encoders' 128 tokens, sparrow's 512, Decision 2.0's 2,048 and
#: Vela 2.0's scan budget.
LONG = "word " * 6000
INPUT_LIMIT = ("max_length_exceeded", "scan_budget_exceeded")


def raw_items(raw: Any, key: str) -> list[dict[str, Any]]:
    return sorted(raw[key], key=lambda item: item["index"])


def assert_failed_item(item: dict[str, Any], codes: tuple[str, ...] = ("max_length_exceeded",)) -> None:
    assert isinstance(item.get("error"), str) and item["error"] in codes, item
    assert item["error"] in api.ItemError.values
    assert isinstance(item.get("message"), str) and item["message"], item


@pytest.mark.parametrize("name, kind, inputs, failed", [
    ("cls", "sequence", [{"text": "short"}, {"text": LONG}, {"text": "also short"}], 1),
    ("cls", "sequence", [{"text": LONG, "text_pair": "b"}, {"text": "a", "text_pair": "b"}], 0),
    ("ml", "scores", [{"text": "short"}, {"text": LONG}], 1),
    ("tok", "token", [{"text": LONG}, {"text": "Tom lives in Paris"}], 0),
    ("tok", "token", [{"context": "c", "question": "q", "answer": "a b"}, {"context": LONG, "answer": "a"}], 1),
])
def test_classify(router: Router, name: str, kind: str, inputs: list[dict[str, str]], failed: int) -> None:
    head = bind_head(router.card(name), "", kind, "grounded" if "answer" in inputs[0] else "text")
    ex = exchange(router.server.client, "/v1/classify",
                  classify_request(name, inputs, head=head.name, overflow="reject"))
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.ClassifyResponse)
    results = sorted(decode_classify(ex.body), key=lambda r: r.index)
    assert [r.index for r in results] == list(range(len(inputs)))
    for result, item in zip(results, raw_items(ex.raw, "results")):
        if result.index == failed:
            assert_failed_item(item)
        else:
            assert result.error is None and result.input is not None, result


def test_embeddings(router: Router) -> None:
    parts = [content_part("short"), content_part(LONG), content_part("also short")]
    ex = exchange(router.server.client, "/v1/embeddings", embed_request("emb", parts, overflow="reject"))
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.EmbeddingsResponse)
    embedded = decode_embed(ex.body)
    assert embedded.errors == ["", "max_length_exceeded", ""]
    assert_failed_item(raw_items(ex.raw, "data")[1])
    for i in (0, 2):
        assert embedded.vectors[i] and embedded.inputs[i] is not None
    check_embeddings(type(embedded)([embedded.vectors[0]], [embedded.inputs[0]], [""]), 1, full_input=True)


def test_rerank(router: Router) -> None:
    documents = ["a refund", LONG, "a parcel"]
    ex = exchange(router.server.client, "/v1/rerank", rerank_request("rr", "refund?", documents, overflow="reject"))
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.RerankResponse)
    results = decode_rerank(ex.body, len(documents))
    assert [r.error for r in results] == [None, "max_length_exceeded", None]
    assert_failed_item(raw_items(ex.raw, "results")[1])
    check_relevance([results[0], results[2]])


@pytest.mark.parametrize("name", DECIDERS)
def test_decisions_batch(router: Router, name: str) -> None:
    """A batch (the contract's ``states``) with one over-long entry: that entry's questions fail with a string
    code and a message, the other entry is answered."""
    questions = [Question("urgent", "noul", "Is it urgent?"),
                 Question("domain", "choice", "Which domain?", choices=[("billing", "Payments"), ("other", "")])]
    card = router.card(name)
    encoded = decisions_request(name, "short", questions, card)["questions"]
    body = {"model": name, "states": {"ok": {"state": "I was charged twice.", "questions": encoded},
                                      "long": {"state": LONG, "questions": encoded}}}
    ex = exchange(router.server.client, "/v1/decisions", body)
    status_error(ex.status, ex.body.error if isinstance(ex.body, api.ErrorResponse) else None)
    assert isinstance(ex.body, api.DecisionResponse) and ex.body.states is not None
    ok = decode_answers(ex.body.states["ok"], questions)
    assert set(ok) == {"urgent", "domain"} and not any(a.error for a in ok.values()), ok
    long = decode_answers(ex.body.states["long"], questions)
    assert set(long) == {"urgent", "domain"}
    for qid in ("urgent", "domain"):
        assert long[qid].error in INPUT_LIMIT, (qid, long[qid])
        assert_failed_item(ex.raw["states"]["long"]["answers"][qid], INPUT_LIMIT)


def test_in_a_bundle_every_other_task_and_input_is_answered(router: Router) -> None:
    tasks = [
        {"id": "1", "embeddings": embed_request("minilm-embedding", [content_part(LONG), content_part("x")],
                                                 overflow="reject")},
        {"id": "2", "classify": classify_request("cls", [{"text": "x"}, {"text": LONG}], overflow="reject")},
        {"id": "3", "rerank": rerank_request("rr", "q", [LONG, "d"], overflow="reject")},
        {"id": "4", "decisions": decisions_request("sparrow-nano", LONG, [Question("urgent", "noul", "Urgent?")],
                                                   router.card("sparrow-nano"))},
    ]
    results = send_bundle(router.server.client, tasks)
    assert [r.status for r in results] == [200] * 4, [(r.id, r.status, r.error) for r in results]
    embeddings, classify, rerank, decisions = results
    assert embeddings.embeddings is not None
    assert decode_embed(embeddings.embeddings).errors == ["max_length_exceeded", ""]
    assert classify.classify is not None
    assert [r.error for r in sorted(decode_classify(classify.classify), key=lambda r: r.index)] == [
        None, "max_length_exceeded"]
    assert rerank.rerank is not None
    assert [r.error for r in decode_rerank(rerank.rerank, 2)] == ["max_length_exceeded", None]
    assert decisions.decisions is not None
    answers = decode_answers(decisions.decisions, [Question("urgent", "noul")])
    assert answers["urgent"].error == "max_length_exceeded", "sparrow-nano reads no more than its budget (item 6)"
