"""The Sanic application: its context, its routes (api/routes.py) behind the access guard
(api/access.py), its lifecycle (api/lifecycle.py) and its error handlers. HTTP concerns only."""

from __future__ import annotations

import itertools
import logging

from sanic import Request, Sanic
from sanic.exceptions import PayloadTooLarge
from sanic.response import HTTPResponse

from edge_runtime.api import access, lifecycle
from edge_runtime.api.auth import ApiKeys
from edge_runtime.api.responses import error_response, install_error_handlers
from edge_runtime.api.routes import ROUTES
from edge_runtime.config import ServeConfig
from edge_runtime.errors import ApiError
from edge_runtime.metrics import Metrics
from edge_runtime.runtime import Runtime
from edge_runtime.updates import Updates, UpdateSettings
from edge_runtime.updates.memory import budget, memory_limit

_app_ids = itertools.count()
log = logging.getLogger("edge_runtime.api")


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
    # Sanic waits this long for open connections after SIGTERM; the drain answers queued work first.
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = config.drain_seconds
    app.ctx.config = config
    app.ctx.runtime = runtime
    app.ctx.metrics = metrics
    # API keys, request ids and the access log around every handler (edge_runtime/api/access.py).
    app.ctx.keys = ApiKeys(config.api_key_file)
    guard = access.Guard(app.ctx.keys, config.systemone_schema, config.metrics_require_key, metrics)
    # Model updates (edge_runtime/updates): started once the first versions are loaded.
    app.ctx.updates = Updates(runtime, update_settings(config), metrics)
    metrics.memory_budget.set_function(lambda: float(budget(config.memory_reserve_bytes).bytes))
    metrics.memory_limit.set_function(lambda: float(memory_limit().bytes))
    # The admin API's own keys (never the serving ones, nor the environment's): off without a file.
    app.ctx.admin_keys = ApiKeys(config.admin_key_file, env={}) if config.admin_key_file is not None else None
    for route in ROUTES:
        app.add_route(guard.route(route.handler, route.path), route.path, methods=list(route.methods),
                      stream=route.stream)
    lifecycle.install(app)

    async def too_large(request: Request, exc: Exception) -> HTTPResponse:
        limit = config.max_request_bytes
        return error_response(ApiError("request_too_large", f"the body exceeds {limit} bytes", limit=limit))

    app.exception(PayloadTooLarge)(guard.error(too_large))
    install_error_handlers(app, log, guard.error)
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
