"""Schemathesis fuzzing of every operation of GET /openapi.yaml against a real server.

Each generated request goes to a server over every encoder fixture, an int8 embedder and the
sparrow-nano decisions model. Every answer must be below 500 and valid for its operation and
status in the contract (edge_runtime.api.schema.validate_response, and schemathesis's status code,
content type, header and body checks). A body whose Content-Encoding header says gzip or zstd is
sent compressed that way, so the decoders see real streams rather than plain JSON mislabelled.

The normal run sends about 160 requests (derandomized, so it is repeatable); the heavy run over
1,100 with fresh randomness. The document is only biased for generation: ``model`` is required and
drawn from served names (one of them serving another surface, for 422), and request integers stay
inside 64 bits (the out-of-range refusal has its own test in test_hostile_bodies). Responses are
validated against the contract exactly as served.

The tests at the end pin contract gaps the fuzzing found (multipart bodies, bundle options), now fixed.
"""

from __future__ import annotations

import copy
import gzip
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import requests
import schemathesis
import yaml
import zstandard
from hypothesis import HealthCheck, Phase, given, reject, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from edge_runtime.api.schema import load_openapi, request_validator, validate_response
from tests.reliability.support import StartServer, checked, encoder_entries
from tests.support.server_harness import Server

NORMAL_EXAMPLES = 11  # per operation and mode: 7 POST x 2 modes x 11 + 5 GET = 159 requests
HEAVY_EXAMPLES = 80  # 7 x 2 x 80 + 5 = 1,125 requests
# Per request schema, the names `model` is drawn from; the last serves another surface (422).
SURFACE_MODELS = {
    "ClassifyRequest": ["cls", "ml", "tok", "emb"],
    "EmbeddingsRequest": ["emb", "emb8", "rr"],
    "RerankRequest": ["rr", "cls"],
    "DecisionRequestFields": ["sparrow", "emb"],
}
INT64_MAX = 2**63 - 1
_HTTP_METHODS = ("get", "post", "put", "patch", "delete")
_REQUEST_ARGS = ("method", "url", "headers", "files", "data", "params", "cookies", "json")
_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance]


def _operations() -> list[tuple[str, str, bool]]:
    """(method, path, takes input) for every operation of the contract."""
    out = []
    for path, item in load_openapi()["paths"].items():
        for method, operation in item.items():
            if method in _HTTP_METHODS:
                out.append((method, path, bool(operation.get("parameters") or operation.get("requestBody"))))
    return out


def _cases() -> list[Any]:
    """Every operation in positive mode; those that take input in negative mode as well."""
    cases = []
    for method, path, takes_input in _operations():
        for mode in ("positive", "negative") if takes_input else ("positive",):
            cases.append(pytest.param(method, path, mode, id=f"{method}:{path}:{mode}"))
    return cases


# ---- the generation document -------------------------------------------------------------------


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _request_schema_names(doc: dict[str, Any]) -> set[str]:
    """Names of components/schemas reachable from any operation's parameters or request body."""
    components = doc["components"]
    pending: list[Any] = []
    for item in doc["paths"].values():
        for method, operation in item.items():
            if method in _HTTP_METHODS:
                pending += [operation.get("parameters", []), operation.get("requestBody", {})]
    seen: set[str] = set()
    while pending:
        for node in _walk(pending.pop()):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                section, name = ref.split("/")[2:4]
                key = f"{section}/{name}"
                if key not in seen:
                    seen.add(key)
                    pending.append(components[section][name])
    return {key.split("/", 1)[1] for key in seen if key.startswith("schemas/")}


