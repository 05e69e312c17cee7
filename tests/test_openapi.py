"""openapi.yaml: a sound OpenAPI 3.1 document whose schemas take the contract's examples and bodies.

The contract's request and response examples come from tests/contract_examples.py, which holds
them as the HTTP reference writes them; where the reference is on this machine, a test checks them
against it. Response samples follow the wire shapes of docs/architecture.md.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from jsonschema import Draft202012Validator

from edge_runtime import API_VERSION
from edge_runtime.api.schema import (
    OPENAPI_PATH,
    load_openapi,
    openapi_bytes,
    request_validator,
    resolve,
    response_validator,
    schema_validator,
    validate_response,
)
from tests.support.contract_examples import (
    BUNDLE_EXAMPLE,
    CLASSIFY_EXAMPLE,
    DECISIONS_EXAMPLE_1,
    DECISIONS_EXAMPLE_2,
    DECISIONS_EXAMPLE_BATCH,
    DECISIONS_RESPONSE_1,
    DECISIONS_RESPONSE_2,
    EMBEDDINGS_EXAMPLE,
    RERANK_EXAMPLE,
    SYSTEMONE_EXAMPLE_ASSETS,
    SYSTEMONE_EXAMPLE_MEDIA,
)
from tests.support.server_harness import ROOT

# The contract as the team received it, copied into the repository so the check runs everywhere.
REFERENCE = ROOT / "docs" / "reference" / "http-api-reference.txt"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
SHA = "ab" * 32

# ---- the document ------------------------------------------------------------------------------


def _walk(node: Any, where: str = "#") -> Iterator[tuple[str, Any]]:
    yield where, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}/{i}")


def test_document_basics() -> None:
    doc = load_openapi()
    assert doc["openapi"] == "3.1.0"
    assert doc["info"]["version"] == API_VERSION == "5.0.0"
    assert doc["info"]["title"]
    assert doc["jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema"
    assert openapi_bytes() == OPENAPI_PATH.read_bytes()
    assert load_openapi() is doc  # parsed once
    # YAML turns unquoted true/false/404 keys into booleans and ints: every key must stay a string.
    for where, node in _walk(doc):
        if isinstance(node, dict):
            bad = [k for k in node if not isinstance(k, str)]
            assert not bad, f"{where} has non-string keys {bad}"
    json.dumps(doc)  # plain JSON data throughout


def test_operations_are_well_formed() -> None:
    doc = load_openapi()
    ids: list[str] = []
    for path, item in doc["paths"].items():
        assert path.startswith("/")
        for method, operation in item.items():
            assert method in METHODS, f"{path}: {method}"
            ids.append(operation["operationId"])
            assert operation["summary"]
            assert operation["responses"], f"{method} {path} has no responses"
            for status, response in operation["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d|[1-5]XX|default", status), status
                response = resolve(response["$ref"]) if "$ref" in response else response
                assert response["description"]
                for media, content in response.get("content", {}).items():
                    assert "schema" in content, f"{method} {path} {status} {media}"
            if "requestBody" in operation:
                body = operation["requestBody"]
                body = resolve(body["$ref"]) if "$ref" in body else body
                assert body["content"]
            for parameter in operation.get("parameters", []):
                parameter = resolve(parameter["$ref"]) if "$ref" in parameter else parameter
                assert parameter["in"] in ("header", "query", "path", "cookie") and parameter["name"]
    assert len(ids) == len(set(ids)), "operationIds must be unique"


def test_every_schema_is_valid_draft_2020_12() -> None:
    doc = load_openapi()
    for schema in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(schema)
    for where, node in _walk(doc["paths"]):
        if where.endswith("/schema"):
            Draft202012Validator.check_schema(node)


def test_every_ref_resolves() -> None:
    refs = [(where, node["$ref"]) for where, node in _walk(load_openapi()) if isinstance(node, dict) and "$ref" in node]
    assert len(refs) > 100
    for where, ref in refs:
        assert ref.startswith("#/"), f"{where}: {ref} leaves the document"
        resolve(ref)  # raises KeyError when it points at nothing
    with pytest.raises(KeyError):
        resolve("#/components/schemas/NoSuchSchema")


def test_every_schema_is_used() -> None:
    doc = load_openapi()
    text = json.dumps(doc["paths"]) + json.dumps(doc["components"])
    unused = [n for n in doc["components"]["schemas"] if f'"#/components/schemas/{n}"' not in text]
    assert unused == []


CONTRACT_ENDPOINTS = [
    ("post", "/v1/decisions"),
    ("post", "/v1/systemone"),
    ("post", "/v1/systemone/batch"),
    ("post", "/v1/classify"),
    ("post", "/v1/embeddings"),
    ("post", "/v1/rerank"),
    ("post", "/v1/bundle"),
    ("get", "/v1/models"),
    ("get", "/health"),
    ("get", "/health/live"),
    ("get", "/metrics"),
    ("get", "/openapi.yaml"),
]


def test_every_endpoint_of_the_contract_is_described() -> None:
    paths = load_openapi()["paths"]
    described = {(m, p) for p, item in paths.items() for m in item}
    assert described == set(CONTRACT_ENDPOINTS)


SURFACE_STATUSES = {"200", "400", "401", "404", "413", "415", "422", "429", "500", "503"}


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/classify", "/v1/embeddings", "/v1/rerank"])
def test_surface_statuses(path: str) -> None:
    operation = load_openapi()["paths"][path]["post"]
    assert set(operation["responses"]) == SURFACE_STATUSES
    assert "Server-Timing" in operation["responses"]["200"]["headers"]
    for status in ("429", "503"):
        response = resolve(operation["responses"][status]["$ref"])
        assert "Retry-After" in response["headers"]
    assert any(p.get("$ref", "").endswith("/ContentEncoding") for p in operation["parameters"])


def test_system_one_statuses() -> None:
    paths = load_openapi()["paths"]
    assert set(paths["/v1/systemone"]["post"]["responses"]) == SURFACE_STATUSES | {"504", "529"}
    assert {"529", "429"} <= set(paths["/v1/systemone/batch"]["post"]["responses"])
    assert set(paths["/v1/bundle"]["post"]["responses"]) == {"200", "400", "401", "413", "415", "500"}
    assert set(paths["/health"]["get"]["responses"]) == {"200", "503"}
    assert set(paths["/health/live"]["get"]["responses"]) == {"200", "503"}


def test_multipart_is_described_for_decisions() -> None:
    for path in ("/v1/decisions", "/v1/systemone"):
        body = load_openapi()["paths"][path]["post"]["requestBody"]
        content = resolve(body["$ref"])["content"]
        assert {"application/json", "multipart/form-data"} <= set(content)
        assert content["multipart/form-data"]["encoding"]["request"]["contentType"] == "application/json"


def test_unknown_operations_and_statuses_are_key_errors() -> None:
    with pytest.raises(KeyError):
        response_validator("/v1/nothing", "post", 200)
    with pytest.raises(KeyError):
        response_validator("/v1/classify", "post", 418)
    with pytest.raises(KeyError):
        response_validator("/metrics", "get", 200)  # text, not JSON


# ---- the contract's examples --------------------------------------------------------------------

# (endpoint, request) in the order the reference gives them.
REQUEST_EXAMPLES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/classify", CLASSIFY_EXAMPLE),
    ("/v1/embeddings", EMBEDDINGS_EXAMPLE),
    ("/v1/rerank", RERANK_EXAMPLE),
    ("/v1/bundle", BUNDLE_EXAMPLE),
    ("/v1/decisions", DECISIONS_EXAMPLE_1),
    ("/v1/decisions", DECISIONS_EXAMPLE_2),
    ("/v1/decisions", DECISIONS_EXAMPLE_BATCH),
    ("/v1/systemone", SYSTEMONE_EXAMPLE_MEDIA),
    ("/v1/systemone", SYSTEMONE_EXAMPLE_ASSETS),
]
RESPONSE_EXAMPLES = [DECISIONS_RESPONSE_1, DECISIONS_RESPONSE_2]


def _reference_examples(text: str) -> tuple[list[tuple[str, Any]], list[Any]]:
    """The JSON after each `POST /v1/...` line and each `Response` line of the reference."""
    decoder = json.JSONDecoder()
    requests, responses = [], []
    for match in re.finditer(r"^(?:POST (/v1/\S+)|Response)\n", text, re.M):
        value, _ = decoder.raw_decode(text, match.end())
        if match.group(1):
            requests.append((match.group(1), value))
        else:
            responses.append(value)
    return requests, responses


def test_the_copied_examples_are_the_reference_examples() -> None:
    requests, responses = _reference_examples(REFERENCE.read_text(encoding="utf-8"))
    assert requests == REQUEST_EXAMPLES
    assert responses == RESPONSE_EXAMPLES


def _ids(cases: list[tuple[str, Any]]) -> list[str]:
    return [f"{path}-{i}" for i, (path, _) in enumerate(cases)]


@pytest.mark.parametrize("path,example", REQUEST_EXAMPLES, ids=_ids(REQUEST_EXAMPLES))
def test_contract_request_examples_validate(path: str, example: dict[str, Any]) -> None:
    request_validator(path).validate(example)


def test_decision_requests_are_system_one_batch_entries_and_bundle_tasks() -> None:
    batch = {"requests": {"a": DECISIONS_EXAMPLE_1, "b": SYSTEMONE_EXAMPLE_ASSETS}}
    request_validator("/v1/systemone/batch").validate(batch)
    bundle = {"tasks": [{"id": "d", "decisions": DECISIONS_EXAMPLE_2}, {"id": "e", "embeddings": EMBEDDINGS_EXAMPLE},
                        {"id": "r", "rerank": RERANK_EXAMPLE}]}
    request_validator("/v1/bundle").validate(bundle)


@pytest.mark.parametrize("response", RESPONSE_EXAMPLES)
def test_contract_response_examples_validate(response: dict[str, Any]) -> None:
    # The reference leaves usage out of its examples ("numbers are rounded; usage is not
    # compared"); a real response always carries it.
    body = {**response, "usage": {"input_tokens": 57, "output_tokens": 0}}
    validate_response("/v1/decisions", "post", 200, body)
    validate_response("/v1/systemone", "post", 200, body)
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/v1/decisions", "post", 200, response)


def _with(base: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `base` with the member at `path` set (or removed, for ...)."""
    out = copy.deepcopy(base)
    node: Any = out
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


