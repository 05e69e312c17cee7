"""The encoder surfaces over real HTTP on 127.0.0.1, every body validated against openapi.yaml."""

from __future__ import annotations

import base64
import gzip
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import zstandard

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import Server

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


def call(server: Server, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None, validate: bool = True) -> httpx.Response:
    """One request; its JSON body is checked against the contract for that path, method and status."""
    if raw is None and body is not None:
        raw = orjson.dumps(body)
    hdrs = {"content-type": "application/json", **(headers or {})}
    response = server.client.request(method, path, content=raw, headers=hdrs)
    if validate and response.headers.get("content-type", "").startswith("application/json"):
        validate_response(path, method.lower(), response.status_code, response.json())
    return response


def post(server: Server, path: str, body: Any, **kw: Any) -> httpx.Response:
    return call(server, "POST", path, body, **kw)


def timing_of(response: httpx.Response) -> dict[str, float]:
    parts = [p.strip().split(";dur=") for p in response.headers["server-timing"].split(",")]
    return {name: float(value) for name, value in parts}


# -- health, models, openapi -------------------------------------------------------------------


def test_health_and_liveness(server: Server) -> None:
    r = call(server, "GET", "/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ready" and body["api_version"] == "5.0.0"
    assert set(body["models"]) >= {"emb", "cls", "ml", "tok", "rr"}
    live = call(server, "GET", "/health/live")
    assert live.status_code == 200 and live.json() == {"api_version": "5.0.0", "status": "alive"}


def test_models_lists_cards_limits_and_engine(server: Server) -> None:
    body = call(server, "GET", "/v1/models").json()
    assert body["api_version"] == "5.0.0"
    assert body["limits"]["max_bundle_tasks"] == 8
    assert body["limits"]["max_request_bytes"] == 1048576
    by_id = {m["id"]: m for m in body["data"]}
    cls = by_id["cls"]
    assert cls["surfaces"] == ["classify"] and cls["ready"] is True
    assert cls["heads"] == [{"name": "default", "kind": "sequence", "labels": cls["heads"][0]["labels"],
                             "inputs": ["text", "pair"], "overflow": "reject",
                             "window": {"tokens": cls["limits"]["max_input_tokens"], "overlap": 0}}]
    assert cls["heads"][0]["labels"] and "labels" not in cls  # one place for each fact
    assert cls["limits"]["max_inputs"] == body["limits"]["max_inputs"]
    assert cls["engine"] == "onnxruntime" and cls["engine_args"]["threads"] == 1
    assert cls["numerics"] == "exact" and cls["self_check"]["status"] == "passed"
    assert cls["engine_args"]["grouping"] in ("padded", "equal_length", "alone")
    assert by_id["emb"]["embedding"]["dimensions"] and by_id["emb"]["embedding"]["layers"]
    assert by_id["rr"]["rerank"]["default"] == by_id["rr"]["rerank"]["exits"][0]
    assert by_id["rr"]["rerank"]["default"]["layer"] >= 1 and by_id["rr"]["rerank"]["default"]["dimension"] >= 1
    assert by_id["emb-int8"]["dtype"] == "int8"
    # the per-token int8 variant is proven batch-invariant at load, so it batches under exact numerics
    assert by_id["emb-int8"]["numerics"] == "exact" and by_id["emb-int8"]["engine_args"]["grouping"] == "padded"


def test_openapi_is_served_verbatim(server: Server) -> None:
    from edge_runtime.api.schema import openapi_bytes

    r = server.client.get("/openapi.yaml")
    assert r.status_code == 200 and r.content == openapi_bytes()


# -- embeddings ----------------------------------------------------------------------------------


def test_embeddings_float_and_base64_agree(server: Server) -> None:
    texts = ["How do I reset my password?", "Où est la gare ? 東京 🚀"]
    f = post(server, "/v1/embeddings", {"model": "emb", "input": texts})
    b = post(server, "/v1/embeddings", {"model": "emb", "input": texts, "encoding_format": "base64"})
    assert f.status_code == 200 and b.status_code == 200
    fb, bb = f.json(), b.json()
    assert fb["object"] == "list" and [d["index"] for d in fb["data"]] == [0, 1]
    for fd, bd in zip(fb["data"], bb["data"]):
        decoded = np.frombuffer(base64.b64decode(bd["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(fd["embedding"], dtype=np.float32))
        assert float(np.linalg.norm(decoded)) == pytest.approx(1.0, abs=1e-5)
    assert fb["usage"]["prompt_tokens"] == fb["usage"]["total_tokens"] > 0


def test_embeddings_dimensions_and_layer(server: Server) -> None:
    info = {m["id"]: m for m in call(server, "GET", "/v1/models").json()["data"]}["emb"]
    small = min(info["embedding"]["dimensions"])
    r = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "dimensions": small,
                                         "options": {"return_meta": True}})
    assert r.status_code == 200
    body = r.json()
    assert len(body["data"][0]["embedding"]) == small
    assert body["meta"]["representation"]["dimension"] == small
    early = min(info["embedding"]["layers"])
    r2 = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "layer": early,
                                          "options": {"return_meta": True}})
    assert r2.status_code == 200 and r2.json()["meta"]["representation"]["layer"] == early
    full = post(server, "/v1/embeddings", {"model": "emb", "input": "hello"}).json()["data"][0]["embedding"]
    assert r2.json()["data"][0]["embedding"] != full
    bad = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "dimensions": small + 1})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
    bad_layer = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "layer": 99})
    assert bad_layer.status_code == 400
    # a model whose card lists no input_types reads queries and documents alike
    assert info["embedding"]["input_types"] == []
    for kind in ("query", "document"):
        typed = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "input_type": kind})
        assert typed.json()["data"][0]["embedding"] == full
    passage = post(server, "/v1/embeddings", {"model": "emb", "input": "hello", "input_type": "passage"})
    assert passage.status_code == 400