def generation_document(contract: dict[str, Any]) -> dict[str, Any]:
    """The contract, biased for generation: served model names, required; 64-bit request integers."""
    doc = copy.deepcopy(contract)
    schemas = doc["components"]["schemas"]
    for name, models in SURFACE_MODELS.items():
        schemas[name]["properties"]["model"] = {"enum": models}
        schemas[name]["required"] = sorted({*schemas[name].get("required", []), "model"})
    for name in _request_schema_names(doc):
        for node in _walk(schemas[name]):
            types = node.get("type")
            if (types == "integer" or (isinstance(types, list) and "integer" in types)) and "maximum" not in node:
                node["maximum"] = INT64_MAX
                if node.get("minimum", 0) < -INT64_MAX:
                    node["minimum"] = -INT64_MAX
    return doc


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_server(start_server: StartServer, fixture_package: Callable[..., Path], sparrow_package: Path) -> Server:
    """Every encoder kind, an int8 embedder and sparrow-nano, with small limits so 413 is reachable."""
    models = encoder_entries(fixture_package)
    models.append({"name": "emb8", "package": str(fixture_package("embedding", quantize=True)),
                   "variant": "int8", "device": "cpu", "threads": 1})
    models.append({"name": "sparrow", "package": str(sparrow_package), "device": "cpu", "threads": 1})
    return start_server(models, "--max-request-bytes", "1048576", "--max-bundle-tasks", "8")


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_server: Server) -> Any:
    """The schemathesis schema of the document the server serves, biased for generation."""
    served = fuzz_server.client.get("/openapi.yaml")
    assert served.status_code == 200
    return schemathesis.openapi.from_dict(generation_document(yaml.safe_load(served.content)))


# ---- one exchange ------------------------------------------------------------------------------


def send(session: requests.Session, case: Any, base_url: str) -> tuple[requests.Response, bytes]:
    """Send a generated case, compressing its body as its Content-Encoding header says."""
    kwargs = case.as_transport_kwargs(base_url=base_url)
    try:
        prepared = requests.Request(**{k: kwargs[k] for k in _REQUEST_ARGS if k in kwargs}).prepare()
    except (requests.exceptions.InvalidHeader, UnicodeEncodeError, ValueError):
        reject()  # a request no HTTP client could send is no test of the server
    body = prepared.body.encode() if isinstance(prepared.body, str) else (prepared.body or b"")
    coding = str(prepared.headers.get("Content-Encoding", "")).strip().lower()
    if body and coding in ("gzip", "x-gzip"):
        prepared.body = gzip.compress(body)
    elif body and coding == "zstd":
        prepared.body = zstandard.ZstdCompressor().compress(body)
    if prepared.body is not None:
        prepared.headers["Content-Length"] = str(len(prepared.body))
    try:
        return session.send(prepared, timeout=60), body
    except requests.exceptions.RequestException as exc:  # the server hung up, hung or died
        raise AssertionError(f"{prepared.method} {prepared.url} {dict(prepared.headers)}\n"
                             f"body (before any Content-Encoding): {body[:3000]!r}\n"
                             f"no answer: {type(exc).__name__}: {exc}") from exc


def contract_problems(case: Any, response: requests.Response, path: str, method: str) -> list[str]:
    """What is wrong with an answer: a 5xx, a body invalid for its status, a header or type mismatch."""
    problems = []
    if response.status_code >= 500:
        problems.append(f"server error {response.status_code}")
    is_json = response.headers.get("content-type", "").startswith("application/json")
    if is_json:
        try:
            validate_response(path, method, response.status_code, response.json())
        except Exception as exc:  # jsonschema.ValidationError, KeyError for an undocumented status
            problems.append(f"validate_response: {type(exc).__name__}: {exc}")
    try:
        # schemathesis reads application/yaml into a mapping and then finds it is not a string:
        # its body check runs on JSON answers only.
        case.validate_response(response, checks=_CHECKS + ([response_schema_conformance] if is_json else []))
    except Exception as exc:  # schemathesis's FailureGroup
        problems.append(f"schemathesis: {exc}")
    return problems