BAD_REQUESTS = [
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("stream",), True)),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("input",), [])),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("input",), [{"text": "a"}])),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("input",), [{"text": "a", "text_pair": "b", "x": 1}])),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("options", "overflow"), "cut")),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("options", "window", "overlap"), -1)),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("options", "deadline_ms"), 0)),
    ("/v1/classify", _with(CLASSIFY_EXAMPLE, ("input",), ...)),
    ("/v1/embeddings", _with(EMBEDDINGS_EXAMPLE, ("encoding_format",), "int8")),
    ("/v1/embeddings", _with(EMBEDDINGS_EXAMPLE, ("options",), {"overflow": "window"})),
    ("/v1/embeddings", _with(EMBEDDINGS_EXAMPLE, ("dimensions",), 0)),
    ("/v1/rerank", _with(RERANK_EXAMPLE, ("documents",), [])),
    ("/v1/rerank", _with(RERANK_EXAMPLE, ("top_n",), 1.5)),
    ("/v1/bundle", _with(BUNDLE_EXAMPLE, ("tasks", 0, "rerank"), RERANK_EXAMPLE)),  # two surfaces
    ("/v1/bundle", _with(BUNDLE_EXAMPLE, ("tasks",), [])),
    ("/v1/bundle", _with(BUNDLE_EXAMPLE, ("tasks", 0, "id"), "")),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("states",), DECISIONS_EXAMPLE_BATCH["states"])),  # mixed forms
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_BATCH, ("images",), ["data:image/png;base64,AAAA"])),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions",), {})),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("state",), 42)),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("temperature",), 0.5)),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("options",), {"stream": True})),
    # both option forms at once
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "domain", "criteria"), {"a": "x", "b": "y"})),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "domain", "choices"), [{"key": "only"}])),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "difficulty", "levels"), [str(i) for i in range(11)])),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "difficulty", "choices"), [{"key": "a"}, {"key": "b"}])),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "reasoning", "criteria"), {"maybe": "x"})),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "reasoning", "type"), "colour")),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_1, ("questions", "reasoning", "instructions"), "   ")),
    ("/v1/decisions", _with(DECISIONS_EXAMPLE_2, ("questions", "problems", "threshold"), 1.5)),
    ("/v1/systemone", _with(SYSTEMONE_EXAMPLE_ASSETS, ("roles",), None)),  # roles is the internal form's
    ("/v1/systemone", _with(SYSTEMONE_EXAMPLE_ASSETS, ("assets", "<receipt>", "url"), "http://x")),
    ("/v1/systemone", _with(SYSTEMONE_EXAMPLE_MEDIA, ("images",), ["http://example.com/a.png"])),
]