def test_embeddings_with_the_openai_client(server: Server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    default = client.embeddings.create(model="emb", input=["a short text", "another one"])  # base64 by default
    floats = client.embeddings.create(model="emb", input=["a short text", "another one"], encoding_format="float")
    assert len(default.data) == 2
    for a, b in zip(default.data, floats.data):
        assert np.allclose(a.embedding, b.embedding, atol=0, rtol=0)
    assert default.usage.prompt_tokens > 0


def test_long_input_reject_and_truncate(server: Server) -> None:
    long_text = "word " * 5000
    r = post(server, "/v1/embeddings", {"model": "emb", "input": [long_text, "short"]})
    assert r.status_code == 200
    data = r.json()["data"]
    assert data[0]["embedding"] is None and data[0]["error"] == "max_length_exceeded" and data[0]["message"]
    assert data[1]["embedding"] is not None
    assert data[1]["input"]["tokens"] == data[1]["input"]["processed_tokens"] == r.json()["usage"]["prompt_tokens"]
    assert data[1]["input"]["truncated"] is False
    t = post(server, "/v1/embeddings", {"model": "emb", "input": long_text,
                                         "options": {"overflow": "truncate", "max_tokens": 16}})
    assert t.status_code == 200
    usage = t.json()["usage"]
    assert usage.get("tokens_lower_bound") is True and usage["prompt_tokens"] >= 16
    read = t.json()["data"][0]["input"]
    assert read == {"tokens": usage["prompt_tokens"], "processed_tokens": 16, "truncated": True,
                    "tokens_lower_bound": True}


# -- classify --------------------------------------------------------------------------------


def test_classify_sequence_labels(server: Server) -> None:
    r = post(server, "/v1/classify", {"model": "cls", "input": ["What is 2 + 2?", {"text": "a", "text_pair": "b"}]})
    assert r.status_code == 200
    body = r.json()
    results = body["results"]
    assert (body["head"], body["kind"]) == ("default", "sequence") and len(body["labels"]) >= 2
    assert [x["index"] for x in results] == [0, 1]
    for x in results:
        assert len(x["probabilities"]) == len(body["labels"])
        assert sum(x["probabilities"]) == pytest.approx(1.0, abs=1e-6)
        assert x["label"] == body["labels"][int(np.argmax(x["probabilities"]))]
        assert x["input"]["tokens"] == x["input"]["processed_tokens"] and not x["input"]["truncated"]
    assert body["usage"]["input_tokens"] == sum(x["input"]["tokens"] for x in results)


def test_classify_multi_label_thresholds(server: Server) -> None:
    r = post(server, "/v1/classify", {"model": "ml", "input": "some text to score"})
    body = r.json()
    x = body["results"][0]
    assert body["kind"] == "scores" and len(x["scores"]) == len(body["labels"]) == len(body["thresholds"])
    assert x["selected"] == [k for k, s, t in zip(body["labels"], x["scores"], body["thresholds"]) if s >= t]
    # options.threshold applies one threshold to every label, for this request only
    low = post(server, "/v1/classify", {"model": "ml", "input": "some text to score", "options": {"threshold": 0.0}})
    assert low.json()["thresholds"] == [0.0] * len(body["labels"])
    assert low.json()["results"][0]["selected"] == body["labels"]
    for bad in ({"options": {"threshold": 1.5}}, {"head": "other"}):
        r = post(server, "/v1/classify", {"model": "ml", "input": "x", **bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    assert post(server, "/v1/classify", {"model": "ml", "input": "x", "head": "default"}).status_code == 200
    refused = post(server, "/v1/classify", {"model": "cls", "input": "x", "options": {"threshold": 0.5}})
    assert refused.status_code == 400 and "sequence" in refused.json()["error"]["message"]


def test_classify_token_spans_use_code_point_offsets(server: Server) -> None:
    text = "😀 Tom Baker lives in Paris and writes tom.baker@example.com"
    r = post(server, "/v1/classify", {"model": "tok", "input": [text]})
    assert r.status_code == 200
    for span in r.json()["results"][0]["spans"]:
        assert 0 <= span["start"] < span["end"] <= len(text)
        assert text[span["start"]:span["end"]] == span["text"]
        assert 0.0 <= span["probability"] <= 1.0
    spans = r.json()["results"][0]["spans"]
    for threshold in sorted({0.0, *(s["probability"] for s in spans)}):  # options.threshold keeps the likelier spans
        kept = post(server, "/v1/classify", {"model": "tok", "input": [text], "options": {"threshold": threshold}})
        assert kept.json()["results"][0]["spans"] == [s for s in spans if s["probability"] >= threshold]
    grounded = post(server, "/v1/classify", {"model": "tok", "input": [
        {"context": "The Eiffel Tower is in Paris.", "question": "Where is it?", "answer": "It is in Rome, 東京."}]})
    assert grounded.status_code == 200
    answer = "It is in Rome, 東京."
    for span in grounded.json()["results"][0]["spans"]:
        assert answer[span["start"]:span["end"]] == span["text"]


def test_classify_windows_and_item_errors(server: Server) -> None:
    long_text = " ".join(f"word{i}" for i in range(300))
    r = post(server, "/v1/classify", {"model": "cls", "input": [long_text, "short"],
                                       "options": {"max_tokens": 32}})
    results = r.json()["results"]
    assert results[0]["error"] == "max_length_exceeded" and results[0]["message"] and "label" in results[1]
    assert r.json()["usage"]["input_tokens"] == results[1]["input"]["tokens"]
    medium = " ".join(f"word{i}" for i in range(20))
    w = post(server, "/v1/classify", {"model": "cls", "input": [medium, "short"],
                                       "options": {"overflow": "window", "max_tokens": 128,
                                                   "window": {"tokens": 32, "overlap": 8}}})
    assert w.status_code == 200
    body = w.json()
    x, one = body["results"]
    windows = x["windows"]
    assert len(windows) == x["input"]["windows"] > 1
    assert x["input"]["tokens"] == x["input"]["processed_tokens"] and not x["input"]["truncated"]
    # windows cover the content tokens in order, with no gap, as the Router checks them
    assert windows[0]["start"] == 0 and windows[-1]["end"] == x["input"]["tokens"] - 2  # [CLS] and [SEP]
    for before, after in zip(windows, windows[1:]):
        assert before["start"] < after["start"] <= before["end"] < after["end"]
    assert all(len(w["probabilities"]) == len(body["labels"]) for w in windows)
    assert x["probabilities"] == [max(v) for v in zip(*(w["probabilities"] for w in windows))]
    assert one["windows"] == [{"start": 0, "end": one["input"]["tokens"] - 2, "probabilities": one["probabilities"]}]


# -- rerank ----------------------------------------------------------------------------------


def test_rerank_sorted_top_n_and_documents(server: Server) -> None:
    docs = ["Open Settings, then Security.", "Our offices are closed on Sunday.", "Reset it from the login page."]
    r = post(server, "/v1/rerank", {"model": "rr", "query": "How do I reset my password?", "documents": docs,
                                     "top_n": 2, "return_documents": True})
    assert r.status_code == 200
    results = r.json()["results"]
    assert len(results) == 2
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    for x in results:
        assert x["document"]["text"] == docs[x["index"]]
        assert 0.0 <= x["relevance_score"] <= 1.0
        assert x["relevance_score"] == pytest.approx(1 / (1 + math.exp(-x["logit"])), abs=1e-12)
        assert x["input"]["tokens"] == x["input"]["processed_tokens"] > 0 and not x["input"]["truncated"]
    full = post(server, "/v1/rerank", {"model": "rr", "query": "q", "documents": docs}).json()["results"]
    assert sorted(x["index"] for x in full) == [0, 1, 2] and "document" not in full[0]
    card = {m["id"]: m for m in call(server, "GET", "/v1/models").json()["data"]}["rr"]["rerank"]["default"]
    at_exit = {"model": "rr", "query": "q", "documents": docs, "layer": card["layer"], "dimensions": card["dimension"]}
    assert post(server, "/v1/rerank", at_exit).json()["results"] == full
    for bad in ({"layer": card["layer"] + 1}, {"dimensions": card["dimension"] + 1}):
        r = post(server, "/v1/rerank", {"model": "rr", "query": "q", "documents": docs, **bad})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"


# -- bundle --------------------------------------------------------------------------------


def test_bundle_tasks_in_order_with_own_status(server: Server) -> None:
    body = {"tasks": [
        {"id": "a", "classify": {"model": "cls", "input": ["What is 2 + 2?"]}},
        {"id": "b", "embeddings": {"model": "emb", "input": "hi"}},
        {"id": "c", "embeddings": {"model": "nope", "input": "hi"}},
        {"id": "d", "rerank": {"model": "rr", "query": "q", "documents": ["x", "y"]}},
        {"id": "e", "classify": {"model": "emb", "input": ["x"]}},
    ], "options": {"deadline_ms": 10000}}
    r = post(server, "/v1/bundle", body)
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["id"] for x in results] == ["a", "b", "c", "d", "e"]
    assert [x["status"] for x in results] == [200, 200, 404, 200, 422]
    alone = post(server, "/v1/classify", {"model": "cls", "input": ["What is 2 + 2?"]}).json()
    assert results[0]["classify"]["results"] == alone["results"]
    assert set(timing_of(r)) == set(PHASES)
    with_meta = post(server, "/v1/bundle", {**body, "options": {"return_meta": True}}).json()["results"]
    assert [("meta" in x.get(s, {})) for x, s in zip(with_meta, ["classify", "embeddings", "-", "rerank", "-"])] == [
        True, True, False, True, False]


def test_bundle_over_task_limit_is_413(server: Server) -> None:
    tasks = [{"id": str(i), "embeddings": {"model": "emb", "input": "x"}} for i in range(9)]
    r = post(server, "/v1/bundle", {"tasks": tasks})
    assert r.status_code == 413
    assert r.json()["error"] == {"code": "request_too_large", "message": r.json()["error"]["message"], "limit": 8}


# -- contract mechanics ------------------------------------------------------------------------


def test_server_timing_and_meta(server: Server) -> None:
    # an input no other test sends: its row is not in the result cache, so it runs a forward
    r = post(server, "/v1/classify", {"model": "cls", "input": "timing and meta", "options": {"return_meta": True}})
    t = timing_of(r)
    assert tuple(t) == PHASES and t["total"] >= t["forward"] > 0
    meta = r.json()["meta"]
    assert meta["numerics"] == "exact" and meta["engine"] == "onnxruntime" and meta["device"] == "cpu"
    assert len(meta["model_sha256"]) == 64 and meta["dtype"] == "fp32"
    err = post(server, "/v1/classify", {"model": "cls"})
    assert err.status_code == 400 and set(timing_of(err)) == set(PHASES)


@pytest.mark.parametrize("case, status, code", [
    ({"model": "missing", "input": "x"}, 404, "model_not_found"),
    ({"model": "cls", "input": []}, 400, "invalid_request"),
    ({"model": "cls", "input": "x", "stream": True}, 400, "invalid_request"),
    ({"model": "cls", "input": "x", "options": {"deadline_ms": 0}}, 400, "invalid_request"),
    ({"input": "x"}, 400, "invalid_request"),
])
def test_request_errors(server: Server, case: dict[str, Any], status: int, code: str) -> None:
    r = post(server, "/v1/classify", case)
    assert r.status_code == status and r.json()["error"]["code"] == code
    if code == "model_not_found":
        assert "cls" in r.json()["error"]["message"]


def test_unsupported_surface_and_bad_json(server: Server) -> None:
    r = post(server, "/v1/rerank", {"model": "emb", "query": "q", "documents": ["d"]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_surface"
    bad = post(server, "/v1/embeddings", None, raw=b"{not json")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"


def test_compressed_bodies_and_encoding_errors(server: Server) -> None:
    body = orjson.dumps({"model": "emb", "input": "compressed"})
    plain = post(server, "/v1/embeddings", None, raw=body).json()["data"]
    for enc, data in (("gzip", gzip.compress(body)), ("x-gzip", gzip.compress(body)),
                      ("zstd", zstandard.ZstdCompressor().compress(body))):
        r = post(server, "/v1/embeddings", None, raw=data, headers={"content-encoding": enc})
        assert r.status_code == 200 and r.json()["data"] == plain
    two = post(server, "/v1/embeddings", None, raw=gzip.compress(gzip.compress(body)),
               headers={"content-encoding": "gzip, gzip"})
    assert two.status_code == 415 and two.json()["error"]["code"] == "unsupported_media_type"
    cut = post(server, "/v1/embeddings", None, raw=gzip.compress(body)[:-8], headers={"content-encoding": "gzip"})
    assert cut.status_code == 400 and cut.json()["error"]["reason"] == "encoding_malformed"
    bomb = gzip.compress(b" " * (4 * 1024 * 1024))
    big = post(server, "/v1/embeddings", None, raw=bomb, headers={"content-encoding": "gzip"})
    assert big.status_code == 413 and big.json()["error"]["limit"] == 1048576
    assert call(server, "GET", "/health").status_code == 200


def test_body_over_limit_with_and_without_content_length(server: Server) -> None:
    payload = orjson.dumps({"model": "emb", "input": "x" * (1024 * 1024 + 10)})
    r = post(server, "/v1/embeddings", None, raw=payload)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Any:
        for i in range(0, len(payload), 65536):
            yield payload[i:i + 65536]

    streamed = httpx.post(f"{server.url}/v1/embeddings", content=chunks(),
                          headers={"content-type": "application/json"}, timeout=30)
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "request_too_large"


def test_deadline_expired_work_is_never_run(server: Server) -> None:
    r = post(server, "/v1/classify", {"model": "cls", "input": ["a", "b"], "options": {"deadline_ms": 0.001}})
    assert r.status_code == 200
    assert [x["error"] for x in r.json()["results"]] == ["deadline_exceeded"] * 2


def test_overloaded_answers_429_with_retry_after(server: Server) -> None:
    texts = [" ".join(["load"] * 60)] * 16
    body = orjson.dumps({"model": "emb-q1", "input": texts})

    def one(_: int) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/embeddings", content=body,
                          headers={"content-type": "application/json"}, timeout=60)

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, range(24)))
    statuses = {r.status_code for r in responses}
    assert statuses <= {200, 429}
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "overloaded"
    assert 200 in statuses


def test_concurrent_answers_equal_sequential(server: Server) -> None:
    rng = np.random.default_rng(7)
    words = ["alpha", "beta", "gamma", "δέλτα", "東京", "🚀", "reset", "password", "x1"]
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 40, size=24)]
    requests = [("/v1/embeddings", {"model": "emb", "input": t, "encoding_format": "base64"}) for t in texts]
    requests += [("/v1/classify", {"model": "cls", "input": t}) for t in texts]
    requests += [("/v1/rerank", {"model": "rr", "query": texts[0], "documents": texts[:5]})]
    sequential = [post(server, p, b).json()["data" if "embeddings" in p else "results"] for p, b in requests]

    def one(i: int) -> Any:
        p, b = requests[i]
        r = httpx.post(f"{server.url}{p}", content=orjson.dumps(b), headers={"content-type": "application/json"})
        return r.json()["data" if "embeddings" in p else "results"]

    with ThreadPoolExecutor(12) as pool:
        concurrent = list(pool.map(one, range(len(requests))))
    assert concurrent == sequential


def test_metrics_parse_with_prometheus_parser(server: Server) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    post(server, "/v1/classify", {"model": "cls", "input": "x"})
    text = server.client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = families["edge_runtime_requests"]
    assert any(s.labels.get("endpoint") == "/v1/classify" and s.labels.get("status") == "200"
               for s in requests.samples)
    assert any(s.value == 1.0 for s in families["edge_runtime_ready"].samples)
    for name in ("edge_runtime_forward_duration_seconds", "edge_runtime_queue_duration_seconds",
                 "edge_runtime_batch_rows", "edge_runtime_batch_tokens", "edge_runtime_queue_depth",
                 "edge_runtime_model_info", "edge_runtime_request_duration_seconds"):
        assert name in families, name
