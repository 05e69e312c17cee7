"""JSON responses with the contract's headers: Server-Timing on surfaces, Retry-After on 429/503."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from sanic import Request, Sanic
from sanic.exceptions import MethodNotAllowed, NotFound, RequestTimeout, SanicException
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


ErrorHandler = Callable[[Request, Exception], Awaitable[HTTPResponse]]


def install_error_handlers(app: Sanic, log: logging.Logger,
                           guard: Callable[[ErrorHandler], ErrorHandler] = lambda handler: handler) -> None:
    """The contract's error shape for what Sanic raises itself, on any of our listeners: unknown
    routes and methods, request timeouts, Sanic's other 4xx, and the catch-all 500 that logs the
    exception (its text may hold request data or internals) and never echoes it. Each handler is
    registered through ``guard`` (the serving app's :meth:`access.Guard.error`)."""

    async def no_route(request: Request, exc: Exception) -> HTTPResponse:
        reason = "method_not_allowed" if isinstance(exc, MethodNotAllowed) else "route_not_found"
        return error_response(ApiError("invalid_request", f"no route {request.method} {request.path}", reason))

    async def internal(request: Request, exc: Exception) -> HTTPResponse:
        if isinstance(exc, RequestTimeout):
            return error_response(ApiError("invalid_request", str(exc), "request_timeout"))
        if isinstance(exc, SanicException) and exc.status_code < 500:
            return error_response(ApiError("invalid_request", str(exc)))
        log.exception("internal error on %s %s", request.method, request.path, exc_info=exc)
        return error_response(ApiError("internal_error", "internal error; the server log has the details"))

    app.exception(NotFound, MethodNotAllowed)(guard(no_route))
    app.exception(Exception)(guard(internal))
