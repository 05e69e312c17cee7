"""The mirrors themselves, without a server: encoding/json's rules as ``goshapes.decode`` applies them, and the
Router's checks in ``client`` accepting a conforming answer and refusing what the Go code refuses."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from tests.router import api
from tests.router.client import (
    Question,
    RouterRefused,
    bind_embedding,
    bind_head,
    bind_rerank,
    check_classify_results,
    check_distribution,
    check_embeddings,
    check_relevance,
    check_spans,
    check_window_coverage,
    checked_answers,
    decisions_request,
    decode_embed,
    decode_rerank,
    encode_question,
    health_state,
    server_timing,
)
from tests.router.goshapes import DecodeError, decode, decode_vector

# -- encoding/json ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("go_type, value", [
    ("int", 1.0), ("int", "1"), ("int", True), ("int", 1e3), ("string", 1), ("bool", 0), ("float64", "0.5"),
])
def test_scalar_mismatches_fail_like_json_unmarshal(go_type: str, value: Any) -> None:
    with pytest.raises(DecodeError):
        decode(go_type, value)


def test_nulls_missing_and_unknown_fields() -> None:
    usage = decode(api.InputUsage, {"tokens": None, "Processed_Tokens": 3, "surprise": {"x": 1}})
    assert usage == api.InputUsage(processed_tokens=3, tokens=0, tokens_lower_bound=None, truncated=False,
                                   windows=None)
    card = decode(api.ModelCard, {"id": "m", "heads": None, "surfaces": None})
    assert card.heads is None and card.surfaces is None and card.ready is False


def test_shapes_the_router_cannot_read() -> None:
    with pytest.raises(DecodeError):
        decode(api.ClassifyResult, {"index": 0, "error": {"code": "max_length_exceeded", "message": "m"}})
    with pytest.raises(DecodeError):
        decode(api.ClassifyResult, {"index": 0, "probabilities": {"a": 1.0}})
    with pytest.raises(DecodeError):
        decode(api.ModelList, {"data": [{"id": "m", "limits": {"max_input_tokens": 512.0}}]})
    item = decode(api.ClassifyResult, {"index": 0, "error": "made_up_code", "message": "m"})
    assert item.error == "made_up_code", "any string decodes; the binding maps unknown codes to ErrFailed"


def test_vectors() -> None:
    packed = base64.b64encode(struct.pack("<3f", 0.5, -1.0, 2.0)).decode()
    assert decode_vector(packed) == [0.5, -1.0, 2.0]
    assert decode_vector([0.5, 1]) == [0.5, 1.0]
    for bad in ("abc", base64.b64encode(b"\x00\x00\x80").decode(), [], ["x"], [1e39]):
        with pytest.raises(DecodeError):
            decode_vector(bad)


def test_server_timing_reading() -> None:
    import httpx

    headers = httpx.Headers([("server-timing", 'parse;dur=0.5, queue;desc="x";dur=1, odd;dur=2, post;dur=-1'),
                             ("server-timing", "total;dur=\"4.25\"")])
    timing = server_timing(headers)
    assert timing.reported and timing.total == 4.25 and timing.phases == {"parse": 0.5, "queue": 1.0}
    assert not server_timing(httpx.Headers({"server-timing": "total;dur=NaN"})).reported


# -- cards and health ---------------------------------------------------------------------------------------

CARD = {
    "id": "m", "object": "model", "family": "encoder", "surfaces": ["classify", "embeddings", "rerank"],
    "ready": True, "status": "ready", "device": "cpu", "dtype": "fp32",
    "heads": [{"name": "intent", "kind": "sequence", "labels": ["a", "b"], "inputs": ["text", "pair"],
               "default_threshold": None, "thresholds": None, "reduction": None, "window": None,
               "operating_point_sha256": None}],
    "embedding": {"dimensions": [8, 4], "layers": [2], "pooling": "mean", "normalized": True,
                  "modalities": ["text"], "input_types": []},
    "rerank": {"default": {"layer": 2, "dimension": 8}, "exits": [{"layer": 2, "dimension": 8}]},
}


def test_card_bindings() -> None:
    card = decode(api.ModelCard, CARD)
    assert bind_head(card, "", "sequence", "pair").name == "intent"
    for kind, form in (("scores", "text"), ("sequence", "grounded")):
        with pytest.raises(RouterRefused):
            bind_head(card, "", kind, form)
    assert bind_embedding(card, 4, 2).pooling == "mean"
    with pytest.raises(RouterRefused):
        bind_embedding(card, 16)
    assert bind_rerank(card, 2, 8).layer == 2
    with pytest.raises(RouterRefused):
        bind_head(decode(api.ModelCard, {**CARD, "dtype": None}), "", "sequence", "text")


def test_health_states() -> None:
    one = decode(api.Health, {"api_version": "5.0.0", "status": "loading", "reason": None})
    assert health_state(one, "m", 1) == ("loading", "")
    assert health_state(one, "m", 2)[0] == "missing"
    old = decode(api.Health, {"api_version": "2.2.0", "status": "ready", "models": {"m": {"status": "ready"}}})
    assert health_state(old, "m", 1)[0] == "incompatible"


# -- surface answers ------------------------------------------------------------------------------------------


def head() -> api.HeadCard:
    return decode(api.HeadCard, CARD["heads"][0])


def classify_body(**result: Any) -> api.ClassifyResponse:
    return decode(api.ClassifyResponse, {"model": "m", "head": "intent", "kind": "sequence", "labels": ["a", "b"],
                                         "results": [{"index": 0, **result}], "usage": {"input_tokens": 3}})


def test_classify_checks() -> None:
    usage = {"tokens": 3, "processed_tokens": 3, "truncated": False}
    [result] = check_classify_results(classify_body(label="a", probabilities=[0.7, 0.3], input=usage), 1, head())
    check_distribution(result.probabilities, 2)
    with pytest.raises(RouterRefused):
        check_distribution([0.7, 0.2], 2)
    body = decode(api.ClassifyResponse, {**CARD["heads"][0], "head": "intent", "labels": ["b", "a"], "results": []})
    with pytest.raises(RouterRefused):
        check_classify_results(body, 0, head())
    with pytest.raises(RouterRefused):
        check_classify_results(classify_body(probabilities=[0.5, 0.5]), 2, head())


def test_span_and_window_checks() -> None:
    text = "é Tom"
    check_spans(text, [decode(api.Span, {"start": 2, "end": 5, "text": "Tom", "label": "PER", "probability": 0.9})])
    with pytest.raises(RouterRefused):  # byte offsets, not code points
        check_spans(text, [decode(api.Span, {"start": 3, "end": 6, "text": "Tom", "label": "PER", "probability": 1})])
    windows = [{"start": 0, "end": 30}, {"start": 22, "end": 52}, {"start": 44, "end": 60}]
    usage = {"tokens": 62, "processed_tokens": 62, "truncated": False, "windows": 3}
    good = decode(api.ClassifyResult, {"index": 0, "windows": windows, "input": usage})
    check_window_coverage(good)
    gap = decode(api.ClassifyResult, {"index": 0, "windows": [windows[0], {"start": 31, "end": 60}],
                                      "input": {"tokens": 62, "processed_tokens": 62, "truncated": False}})
    with pytest.raises(RouterRefused):
        check_window_coverage(gap)


def test_embedding_and_rerank_checks() -> None:
    usage = {"tokens": 4, "processed_tokens": 4, "truncated": False}
    vector = base64.b64encode(struct.pack("<2f", 0.6, 0.8)).decode()
    body = decode(api.EmbeddingsResponse, {"data": [{"index": 1, "object": "embedding", "error": "max_length_exceeded",
                                                     "message": "m", "embedding": None},
                                                    {"index": 0, "object": "embedding", "embedding": vector,
                                                     "input": usage}]})
    embedded = decode_embed(body)
    assert embedded.errors == ["", "max_length_exceeded"] and embedded.vectors[0] == pytest.approx([0.6, 0.8])
    with pytest.raises(RouterRefused):
        check_embeddings(embedded, 2)
    partial = {**usage, "processed_tokens": 2, "truncated": True, "tokens_lower_bound": True}
    lower = decode_embed(decode(api.EmbeddingsResponse, {"data": [{"index": 0, "embedding": [1.0], "input": partial}]}))
    check_embeddings(lower, 1)
    with pytest.raises(RouterRefused):
        check_embeddings(lower, 1, full_input=True)
    rerank = decode(api.RerankResponse, {"results": [{"index": 1, "logit": 0.5, "input": usage},
                                                     {"index": 0, "relevance_score": 0.6, "input": usage}]})
    results = decode_rerank(rerank, 2)
    assert results[0].error == "invalid_model_output" and results[1].logit == 0.5
    with pytest.raises(RouterRefused):
        check_relevance(results)


# -- decisions -------------------------------------------------------------------------------------------------


def test_questions_are_encoded_as_the_router_encodes_them() -> None:
    card = decode(api.ModelCard, {"id": "d", "surfaces": ["decisions"], "limits": {"max_scan_tokens": 0}})
    questions = [Question("c", "choice", "Which?", choices=[("a", ""), ("b", "B")], truncate=True),
                 Question("s", "set", "Which labels?", labels=[("z", "Z"), ("y", "")], threshold=0.3),
                 Question("p", preset="pii", threshold=0.4)]
    body = decisions_request("d", "state", questions, card, max_tokens=100)
    assert body["options"] == {}
    assert body["questions"]["c"] == {"type": "choice", "instructions": "Which?",
                                      "choices": [{"key": "a", "description": None}, {"key": "b", "description": "B"}]}
    assert list(body["questions"]["s"]["criteria"]) == ["z", "y"] and body["questions"]["s"]["threshold"] == 0.3
    assert encode_question(questions[2]) == {"preset": "pii", "threshold": 0.4}


def test_answer_checks() -> None:
    questions = [Question("c", "choice", "?", choices=[("a", ""), ("b", "")]),
                 Question("n", "noul", "?"),
                 Question("s", "score", "?", levels=["x", "y", "z"]),
                 Question("set", "set", "?", labels=[("l", "")]),
                 Question("sp", "span", "?", labels=[("E", "")])]
    body = decode(api.DecisionResponse, {
        "model": "d", "usage": {"input_tokens": 5, "output_tokens": 0},
        "answers": {"c": {"type": "choice", "choice": "a", "confidence": 0.2, "probabilities": {"a": 0.6, "b": 0.4}},
                    "n": {"type": "noul", "noul": 0.3},
                    "s": {"type": "score", "score": 1.0, "confidence": 0.5,
                          "probabilities": {"0": 0.25, "1": 0.5, "2": 0.25}},
                    "set.l": {"type": "noul", "noul": 0.9}, "sp": {"type": "noul", "noul": 0.8}},
        "sets": {"set": {"selected": ["l"], "probabilities": {"l": 0.9}}},
        "spans": {"sp": [{"label": "E", "start": 0, "end": 1, "text": "x", "probability": 0.8}]},
        "thresholds": {"set": 0.5, "sp": 0.5}})
    answers = checked_answers(body, questions)
    assert {k: a.error for k, a in answers.items()} == dict.fromkeys(["c", "n", "s", "set", "sp"], "")
    wrong = decode(api.DecisionResponse, {"answers": {
        "c": {"type": "choice", "choice": "b", "probabilities": {"a": 0.6, "b": 0.4}},
        "s": {"type": "score", "score": 2.0, "probabilities": {"0": 0.25, "1": 0.5, "2": 0.25}},
        "set": {"type": "noul", "noul": 0.9}}})
    answers = checked_answers(wrong, questions)
    assert {k: a.error for k, a in answers.items()} == dict.fromkeys(["c", "s", "set"], "invalid_model_output")
