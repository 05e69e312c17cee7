"""JSON responses with the contract's headers: Server-Timing on surfaces, Retry-After on 429/503."""

from __future__ import annotations

from typing import Any

import orjson
from sanic.response import HTTPResponse

from edge_runtime.errors import ApiError
from edge_runtime.timing import Timing

JSON = "application/json"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> HTTPResponse:
    return HTTPResponse(orjson.dumps(body), status=status, headers=headers, content_type=JSON)


def error_response(error: ApiError, timing: Timing | None = None) -> HTTPResponse:
    return surface_response(error.body(), error.status, timing, error.retry_after)


def surface_response(
    body: Any, status: int, timing: Timing | None, retry_after: int | None = None
) -> HTTPResponse:
    """Serialize a surface body, stamping serialize and total into Server-Timing."""
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if timing is None:
        return json_response(body, status, headers)
    with timing.phase("serialize"):
        data = orjson.dumps(body)
    timing.finish()
    headers["Server-Timing"] = timing.header()
    return HTTPResponse(data, status=status, headers=headers, content_type=JSON)
