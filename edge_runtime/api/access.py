"""Who may call, and what every response says about its request: the API-key check, request ids,
the access log. :class:`Guard` wraps each route handler and each error handler of the app.

The key check runs before a streamed body is read, so a request without a key costs no body
decoding. A refused request is answered 401 with ``WWW-Authenticate: Bearer``: in the contract's
shape (code ``unauthorized``) on the internal surfaces, in the System One shape (``detail``
``error_type`` ``authentication_error``) on /v1/systemone and /v1/systemone/batch.

Handlers are wrapped rather than given to Sanic as middleware, whose machinery runs around every
request besides the work itself. With the access lines formatted in batches (access_log.py), a
3-question sparrow decision's p50 over HTTP went 0.646 -> 0.632 ms (13 server processes of each,
alternated; docs/benchmarks.md, session 23). A request that no route takes (an unknown path or
method, a body too large for Sanic) is identified, checked and stamped by the error handler that
answers it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from functools import wraps
from typing import Any

from sanic import Request
from sanic.response import HTTPResponse

from edge_runtime.api import access_log, request_ids
from edge_runtime.api.auth import ApiKeys, bearer_token, needs_key
from edge_runtime.api.responses import ErrorHandler, error_response, json_response
from edge_runtime.api.systemone import systemone_error
from edge_runtime.errors import ApiError

log = logging.getLogger("edge_runtime.api")

UNAUTHORIZED_MESSAGE = "a valid API key is required: send Authorization: Bearer <key>"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="edge-runtime"'}

RouteFunction = Callable[..., Coroutine[Any, Any, HTTPResponse]]  # the request, then the path's parameters


def unauthorized_response(path: str, schema: str) -> HTTPResponse:
    """The 401 for ``path``; never says whether a key was sent or how it was wrong."""
    error = ApiError("unauthorized", UNAUTHORIZED_MESSAGE)
    if path in request_ids.SYSTEMONE_PATHS:
        status, body, headers = systemone_error(error, schema)
        body["detail"] = {"error_type": "authentication_error", "message": UNAUTHORIZED_MESSAGE}
        return json_response(body, status, {**headers, **CHALLENGE})
    response = error_response(error)
    response.headers.update(CHALLENGE)
    return response


class Guard:
    """The key check, the request id and the access line around every handler of one app.

    ``metrics`` (edge_runtime.metrics.Metrics) counts refused requests under status 401, so a
    client with a stale key shows on a dashboard. The key file is re-read on SIGHUP (api/app.py).
    """

    def __init__(self, keys: ApiKeys, schema: str, metrics_require_key: bool, metrics: Any = None) -> None:
        self.keys = keys
        self.schema = schema
        self.metrics_require_key = metrics_require_key
        self.metrics = metrics

    def route(self, handler: RouteFunction, path: str) -> RouteFunction:
        """``handler`` of the route ``path``, behind the key check and with its answer stamped."""

        @wraps(handler)
        async def guarded(request: Request, *args: Any, **kwargs: Any) -> HTTPResponse:
            refused = self._enter(request, path)
            response = refused if refused is not None else await handler(request, *args, **kwargs)
            return self._answered(request, response)

        return guarded

    def error(self, handler: ErrorHandler) -> ErrorHandler:
        """``handler`` of an exception; a request that no route took is identified and checked first
        (so an unknown /v1 path without a key is a 401, as every /v1 route is)."""

        @wraps(handler)
        async def guarded(request: Request, exc: Exception) -> HTTPResponse:
            if getattr(request.ctx, "request_id", None) is None:
                route = getattr(request.route, "path", None)
                refused = self._enter(request, "/" + route.lstrip("/") if isinstance(route, str) else None)
                if refused is not None:
                    return self._answered(request, refused)
            return self._answered(request, await handler(request, exc))

        return guarded

    def _enter(self, request: Request, route: str | None) -> HTTPResponse | None:
        """Give the request its id; the 401 when it needs a key and carries no valid one."""
        rid = request_ids.request_id(request.headers)
        ctx = request.ctx
        ctx.request_id = rid
        # The handler runs in this task: its log lines see the id.
        request_ids.current.set(rid)
        ctx.bytes_in = 0
        ctx.model = None
        if not self.keys.enabled:
            return None  # no key file: every route is open
        # The matched route as well as the raw path: no spelling of a /v1 path may skip the check.
        needed = any(needs_key(p, self.keys, self.metrics_require_key) for p in (request.path, route) if p)
        if not needed or self.keys.check(bearer_token(request.headers)):
            return None
        log.info("refused %s %s: no valid API key", request.method, request.path)
        if self.metrics is not None:
            # The route's own path as the label: a refused request never adds a label value.
            self.metrics.requests.labels(route or request.path, "401").inc()
        return unauthorized_response(request.path, self.schema)

    @staticmethod
    def _answered(request: Request, response: HTTPResponse) -> HTTPResponse:
        """``response`` with the request's id headers; its access line written."""
        ctx = request.ctx
        rid = getattr(ctx, "request_id", None) or request_ids.new_id()
        response.headers.update(request_ids.response_headers(request.path, rid))
        if access_log.enabled():
            body = getattr(response, "body", None)
            access_log.write(access_log.Access(
                rid, request.method, request.path, getattr(ctx, "model", None), response.status,
                int(getattr(ctx, "bytes_in", 0)), len(body) if body else 0, getattr(ctx, "timing", None),
            ))
        return response


def note_request(request: Request, body: Any) -> None:
    """What the access log says about a request's body: the model it named."""
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        request.ctx.model = body["model"][:128]  # bounded: a log line must not grow with a request


def count_bytes_in(request: Request, n: int) -> None:
    """Add ``n`` bytes of body, as sent, to the request's count."""
    request.ctx.bytes_in = getattr(request.ctx, "bytes_in", 0) + n