def describe(response: requests.Response, body: bytes, problems: list[str], server: Server) -> str:
    """A reproducer: the request as sent, the answer, the problems and the end of the server log."""
    request = response.request
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "content-encoding")
               or k.lower().startswith("typesafe")}
    return "\n".join([
        f"{request.method} {request.url} headers {headers}",
        f"body (before any Content-Encoding): {body[:3000]!r}",
        f"answer {response.status_code}: {response.text[:2000]}",
        *problems,
        "server log (tail):",
        server.log()[-3000:],
    ])


def fuzz(server: Server, schema: Any, method: str, path: str, mode: str, examples: int,
         derandomize: bool) -> Counter[int]:
    """Run `examples` generated requests against one operation; returns the statuses answered."""
    operation = schema[path][method.upper()]
    statuses: Counter[int] = Counter()
    session = requests.Session()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.generate, Phase.shrink))
    @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
    def exchange(case: Any) -> None:
        try:
            response, body = send(session, case, server.url)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nserver log (tail):\n{server.log()[-3000:]}") from None
        statuses[response.status_code] += 1
        problems = contract_problems(case, response, path, method)
        if problems:
            raise AssertionError(describe(response, body, problems, server))

    try:
        exchange()
    finally:
        session.close()
    print(f"{method.upper()} {path} {mode}: statuses {dict(sorted(statuses.items()))}")
    return statuses


@pytest.mark.parametrize("method, path, mode", _cases())
def test_fuzz_operation(fuzz_server: Server, fuzz_schema: Any, method: str, path: str, mode: str) -> None:
    statuses = fuzz(fuzz_server, fuzz_schema, method, path, mode, NORMAL_EXAMPLES, derandomize=True)
    assert statuses.total() >= (NORMAL_EXAMPLES if method == "post" else 1)
    assert fuzz_server.client.get("/health").status_code == 200


@pytest.mark.heavy
@pytest.mark.parametrize("method, path, mode", _cases())
def test_fuzz_operation_heavy(fuzz_server: Server, fuzz_schema: Any, method: str, path: str, mode: str) -> None:
    statuses = fuzz(fuzz_server, fuzz_schema, method, path, mode, HEAVY_EXAMPLES, derandomize=False)
    assert statuses.total() >= (HEAVY_EXAMPLES if method == "post" else 1)
    assert fuzz_server.client.get("/health").status_code == 200


def test_generation_document_only_biases_requests() -> None:
    contract = load_openapi()
    doc = generation_document(contract)
    assert doc["components"]["schemas"]["ClassifyRequest"]["required"] == ["input", "model"]
    assert doc["components"]["schemas"]["MaxTokens"]["maximum"] == INT64_MAX
    # response-only schemas are untouched, and the contract itself is not modified
    assert doc["components"]["schemas"]["ModelList"] == contract["components"]["schemas"]["ModelList"]
    assert "maximum" not in contract["components"]["schemas"]["MaxTokens"]


# ---- findings: contract gaps the fuzzing turned up, pinned now that they are fixed ---------------

DECISION = {"model": "sparrow", "state": "The user asks how to reset a password.",
            "questions": {"q": {"type": "noul", "instructions": "Is this about passwords?"}}}


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/systemone"])
def test_multipart_request_is_read_like_json(fuzz_server: Server, path: str) -> None:
    as_json = checked(fuzz_server.client.post(path, json=DECISION), path)
    assert as_json.status_code == 200
    multipart = checked(fuzz_server.client.post(
        path, files={"request": (None, orjson.dumps(DECISION), "application/json")}), path)
    assert multipart.status_code == 200, multipart.text
    assert multipart.json() == as_json.json()


def test_bundle_options_contract_and_server_agree(fuzz_server: Server) -> None:
    body = {"tasks": [{"id": "a", "embeddings": {"model": "emb", "input": "x"}}], "options": {"return_meta": True}}
    contract_accepts = request_validator("/v1/bundle").is_valid(body)
    answer = checked(httpx.post(f"{fuzz_server.url}/v1/bundle", json=body, timeout=30), "/v1/bundle")
    assert (answer.status_code == 200) == contract_accepts, answer.text
