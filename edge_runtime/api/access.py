"""Who may call, and what every response says about its request: the API-key check, request ids,
the access log. Sanic middleware, installed by :func:`install` on the app.

The key check runs before a streamed body is read, so a request without a key costs no body
decoding. A refused request is answered 401 with ``WWW-Authenticate: Bearer``: in the contract's
shape (code ``unauthorized``) on the internal surfaces, in the System One shape (``detail``
``error_type`` ``authentication_error``) on /v1/systemone and /v1/systemone/batch.
"""

from __future__ import annotations

import logging
from typing import Any

from sanic import Request, Sanic
from sanic.response import BaseHTTPResponse, HTTPResponse

from edge_runtime.api import access_log, request_ids
from edge_runtime.api.auth import ApiKeys, bearer_token, needs_key
from edge_runtime.api.responses import error_response, json_response
from edge_runtime.api.systemone import systemone_error
from edge_runtime.errors import ApiError

log = logging.getLogger("edge_runtime.api")

UNAUTHORIZED_MESSAGE = "a valid API key is required: send Authorization: Bearer <key>"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="edge-runtime"'}


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


def install(app: Sanic, keys: ApiKeys, schema: str, metrics_require_key: bool, metrics: Any = None) -> None:
    """Register the middleware (SIGHUP, which re-reads the key file, is api/app.py's).

    ``metrics`` (edge_runtime.metrics.Metrics) counts refused requests under status 401, so a
    client with a stale key shows on a dashboard.
    """

    async def identify_and_authorize(request: Request) -> HTTPResponse | None:
        rid = request_ids.request_id(request.headers)
        request.ctx.request_id = rid
        # Sanic runs this middleware and the handler in one task: the handler's log lines see it.
        request_ids.current.set(rid)
        request.ctx.bytes_in = 0
        request.ctx.model = None
        if not keys.enabled:
            return None  # no key file: every route is open
        # The matched route as well as the raw path: no spelling of a /v1 path may skip the check.
        route = getattr(request.route, "path", None)
        paths = {request.path} | ({"/" + route.lstrip("/")} if isinstance(route, str) else set())
        needed = any(needs_key(p, keys, metrics_require_key) for p in paths)
        if needed and not keys.check(bearer_token(request.headers)):
            log.info("refused %s %s: no valid API key", request.method, request.path)
            if metrics is not None:
                # The route's own path as the label: a refused request never adds a label value.
                metrics.requests.labels("/" + route.lstrip("/") if isinstance(route, str) else request.path,
                                        "401").inc()
            return unauthorized_response(request.path, schema)
        return None

    async def stamp_and_log(request: Request, response: BaseHTTPResponse) -> None:
        rid = getattr(request.ctx, "request_id", None) or request_ids.new_id()
        response.headers.update(request_ids.response_headers(request.path, rid))
        if not access_log.enabled():
            return
        body = getattr(response, "body", None)
        timing = getattr(request.ctx, "timing", None)
        access_log.write(access_log.access_record(
            rid, request.method, request.path, getattr(request.ctx, "model", None), response.status,
            int(getattr(request.ctx, "bytes_in", 0)), len(body) if body else 0,
            timing.milliseconds() if timing is not None else {},
        ))

    app.register_middleware(identify_and_authorize, "request", priority=100)
    app.register_middleware(stamp_and_log, "response", priority=100)


def note_request(request: Request, body: Any) -> None:
    """What the access log says about a request's body: the model it named."""
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        request.ctx.model = body["model"][:128]  # bounded: a log line must not grow with a request


def count_bytes_in(request: Request, n: int) -> None:
    """Add ``n`` bytes of body, as sent, to the request's count."""
    request.ctx.bytes_in = getattr(request.ctx, "bytes_in", 0) + n