@pytest.mark.parametrize("path,body", BAD_REQUESTS, ids=_ids(BAD_REQUESTS))
def test_requests_outside_the_contract_do_not_validate(path: str, body: dict[str, Any]) -> None:
    assert not request_validator(path).is_valid(body)


def test_question_forms() -> None:
    question = schema_validator("Question")
    good = [
        {"type": "choice", "criteria": {"a": None, "b": {"what": "structured"}}},
        {"type": "noul", "criteria": {"true": "It rains"}},
        {"type": "noul", "choices": [{"key": "false", "description": "dry"}, {"key": "true"}]},
        {"type": "score", "criteria": ["low", "mid", "high"]},
        {"type": "set", "criteria": {"billing": "A charge problem"}, "threshold": 0.4},
        {"type": "span", "instructions": "PII", "labels": [{"key": "EMAIL"}], "preset": "pii"},
        {"type": "box", "instructions": "the total", "at": 4.5},
        {"type": "track", "instructions": "the car", "rate": 2},
        {"type": "choice", "preset": "domain"},
    ]
    for q in good:
        question.validate(q)
    bad = [
        {"type": "noul"},  # neither instructions nor criteria
        {"type": "box", "instructions": "x", "criteria": {"a": "b"}},
        {"type": "track", "instructions": "x", "rate": 3},
        {"type": "score", "criteria": {"0": "low", "1": "high"}},  # the pre-0.6 map form
        {"type": "choice", "criteria": {"a": "", "b": "x"}},  # an empty description
        {"instructions": "no type"},
    ]
    for q in bad:
        assert not question.is_valid(q), q


