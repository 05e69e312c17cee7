"""The serving listener's routes, in one table: each path, its methods and its handler.

Handlers are plain functions of the request; what they serve comes from the app's context
(``request.app.ctx``: the runtime, the metrics, the process's settings), which api/app.py fills.
A surface route reads the body (streamed, bounded, decoded), answers it through the service and
formats request-level errors; the others report the process (health, models, metrics, the contract).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from sanic import Request
from sanic.http import Http
from sanic.response import HTTPResponse

from edge_runtime import API_VERSION
from edge_runtime.api import access
from edge_runtime.api.body import decode_body, decode_small, inline_parts, parse_json, parse_multipart, read_raw_body
from edge_runtime.api.bundle import serve_bundle
from edge_runtime.api.listing import list_models
from edge_runtime.api.responses import Reply, contract_error, json_response, surface_response
from edge_runtime.api.schema import openapi_bytes
from edge_runtime.api.statuses import RETRY_AFTER, as_api_error
from edge_runtime.api.systemone import serve_systemone, systemone_error
from edge_runtime.engine.errors import EngineError
from edge_runtime.errors import ApiError
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.work import INLINE_BODY_BYTES, keep_inline

Handler = Callable[[Runtime, Any, Timing, Mapping[str, str]], Awaitable[Reply]]
ErrorReply = Callable[[Request, ApiError | EngineError], Reply]
RouteHandler = Callable[[Request], Coroutine[Any, Any, HTTPResponse]]


@dataclass(frozen=True)
class Route:
    """One route of a listener: its path, methods, handler, and whether the body is streamed to it."""

    path: str
    handler: access.RouteFunction
    methods: tuple[str, ...] = ("GET",)
    stream: bool = False


# -- surface routes -------------------------------------------------------------------------------


async def read_request(request: Request, multipart: bool) -> Any:
    """The decoded JSON request; decisions routes also read multipart/form-data bodies."""
    runtime: Runtime = request.app.ctx.runtime
    encoding = request.headers.get("content-encoding")
    limit = runtime.config.max_request_bytes
    raw = await read_raw_body(
        _stream_chunks(request, partial(access.count_bytes_in, request)), _content_length(request), encoding, limit,
    )
    # A compressed body is decoded here only while that is cheaper than the hand-off (at most
    # INLINE_BODY_BYTES in and out); a larger one, or one that inflates past that, on the pool.
    decoded = decode_small(raw, encoding, limit, INLINE_BODY_BYTES)
    if decoded is None:
        decoded = await runtime.work.offload(decode_body, raw, encoding, limit)
    keep_inline(len(decoded))
    content_type = request.headers.get("content-type", "")
    if content_type.lower().startswith("multipart/"):
        if not multipart:
            raise ApiError("invalid_request", f"{request.path} reads JSON bodies, not {content_type}")
        return await runtime.work.run(_multipart_body, decoded, content_type)
    return await runtime.work.run(parse_json, decoded)


def _contract_error(request: Request, exc: ApiError | EngineError) -> Reply:
    return contract_error(as_api_error(exc))


def surface_route(endpoint: str, handler: Handler, on_error: ErrorReply = _contract_error,
                  multipart: bool = False) -> RouteHandler:
    """A POST route: read the body, answer it with ``handler``, format request-level errors with ``on_error``."""

    async def route(request: Request) -> HTTPResponse:
        runtime: Runtime = request.app.ctx.runtime
        runtime.arrived(id(request.conn_info))
        timing = Timing()
        request.ctx.timing = timing  # the access line's phases
        started = time.perf_counter()
        status = 500
        try:
            with timing.phase("parse"):
                body = await read_request(request, multipart)
            access.note_request(request, body)
            status, answer, headers = await handler(runtime, body, timing, request.headers)
        except (ApiError, EngineError) as exc:
            status, answer, headers = on_error(request, exc)
        except asyncio.CancelledError:
            status = 499  # the client went away; its queued rows were dropped
            raise
        finally:
            request.app.ctx.metrics.observe_request(endpoint, status, time.perf_counter() - started,
                                                    runtime.served_name(getattr(request.ctx, "model", None)))
        if "Retry-After" in headers:  # overloaded or not ready: a small body, never queued behind the pool
            return surface_response(answer, status, timing, headers)
        return await runtime.work.finish(surface_response, answer, status, timing, headers)

    route.__name__ = endpoint.strip("/").replace("/", "_")
    return route


def _answered(serving: Callable[[Runtime, Any, Timing], Awaitable[dict[str, Any]]]) -> Handler:
    async def handler(runtime: Runtime, body: Any, timing: Timing, headers: Mapping[str, str]) -> Reply:
        return 200, await serving(runtime, body, timing), {}

    return handler


def _surface(surface: str) -> Handler:
    return _answered(lambda runtime, body, timing: serve(runtime, surface, body, timing))


async def _systemone(batch: bool, runtime: Runtime, body: Any, timing: Timing, headers: Mapping[str, str]) -> Reply:
    # Answers and errors in the process's System One schema.
    return await serve_systemone(runtime, body, timing, runtime.config.systemone_schema, headers, batch)


def _systemone_error(request: Request, exc: ApiError | EngineError) -> Reply:
    return systemone_error(exc, request.app.ctx.runtime.config.systemone_schema)


def _multipart_body(raw: bytes, content_type: str) -> Any:
    body, parts = parse_multipart(raw, content_type)
    return inline_parts(body, parts)


async def _stream_chunks(request: Request, count: Callable[[int], None]) -> Any:
    """The request body as it arrives; ``count`` sees each chunk's size."""
    # Routes are declared with stream=True, so the stream is HTTP's own, which reads the body.
    stream = cast(Http, request.stream)
    while True:
        chunk = await stream.read()
        if chunk is None:
            return
        count(len(chunk))
        yield chunk


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ApiError("invalid_request", "Content-Length is not a number") from None


