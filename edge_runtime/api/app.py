"""The Sanic application: routes, body reading, errors and headers. HTTP concerns only."""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from functools import partial
from typing import Any, cast

from sanic import Request, Sanic
from sanic.exceptions import PayloadTooLarge
from sanic.http import Http
from sanic.response import HTTPResponse

from edge_runtime import API_VERSION
from edge_runtime.api import access
from edge_runtime.api.admin import create_admin_app
from edge_runtime.api.auth import ApiKeys
from edge_runtime.api.body import decode_body, decode_small, inline_parts, parse_json, parse_multipart, read_raw_body
from edge_runtime.api.bundle import serve_bundle
from edge_runtime.api.listing import list_models
from edge_runtime.api.responses import (
    Reply,
    contract_error,
    error_response,
    install_error_handlers,
    json_response,
    surface_response,
)
from edge_runtime.api.schema import openapi_bytes
from edge_runtime.api.statuses import RETRY_AFTER, as_api_error
from edge_runtime.api.systemone import serve_systemone, systemone_error
from edge_runtime.config import ServeConfig
from edge_runtime.engine.errors import EngineError
from edge_runtime.errors import ApiError
from edge_runtime.metrics import Metrics
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.updates import Updates, UpdateSettings
from edge_runtime.updates.memory import budget, memory_limit
from edge_runtime.work import INLINE_BODY_BYTES, keep_inline

_app_ids = itertools.count()
log = logging.getLogger("edge_runtime.api")

Handler = Callable[[Any, Timing, Mapping[str, str]], Awaitable[Reply]]