# ---- response bodies in the wire shapes of docs/architecture.md ----------------------------------

META = {
    "model": "cls", "revision": "r1", "model_sha256": SHA, "dtype": "float32", "numerics": "exact",
    "engine": "onnxruntime", "device": "cpu", "variant": "fp32",
    "timings": {"parse": 0.02, "tokenize": 0.15, "queue": 0.0, "forward": 4.8, "post": 0.03,
                "serialize": 0.02, "total": 5.1},
}
ITEM_ERROR = {"code": "max_length_exceeded", "message": "the input has 700 tokens; its budget is 512"}  # the old shape
BOX = {"top": 0.13, "left": 0.25, "bottom": 0.23, "right": 0.35}
REPRESENTATION = {"model_sha256": SHA, "layer": 6, "dimension": 3, "normalized": True, "modality": "text"}
ENGINE_ARGS = {"threads": 1, "inter_op_threads": 1, "graph_optimization_level": "ORT_ENABLE_ALL",
               "providers": ["CPUExecutionProvider"], "max_queue": 256}
MISSING = {"loc": ["body", "questions", "q", "score", "criteria"], "msg": "Field required", "type": "missing"}

INPUT = {"tokens": 12, "processed_tokens": 12, "truncated": False}
FAILED_ITEM = {"error": "max_length_exceeded", "message": "the input has 600 tokens, more than the budget of 512"}
CLASSIFY_RESPONSES = [
    {"model": "cls", "head": "default", "kind": "sequence", "labels": ["math", "other"],
     "results": [{"index": 0, "label": "math", "probabilities": [0.9, 0.1], "input": INPUT},
                 {"index": 1, **FAILED_ITEM}],
     "usage": {"input_tokens": 12}, "meta": META},
    {"model": "ml", "head": "default", "kind": "scores", "labels": ["toxic", "insult"], "thresholds": [0.5, 0.5],
     "results": [{"index": 0, "scores": [0.8, 0.1], "selected": ["toxic"],
                  "windows": [{"start": 0, "end": 510, "scores": [0.8, 0.1]},
                              {"start": 446, "end": 956, "scores": [0.2, 0.05]}],
                  "input": {"tokens": 958, "processed_tokens": 958, "truncated": False, "windows": 2}}],
     "usage": {"input_tokens": 958}},
    {"model": "vela-pii", "head": "default", "kind": "token", "labels": ["O", "B-EMAIL", "I-EMAIL"],
     "results": [{"index": 0, "spans": [
         {"label": "EMAIL_ADDRESS", "start": 19, "end": 40, "text": "tom.baker@example.com", "probability": 0.97}],
         "windows": [{"start": 0, "end": 15}], "input": {**INPUT, "tokens": 17, "processed_tokens": 17, "windows": 1}}],
     "usage": {"input_tokens": 17}},
]
EMBEDDINGS_RESPONSES = [
    {"object": "list", "model": "emb", "data": [
        {"object": "embedding", "index": 0, "embedding": [0.1, -0.2, 0.3], "input": INPUT},
        {"object": "embedding", "index": 1, "embedding": None, **FAILED_ITEM}],
     "usage": {"prompt_tokens": 12, "total_tokens": 12},
     "meta": {**META, "representation": REPRESENTATION}},
    {"object": "list", "model": "emb", "data": [{"object": "embedding", "index": 0, "embedding": "zczMPc3MTL4=",
                                                 "input": {"tokens": 16, "processed_tokens": 8, "truncated": True,
                                                           "tokens_lower_bound": True}}],
     "usage": {"prompt_tokens": 16, "total_tokens": 16, "tokens_lower_bound": True}},
]
RERANK_RESPONSE = {
    "model": "rr",
    "results": [{"index": 0, "relevance_score": 0.93, "logit": 2.59,
                 "document": {"text": "Open Settings, then Security."}, "input": INPUT},
                {"index": 1, "relevance_score": 0.02, "logit": -3.89, "input": INPUT},
                {"index": 2, "relevance_score": None, **FAILED_ITEM}],
    "usage": {"input_tokens": 24}, "meta": META,
}
DECISION_RESPONSES = [
    {"model": "d", "answers": {"q": {"type": "noul", "noul": 0.5},
                               "bad": {"type": "set", "error": "invalid_question", "reason": "question_malformed",
                                       "message": "set questions do not take ['colour']"},
                               "odd": {"type": None, "error": "invalid_question", "reason": "question_malformed",
                                       "message": "type must be one of [...]"},
                               "where": {"type": "box", "box": BOX, "confidence": None, "time": 4.5},
                               "path": {"type": "track", "track": [{"time": 0.0, "box": BOX, "confidence": 0.9,
                                                                     "visible": 0.98}]}},
     "usage": {"input_tokens": 30, "output_tokens": 0}, "meta": {**META, "model": "d"}},
    {"model": "d", "states": {
        "doc_1": {"model": "d", "answers": {"relevance": {"type": "noul", "noul": 0.91}},
                  "usage": {"input_tokens": 20, "output_tokens": 0}},
        "doc_2": {"model": "d", "answers": {"relevance": {"type": "noul", "error": "invalid_input",
                                                          "reason": "input_malformed",
                                                          "message": "images are refused"}},
                  "usage": {"input_tokens": 0, "output_tokens": 0}}},
     "usage": {"input_tokens": 20, "output_tokens": 0}},
]
MODELS_RESPONSE = {
    "object": "list", "api_version": "5.0.0",
    "data": [
        {"id": "emb", "object": "model", "family": "encoder", "kind": "embedding", "surfaces": ["embeddings"],
         "description": "MiniLM", "version": "1.0.0", "release_date": "2021-08-30", "revision": "r1",
         "model_sha256": SHA, "ready": True,
         "embedding": {"dimensions": [384, 128], "layers": [3, 6], "pooling": "mean", "normalized": True,
                       "modalities": ["text"], "input_types": []},
         "limits": {"max_input_tokens": 256}, "device": "cpu", "variant": "fp32", "dtype": "float32",
         "engine": "onnxruntime", "engine_args": {**ENGINE_ARGS, "grouping": "padded"},
         "numerics": "exact", "status": "ready", "self_check": {"status": "passed", "max_abs_diff": 0.0, "cases": 2}},
        {"id": "ml", "object": "model", "family": "encoder", "kind": "multi-label", "surfaces": ["classify"],
         "heads": [{"name": "default", "kind": "scores", "labels": ["toxic"], "inputs": ["text", "pair"],
                    "thresholds": [0.5], "overflow": "reject", "window": {"tokens": 512, "overlap": 0}}],
         "limits": {"max_input_tokens": 512, "truncate_tokens": 128, "max_inputs": 2048},
         "status": "warming", "ready": False, "engine_args": {**ENGINE_ARGS, "threads": 2, "grouping": None},
         "numerics": None, "self_check": {"status": "unverified"}},
        {"id": "rr", "object": "model", "family": "encoder", "kind": "rerank", "surfaces": ["rerank"],
         "rerank": {"default": {"layer": 6, "dimension": 384}, "exits": [{"layer": 6, "dimension": 384}]},
         "status": "ready", "ready": True, "self_check": {"status": "unverified"}},
        {"id": "bad", "object": "model", "status": "failed", "ready": False, "reason": "MANIFEST.json: digest mismatch",
         "self_check": {"status": "failed", "reason": "not loaded"}},
    ],
    "models": [{"name": "sparrow", "description": "A decision model", "release_date": "2026-01-15"}],
    "limits": {"max_bundle_tasks": 64, "max_request_bytes": 8388608, "max_inputs": 2048},
}