# -- process routes -------------------------------------------------------------------------------


async def health(request: Request) -> HTTPResponse:
    status, body = request.app.ctx.runtime.health()
    request.app.ctx.metrics.set_ready(status == 200)
    return json_response(body, status, {"Retry-After": str(RETRY_AFTER["not_ready"])} if status != 200 else None)


async def liveness(request: Request) -> HTTPResponse:
    reason = request.app.ctx.runtime.stalled()
    if reason:
        return json_response({"api_version": API_VERSION, "status": "stalled", "reason": reason}, 503)
    return json_response({"api_version": API_VERSION, "status": "alive"})


async def models(request: Request) -> HTTPResponse:
    return json_response(list_models(request.app.ctx.runtime))


async def metrics(request: Request) -> HTTPResponse:
    collected = request.app.ctx.metrics
    return HTTPResponse(collected.render(), content_type=collected.content_type)


async def openapi(request: Request) -> HTTPResponse:
    return HTTPResponse(openapi_bytes(), content_type="application/yaml")


POST = ("POST",)

#: The serving listener's routes.
ROUTES: tuple[Route, ...] = (
    *(Route(f"/v1/{surface}", surface_route(f"/v1/{surface}", _surface(surface), multipart=surface == "decisions"),
            POST, stream=True)
      for surface in ("decisions", "classify", "embeddings", "rerank")),
    Route("/v1/bundle", surface_route("/v1/bundle", _answered(serve_bundle)), POST, stream=True),
    Route("/v1/systemone", surface_route("/v1/systemone", partial(_systemone, False), _systemone_error,
                                         multipart=True), POST, stream=True),
    Route("/v1/systemone/batch", surface_route("/v1/systemone/batch", partial(_systemone, True), _systemone_error,
                                               multipart=True), POST, stream=True),
    Route("/health", health),
    Route("/health/live", liveness),
    Route("/v1/models", models),
    Route("/metrics", metrics),
    Route("/openapi.yaml", openapi),
)
