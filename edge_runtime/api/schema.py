"""The contract file, openapi.yaml: served verbatim, and used to validate response bodies.

``validate_response(path, method, status, body)`` checks a body against the schema the document
gives that operation and status, with every ``$ref`` resolved inside the document (JSON Schema
Draft 2020-12, the dialect of OpenAPI 3.1).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import best_match
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

OPENAPI_PATH = Path(__file__).with_name("openapi.yaml")
# The document's own URI inside the registry; a "#/..." reference resolves against it.
DOCUMENT_URI = "urn:edge-runtime:openapi.yaml"
_JSON = "application/json"


def _is_integer(checker: Any, instance: Any) -> bool:
    # JSON Schema counts 1.0 as an integer; the wire does not: strict clients (the System One
    # SDK's pydantic models) refuse a token count written 1.0, so only a JSON integer is one.
    return isinstance(instance, int) and not isinstance(instance, bool)


#: Draft 2020-12, with "integer" meaning an integer literal (a Python int once parsed).
ContractValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


@cache
def openapi_bytes() -> bytes:
    """The contract file exactly as it is on disk, for GET /openapi.yaml."""
    return OPENAPI_PATH.read_bytes()


@cache
def load_openapi() -> dict[str, Any]:
    """The contract as a mapping (parsed once); treat it as read-only."""
    document = yaml.safe_load(openapi_bytes())
    if not isinstance(document, dict):
        raise ValueError(f"{OPENAPI_PATH} does not hold a mapping")
    return document


@cache
def _registry() -> Registry:
    resource = DRAFT202012.create_resource(load_openapi())
    return Registry().with_resource(DOCUMENT_URI, resource)


def pointer(*parts: str) -> str:
    """A JSON pointer fragment ("#/a/b") to the given keys, escaped per RFC 6901."""
    return "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


def resolve(ref: str) -> Any:
    """What a local reference ("#/components/...") in the document points at; KeyError if nothing."""
    if not ref.startswith("#/"):
        raise KeyError(f"{ref!r} is not a reference inside the document")
    node: Any = load_openapi()
    for raw in ref[2:].split("/"):
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            raise KeyError(f"{ref!r} does not resolve: no {key!r}")
    return node


def _response_object(path: str, method: str, status: int) -> tuple[dict[str, Any], str]:
    """The response object for an operation and status (after its $ref), and a pointer to it."""
    operation = load_openapi().get("paths", {}).get(path, {}).get(method.lower())
    if operation is None:
        raise KeyError(f"the contract has no operation {method.upper()} {path}")
    responses = operation["responses"]
    # An exact status first, then its range (4XX), then default.
    for key in (str(status), f"{str(status)[0]}XX", "default"):
        if key in responses:
            where = pointer("paths", path, method.lower(), "responses", key)
            response = responses[key]
            while "$ref" in response:
                where = response["$ref"]
                response = resolve(where)
            return response, where
    raise KeyError(f"the contract gives {method.upper()} {path} no response for status {status}")


@cache
def response_validator(path: str, method: str, status: int) -> Validator:
    """A validator (Draft 2020-12, strict integers) for the JSON body of `method path` answering `status`.

    Raises KeyError when the document has no such operation, status or JSON body.
    """
    response, where = _response_object(path, method, status)
    content = response.get("content", {})
    if _JSON not in content:
        raise KeyError(f"{method.upper()} {path} {status} has no {_JSON} body in the contract")
    schema_ref = DOCUMENT_URI + where + "/" + "/".join(("content", _JSON.replace("/", "~1"), "schema"))
    return ContractValidator({"$ref": schema_ref}, registry=_registry())


def validate_response(path: str, method: str, status: int, body: Any) -> None:
    """Check a response body against the contract; raises jsonschema.ValidationError on mismatch.

    The error is the most relevant one jsonschema finds (its ``path`` says where in the body).
    """
    validator = response_validator(path, method.lower(), status)
    error = best_match(validator.iter_errors(body))
    if error is not None:
        raise error


def request_validator(path: str, method: str = "post", media_type: str = _JSON) -> Validator:
    """A validator for the request body of an operation (for tests and tools)."""
    operation = load_openapi()["paths"][path][method.lower()]
    where = pointer("paths", path, method.lower(), "requestBody")
    body = operation["requestBody"]
    while "$ref" in body:
        where = body["$ref"]
        body = resolve(where)
    if media_type not in body["content"]:
        raise KeyError(f"{method.upper()} {path} takes no {media_type} body")
    schema_ref = DOCUMENT_URI + where + "/content/" + media_type.replace("/", "~1") + "/schema"
    return ContractValidator({"$ref": schema_ref}, registry=_registry())


def schema_validator(name: str) -> Validator:
    """A validator for one of components/schemas by name."""
    resolve(pointer("components", "schemas", name))
    return ContractValidator({"$ref": DOCUMENT_URI + pointer("components", "schemas", name)}, registry=_registry())