@pytest.mark.parametrize("body", CLASSIFY_RESPONSES)
def test_classify_responses(body: dict[str, Any]) -> None:
    validate_response("/v1/classify", "post", 200, body)


@pytest.mark.parametrize("body", EMBEDDINGS_RESPONSES)
def test_embeddings_responses(body: dict[str, Any]) -> None:
    validate_response("/v1/embeddings", "post", 200, body)


def test_rerank_response() -> None:
    validate_response("/v1/rerank", "post", 200, RERANK_RESPONSE)


@pytest.mark.parametrize("body", DECISION_RESPONSES)
def test_decision_responses(body: dict[str, Any]) -> None:
    validate_response("/v1/decisions", "POST", 200, body)


def test_system_one_responses_have_no_failed_answers() -> None:
    ok = {"model": "d", "answers": {"q": {"type": "choice", "choice": "a", "confidence": 0.5,
                                          "probabilities": {"a": 0.75, "b": 0.25}, "x_label_mass": 0.99}},
          "usage": {"input_tokens": 3, "output_tokens": 0}}
    validate_response("/v1/systemone", "post", 200, ok)
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/v1/systemone", "post", 200, DECISION_RESPONSES[0])
    failed = {"status": 422, "detail": [MISSING], "code": "invalid_request", "question": "q",
              "reason": "question_malformed"}
    batch = {"responses": {"a": ok, "b": failed}}
    validate_response("/v1/systemone/batch", "post", 200, batch)


