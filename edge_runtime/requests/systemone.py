"""Decoding of System One requests (POST /v1/systemone and /v1/systemone/batch) into the decisions form.

The process's ``--systemone-schema`` decides how a body is read:

- ``vllm-sr/5.0`` (the default): the System One standard plus the vllm-sr extensions (images,
  videos, assets, batches in ``states``, Set and Span, choices / levels / labels, presets,
  ``options``), decoded strictly: any other top-level member, ``roles`` included, is refused with
  400 naming it. An entry that gives no ``roles`` is read with ``roles: null`` (no part of an
  object state has a role), where the internal form would read the state's keys as its parts.
- ``vllm-sr/4.0``: the internal form as it is (it holds every 5.0 form and ``roles``).

Under both, the header ``TypeSafe-Danger-Zone-Long-Context: true`` reads a long context, as
``options.long_context: true`` does. A 5.0 body is rewritten into the equivalent internal-form body
(:func:`internal_body`), so that it takes the one decisions path (validation, planning,
execution) that ``/v1/decisions`` takes; :func:`parse_systemone_request` gives its
:class:`~edge_runtime.requests.decisions.DecisionsRequest`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edge_runtime.errors import invalid_request
from edge_runtime.requests.common import check_count, reject_unknown, require_object
from edge_runtime.requests.decisions import DecisionsRequest, parse_decisions_request

SCHEMA_5 = "vllm-sr/5.0"
SCHEMA_4 = "vllm-sr/4.0"
SCHEMAS: tuple[str, ...] = (SCHEMA_5, SCHEMA_4)

LONG_CONTEXT_HEADER = "TypeSafe-Danger-Zone-Long-Context"

#: The top-level members of a vllm-sr/5.0 request: the standard's and the vllm-sr extensions.
MEMBERS_5 = frozenset({"model", "state", "questions", "images", "videos", "assets", "states", "options"})
#: The members of a /v1/systemone/batch body.
BATCH_MEMBERS = frozenset({"requests"})


def check_schema(schema: str) -> str:
    """``schema`` if it is one this module reads; ValueError otherwise (a configuration fault)."""
    if schema not in SCHEMAS:
        raise ValueError(f"System One schema must be one of {list(SCHEMAS)}, not {schema!r}")
    return schema


def long_context_header(headers: Mapping[str, str]) -> bool:
    """Whether the request headers ask for a long context; 400 for a value other than true or false."""
    wanted = LONG_CONTEXT_HEADER.lower()
    for name, value in headers.items():
        if name.lower() == wanted:
            word = value.strip().lower()
            if word not in ("true", "false"):
                raise invalid_request(f"header {LONG_CONTEXT_HEADER} must be true or false")
            return word == "true"
    return False


def internal_body(body: Any, schema: str, long_context: bool = False) -> Any:
    """The internal-form body that reads as ``body`` does under ``schema``; the input is not modified.

    Under 5.0 an unknown top-level member is refused here (400 naming it); every other fault is
    left for the decisions validation to report, in its own words. A body that is not an object
    is returned as it is, for that validation to refuse.
    """
    check_schema(schema)
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if schema == SCHEMA_5:
        reject_unknown(out, set(MEMBERS_5), "a System One request")
        if "states" in out:
            states = out["states"]
            if isinstance(states, dict):
                out["states"] = {name: _without_roles(entry) for name, entry in states.items()}
        else:
            out = _without_roles(out)
    if long_context:
        options = out.get("options")
        if options is None or isinstance(options, dict):
            out["options"] = {**(options or {}), "long_context": True}
    return out


def _without_roles(entry: Any) -> Any:
    """A 5.0 entry gives its parts no roles unless it says otherwise (an entry of ``states`` may)."""
    if isinstance(entry, dict) and "roles" not in entry:
        return {**entry, "roles": None}
    return entry


def parse_systemone_request(
    body: Any, schema: str, long_context: bool = False, max_inputs: int | None = None
) -> DecisionsRequest:
    """Validate a System One request body into a DecisionsRequest, as /v1/systemone reads it.

    Raises what :func:`~edge_runtime.requests.decisions.parse_decisions_request` raises (ApiError,
    NoValidQuestion), and 400 for a member the 5.0 schema does not define.
    """
    return parse_decisions_request(internal_body(body, schema, long_context), max_inputs)


def parse_systemone_batch(body: Any, max_requests: int | None = None) -> list[tuple[str, Any]]:
    """The named requests of a /v1/systemone/batch body, in body order, each still undecoded.

    Each one is read later exactly as a /v1/systemone body would be, so that its fault fails it
    alone. 400 for a body that is not ``{"requests": {name: request, ...}}`` with non-blank names;
    413 request_too_large when it names more than ``max_requests``.
    """
    obj = require_object(body)
    reject_unknown(obj, set(BATCH_MEMBERS), "a System One batch")
    requests = obj.get("requests")
    if not isinstance(requests, dict) or not requests:
        raise invalid_request("requests must be a non-empty object of named System One requests")
    for name in requests:
        if not name.strip():
            raise invalid_request("requests names must be non-blank strings")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid_request("a requests name holds an unpaired surrogate") from None
    if max_requests is not None:
        check_count(len(requests), "requests", max_requests)
    return list(requests.items())
