"""JSON responses with the contract's headers: Server-Timing on surfaces, Retry-After on 429/503."""

from __future__ import annotations

from typing import Any

import orjson
from sanic.response import HTTPResponse

from edge_runtime.api.statuses import retry_headers, status_of
from edge_runtime.errors import ApiError
from edge_runtime.timing import Timing

JSON = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> HTTPResponse:
    return HTTPResponse(orjson.dumps(body), status=status, headers=headers, content_type=JSON)


Reply = tuple[int, Any, dict[str, str]]  # status, body, extra headers


def contract_error(error: ApiError) -> Reply:
    """A request-level error in the contract's shape, with Retry-After where its code has one."""
    return status_of(error), error.body(), retry_headers(error)


def error_response(error: ApiError, timing: Timing | None = None) -> HTTPResponse:
    status, body, headers = contract_error(error)
    return surface_response(body, status, timing, headers)


def surface_response(
    body: Any, status: int, timing: Timing | None, headers: dict[str, str] | None = None
) -> HTTPResponse:
    """Serialize a surface body, stamping serialize and total into Server-Timing."""
    headers = dict(headers or {})
    if timing is None:
        return json_response(body, status, headers)
    with timing.phase("serialize"):
        data = orjson.dumps(body)
    timing.finish()
    headers["Server-Timing"] = timing.header()
    return HTTPResponse(data, status=status, headers=headers, content_type=JSON)