def test_system_one_errors_in_both_schemas() -> None:
    five = {"detail": [MISSING], "code": "question_failed", "question": "q", "reason": "question_malformed"}
    validate_response("/v1/systemone", "post", 422, five)
    validate_response("/v1/systemone", "post", 529, {"detail": {"error_type": "overloaded", "message": "busy"},
                                                     "code": "overloaded"})
    four = {"error": {"code": "question_failed", "question_error": "max_length_exceeded", "reason": "question_tokens",
                      "question": "q", "message": "q: the question has 40000 tokens"},
            "detail": {"error_type": "invalid_request_error", "message": "q: the question has 40000 tokens"},
            "code": "question_failed", "question": "q", "reason": "question_tokens", "limit": 32768}
    validate_response("/v1/systemone", "post", 400, four)
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/v1/systemone", "post", 400, {"message": "neither detail nor error"})


def test_bundle_response() -> None:
    body = {"results": [
        {"id": "domain", "status": 200, "classify": CLASSIFY_RESPONSES[0]},
        {"id": "e", "status": 200, "embeddings": EMBEDDINGS_RESPONSES[1]},
        {"id": "r", "status": 200, "rerank": RERANK_RESPONSE},
        {"id": "kind", "status": 200, "decisions": DECISION_RESPONSES[1]},
        {"id": "gone", "status": 404, "error": {"code": "model_not_found", "message": "served models: ['cls']"}},
        {"id": "none", "status": 400, "error": {"code": "invalid_request", "message": "no question is valid",
                                                 "reason": "question_malformed", "question": "q"}},
    ]}
    validate_response("/v1/bundle", "post", 200, body)
    for bad in (
        {"id": "x", "status": 200, "error": {"code": "internal_error", "message": "m"}},
        {"id": "x", "status": 500, "classify": CLASSIFY_RESPONSES[0]},
        {"id": "x", "status": 200, "classify": CLASSIFY_RESPONSES[0], "rerank": RERANK_RESPONSE},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate_response("/v1/bundle", "post", 200, {"results": [bad]})


def test_models_health_and_liveness() -> None:
    validate_response("/v1/models", "get", 200, MODELS_RESPONSE)
    ready = {"api_version": "5.0.0", "status": "ready", "models": {"emb": {"status": "ready"}}}
    validate_response("/health", "get", 200, ready)
    degraded = {"api_version": "5.0.0", "status": "degraded", "reason": "bad: failed",
                "models": {"emb": {"status": "ready"}, "bad": {"status": "failed", "reason": "digest"}}}
    validate_response("/health", "get", 503, degraded)
    validate_response("/health/live", "get", 200, {"api_version": "5.0.0", "status": "alive"})
    validate_response("/health/live", "get", 503, {"api_version": "5.0.0", "status": "stalled", "reason": "emb: 31 s"})
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/health", "get", 200, degraded)
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/health", "get", 503, ready)
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/health/live", "get", 503, {"api_version": "5.0.0", "status": "stalled"})


ERRORS_BY_STATUS = {
    400: "invalid_request", 404: "model_not_found", 413: "request_too_large", 415: "unsupported_media_type",
    422: "unsupported_surface", 429: "overloaded", 500: "internal_error", 503: "not_ready",
}


@pytest.mark.parametrize("status,code", sorted(ERRORS_BY_STATUS.items()))
def test_each_error_status_has_its_code(status: int, code: str) -> None:
    body: dict[str, Any] = {"error": {"code": code, "message": "why"}}
    if status == 413:
        body["error"]["limit"] = 8388608
    for path in ("/v1/classify", "/v1/embeddings", "/v1/rerank", "/v1/decisions"):
        validate_response(path, "post", status, body)
    other = "overloaded" if code != "overloaded" else "not_ready"
    with pytest.raises(jsonschema.ValidationError):
        validate_response("/v1/classify", "post", status, {"error": {**body["error"], "code": other}})


def test_body_errors_carry_reason_and_limit() -> None:
    truncated = {"code": "invalid_request", "message": "the gzip body is truncated", "reason": "encoding_malformed"}
    validate_response("/v1/decisions", "post", 400, {"error": truncated})
    validate_response("/v1/bundle", "post", 415, {"error": {"code": "unsupported_media_type", "message": "m",
                                                            "reason": "zstd_window_too_large", "limit": 8388608}})
    with pytest.raises(jsonschema.ValidationError):  # a 413 says which limit
        validate_response("/v1/classify", "post", 413, {"error": {"code": "request_too_large", "message": "m"}})
    with pytest.raises(jsonschema.ValidationError):  # reasons are fixed words
        validate_response("/v1/classify", "post", 400, {"error": {"code": "invalid_request", "message": "m",
                                                                  "reason": "Video longer than 300 s"}})


BAD_RESPONSES = [
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("usage",), ...)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("extra",), 1)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("results", 0, "probabilities", 0), 1.5)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("results", 0, "probabilities"), {"math": 0.9, "other": 0.1})),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("results", 0, "input"), ...)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("results", 1, "error"), "overloaded")),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("results", 1, "error"), ITEM_ERROR)),  # an object, not a code
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("kind",), "multi-label")),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[1], ("results", 0, "windows"), 2)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("meta", "numerics"), "fast")),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("meta", "timings", "forward"), ...)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[0], ("meta", "representation"), REPRESENTATION)),
    ("/v1/classify", _with(CLASSIFY_RESPONSES[2], ("results", 0, "spans", 0, "start"), -1)),
    ("/v1/embeddings", _with(EMBEDDINGS_RESPONSES[0], ("object",), "embeddings")),
    ("/v1/embeddings", _with(EMBEDDINGS_RESPONSES[0], ("data", 1, "embedding"), [0.1])),  # an error with a vector
    ("/v1/embeddings", _with(EMBEDDINGS_RESPONSES[0], ("meta", "representation"), ...)),
    ("/v1/embeddings", _with(EMBEDDINGS_RESPONSES[1], ("usage", "total_tokens"), 1.0)),
    ("/v1/rerank", _with(RERANK_RESPONSE, ("results", 1, "relevance_score"), ...)),
    ("/v1/rerank", _with(RERANK_RESPONSE, ("results", 1, "logit"), ...)),
    ("/v1/rerank", _with(RERANK_RESPONSE, ("results", 0, "document"), "Open Settings")),
    ("/v1/decisions", _with(DECISION_RESPONSES[0], ("answers", "q", "confidence"), 0.5)),  # a Noul has none
    ("/v1/decisions", _with(DECISION_RESPONSES[0], ("answers", "bad", "reason"), ...)),
    ("/v1/decisions", _with(DECISION_RESPONSES[0], ("usage", "output_tokens"), ...)),
    ("/v1/decisions", _with(DECISION_RESPONSES[0], ("states",), DECISION_RESPONSES[1]["states"])),
    ("/v1/decisions", _with(DECISION_RESPONSES[0], ("answers", "where", "box", "top"), 1.2)),
    ("/v1/decisions", _with(DECISION_RESPONSES[1], ("answers",), {})),
    ("/v1/models", _with(MODELS_RESPONSE, ("api_version",), "4.0.0")),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 0, "status"), "starting")),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 0, "ready"), ...)),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 0, "embedding", "dimensions"), 384)),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 1, "heads", 0, "kind"), "multi-label")),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 0, "engine_args", "grouping"), "batched")),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 0, "model_sha256"), "xyz")),
    ("/v1/models", _with(MODELS_RESPONSE, ("models", 0, "release_date"), "15 Jan 2026")),
    ("/v1/models", _with(MODELS_RESPONSE, ("limits", "max_request_bytes"), ...)),
    ("/v1/models", _with(MODELS_RESPONSE, ("data", 2, "self_check"), ...)),
]


@pytest.mark.parametrize("path,body", BAD_RESPONSES, ids=_ids(BAD_RESPONSES))
def test_responses_outside_the_contract_do_not_validate(path: str, body: dict[str, Any]) -> None:
    method = "get" if path == "/v1/models" else "post"
    with pytest.raises(jsonschema.ValidationError):
        validate_response(path, method, 200, body)


def test_score_and_choice_answers() -> None:
    answer = schema_validator("Answer")
    score = DECISIONS_RESPONSE_1["answers"]["difficulty"]
    answer.validate(score)
    assert not answer.is_valid({**score, "legend": {"0": None}})  # legend values are text, never null
    assert not answer.is_valid({**score, "probabilities": {"ten": 0.5}})
    choice = DECISIONS_RESPONSE_1["answers"]["domain"]
    assert not answer.is_valid({k: v for k, v in choice.items() if k != "confidence"})
    assert not answer.is_valid({**choice, "type": "Choice"})