def create_app(config: ServeConfig, runtime: Runtime | None = None) -> Sanic:
    """Build the app for one process; models load in the background once the server listens."""
    metrics = Metrics()
    runtime = runtime or Runtime(config, metrics)
    runtime.metrics = metrics
    metrics.watch_prep_queue(runtime.work)
    metrics.watch_runtime(runtime)  # edge_runtime_ready, _live and _model_failed read at each scrape
    app = Sanic(f"edge_runtime_{next(_app_ids)}")
    app.config.MOTD = False
    app.config.ACCESS_LOG = False
    # Sanic refuses larger streamed bodies itself; read_body refuses them earlier and in our shape.
    app.config.REQUEST_MAX_SIZE = config.max_request_bytes + 1
    # Sanic waits this long for open connections after SIGTERM; the drain below answers queued work first.
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = config.drain_seconds
    app.ctx.runtime = runtime
    app.ctx.metrics = metrics
    # API keys, request ids and the access log (edge_runtime/api/access.py).
    app.ctx.keys = ApiKeys(config.api_key_file)
    access.install(app, app.ctx.keys, config.systemone_schema, config.metrics_require_key, metrics)
    # Model updates (edge_runtime/updates): started once the first versions are loaded.
    updates = app.ctx.updates = Updates(runtime, update_settings(config), metrics)
    metrics.memory_budget.set_function(lambda: float(budget(config.memory_reserve_bytes).bytes))
    metrics.memory_limit.set_function(lambda: float(memory_limit().bytes))
    # The admin API's own keys (never the serving ones, nor the environment's): off without a file.
    admin_keys = app.ctx.admin_keys = (ApiKeys(config.admin_key_file, env={})
                                       if config.admin_key_file is not None else None)

    def load_then_watch() -> None:
        runtime.load_all()
        updates.start()

    def on_sighup() -> None:
        # Keys rotate and models.yaml is re-read; a SIGHUP never ends the server (cli ignores it
        # until this handler is in place).
        if app.ctx.keys.key_file is not None:
            app.ctx.keys.reload()
        if admin_keys is not None:
            admin_keys.reload()
        updates.reload("sighup")

    @app.after_server_start
    async def start_loading(app: Sanic) -> None:
        loop = asyncio.get_running_loop()
        app.ctx.loading = loop.run_in_executor(None, load_then_watch)
        try:
            loop.add_signal_handler(signal.SIGHUP, on_sighup)
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not on a POSIX main thread
            log.warning("SIGHUP is not available here: keys and models.yaml are read once")
        app.ctx.admin_server = None
        if admin_keys is not None:
            admin = create_admin_app(config, updates, admin_keys)
            server = await admin.create_server(config.admin_host, config.admin_port, return_asyncio_server=True)
            if server is not None:
                await server.startup()
                await server.start_serving()
                app.ctx.admin_server = server
                log.info("admin API on http://%s:%d/admin/v1", config.admin_host, config.admin_port)

    @app.before_server_stop
    async def start_draining(app: Sanic) -> None:
        # /health answers 503 draining from now on; accepted requests are still answered. Shortly
        # before Sanic's graceful timeout, work still queued is answered 503 rather than cut off.
        runtime.draining = True
        metrics.set_ready(False)
        loop = asyncio.get_running_loop()
        margin = min(1.0, config.drain_seconds / 2)
        loop.call_later(config.drain_seconds - margin, lambda: loop.run_in_executor(None, runtime.close_executors))

    @app.after_server_stop
    async def stop_models(app: Sanic) -> None:
        admin_server = getattr(app.ctx, "admin_server", None)
        if admin_server is not None:
            admin_server.close()
            await admin_server.wait_closed()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, updates.stop)
        # Joins every executor's thread, so no ONNX Runtime session is freed under a running forward.
        await loop.run_in_executor(None, runtime.close)

    async def read_request(request: Request, multipart: bool) -> Any:
        """The decoded JSON request; decisions routes also read multipart/form-data bodies."""
        encoding = request.headers.get("content-encoding")
        limit = config.max_request_bytes
        raw = await read_raw_body(
            _stream_chunks(request, partial(access.count_bytes_in, request)),
            _content_length(request), encoding, limit,
        )
        # A compressed body is decoded here only while that is cheaper than the hand-off (at most
        # INLINE_BODY_BYTES in and out); a larger one, or one that inflates past that, on the pool.
        decoded = decode_small(raw, encoding, limit, INLINE_BODY_BYTES)
        if decoded is None:
            decoded = await runtime.work.offload(decode_body, raw, encoding, limit)
        raw = decoded
        keep_inline(len(raw))
        content_type = request.headers.get("content-type", "")
        if content_type.lower().startswith("multipart/"):
            if not multipart:
                raise ApiError("invalid_request", f"{request.path} reads JSON bodies, not {content_type}")
            return await runtime.work.run(_multipart_body, raw, content_type)
        return await runtime.work.run(parse_json, raw)

    def surface_route(
        endpoint: str,
        handler: Handler,
        on_error: Callable[[ApiError | EngineError], Reply] = lambda exc: contract_error(as_api_error(exc)),
        multipart: bool = False,
    ) -> Callable[[Request], Coroutine[Any, Any, HTTPResponse]]:
        """A POST route: read the body, answer it, and format request-level errors with ``on_error``."""

        async def route(request: Request) -> HTTPResponse:
            timing = Timing()
            request.ctx.timing = timing  # the access line's phases
            started = time.perf_counter()
            status = 500
            try:
                with timing.phase("parse"):
                    body = await read_request(request, multipart)
                access.note_request(request, body)
                status, answer, headers = await handler(body, timing, request.headers)
            except (ApiError, EngineError) as exc:
                status, answer, headers = on_error(exc)
            except asyncio.CancelledError:
                status = 499  # the client went away; its queued rows were dropped
                raise
            finally:
                metrics.observe_request(endpoint, status, time.perf_counter() - started,
                                        runtime.served_name(getattr(request.ctx, "model", None)))
            if "Retry-After" in headers:  # overloaded or not ready: a small body, never queued behind the pool
                return surface_response(answer, status, timing, headers)
            return await runtime.work.finish(surface_response, answer, status, timing, headers)

        route.__name__ = endpoint.strip("/").replace("/", "_")
        return route

    def answered(serving: Callable[[Any, Timing], Awaitable[dict[str, Any]]]) -> Handler:
        async def handler(body: Any, timing: Timing, headers: Mapping[str, str]) -> Reply:
            return 200, await serving(body, timing), {}

        return handler

    for surface in ("decisions", "classify", "embeddings", "rerank"):
        app.add_route(
            surface_route(f"/v1/{surface}", answered(partial(serve, runtime, surface)),
                          multipart=surface == "decisions"),
            f"/v1/{surface}", methods=["POST"], stream=True,
        )
    app.add_route(
        surface_route("/v1/bundle", answered(partial(serve_bundle, runtime))),
        "/v1/bundle", methods=["POST"], stream=True,
    )
    # System One compatibility: answers and errors in the process's System One schema.
    schema = config.systemone_schema
    for path, batch in (("/v1/systemone", False), ("/v1/systemone/batch", True)):
        app.add_route(
            surface_route(
                path,
                partial(_systemone_handler, runtime, schema, batch),
                partial(systemone_error, schema=schema),
                multipart=True,
            ),
            path, methods=["POST"], stream=True,
        )

    @app.get("/health")
    async def health(request: Request) -> HTTPResponse:
        status, body = runtime.health()
        metrics.set_ready(status == 200)
        return json_response(body, status, {"Retry-After": str(RETRY_AFTER["not_ready"])} if status != 200 else None)

    @app.get("/health/live")
    async def live(request: Request) -> HTTPResponse:
        reason = runtime.stalled()
        if reason:
            return json_response({"api_version": API_VERSION, "status": "stalled", "reason": reason}, 503)
        return json_response({"api_version": API_VERSION, "status": "alive"})

    @app.get("/v1/models")
    async def models(request: Request) -> HTTPResponse:
        return json_response(list_models(runtime))

    @app.get("/metrics")
    async def metrics_route(request: Request) -> HTTPResponse:
        return HTTPResponse(metrics.render(), content_type=metrics.content_type)

    @app.get("/openapi.yaml")
    async def openapi(request: Request) -> HTTPResponse:
        return HTTPResponse(openapi_bytes(), content_type="application/yaml")

    @app.exception(PayloadTooLarge)
    async def too_large(request: Request, exc: Exception) -> HTTPResponse:
        limit = config.max_request_bytes
        return error_response(ApiError("request_too_large", f"the body exceeds {limit} bytes", limit=limit))

    install_error_handlers(app, log)

    return app


def update_settings(config: ServeConfig) -> UpdateSettings:
    """The update flags of ``serve`` as the manager takes them."""
    return UpdateSettings(
        drain_seconds=config.update_drain_seconds,
        watch_seconds=config.update_watch_seconds,
        rollback_error_rate=config.rollback_error_rate,
        rollback_p99_ratio=config.rollback_p99_ratio,
        rollback_min_requests=config.rollback_min_requests,
        memory_reserve_bytes=config.memory_reserve_bytes,
        policy=config.update_policy,
        watch_models_seconds=config.watch_models,
    )


async def _systemone_handler(runtime: Runtime, schema: str, batch: bool, body: Any, timing: Timing,
                             headers: Mapping[str, str]) -> Reply:
    return await serve_systemone(runtime, body, timing, schema, headers, batch)


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
