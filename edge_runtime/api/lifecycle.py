"""The serving listener's life: load the models once it listens, re-read keys and models on SIGHUP,
drain on SIGTERM, and free the models once it has stopped; the admin listener rides along.

Each hook is a function of the app; everything it acts on is in the app's context (api/app.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from sanic import Sanic

from edge_runtime.api.admin import create_admin_app

log = logging.getLogger("edge_runtime.api")


def install(app: Sanic) -> None:
    """Register the lifecycle hooks on the serving app."""
    app.register_listener(start, "after_server_start")
    app.register_listener(drain, "before_server_stop")
    app.register_listener(stop, "after_server_stop")


def _load_then_watch(app: Sanic) -> None:
    app.ctx.runtime.load_all()
    app.ctx.updates.start()


def reload(app: Sanic) -> None:
    """SIGHUP: keys rotate and the models file is re-read; a SIGHUP never ends the server (cli
    ignores it until this handler is in place)."""
    if app.ctx.keys.key_file is not None:
        app.ctx.keys.reload()
    if app.ctx.admin_keys is not None:
        app.ctx.admin_keys.reload()
    app.ctx.updates.reload("sighup")


async def start(app: Sanic) -> None:
    """Once listening: load the models in the background, take SIGHUP, start the admin listener."""
    # A daemon thread, not the loop's executor: a stop must not wait for a load (a conversion, a
    # retry's back-off) at interpreter exit; the runtime's stopping event ends it at its next step.
    app.ctx.loading = threading.Thread(target=_load_then_watch, args=(app,), name="edge-runtime-loader", daemon=True)
    app.ctx.loading.start()
    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload, app)
    except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not on a POSIX main thread
        log.warning("SIGHUP is not available here: keys and models.yaml are read once")
    app.ctx.admin_server = None
    if app.ctx.admin_keys is not None:
        config = app.ctx.config
        admin = create_admin_app(config, app.ctx.updates, app.ctx.admin_keys)
        server = await admin.create_server(config.admin_host, config.admin_port, return_asyncio_server=True)
        if server is not None:
            await server.startup()
            await server.start_serving()
            app.ctx.admin_server = server
            log.info("admin API on http://%s:%d/admin/v1", config.admin_host, config.admin_port)


async def drain(app: Sanic) -> None:
    """SIGTERM: /health answers 503 draining from now on; accepted requests are still answered.
    Shortly before Sanic's graceful timeout, work still queued is answered 503 rather than cut off."""
    runtime = app.ctx.runtime
    runtime.draining = True
    runtime.stopping.set()
    app.ctx.metrics.set_ready(False)
    loop = asyncio.get_running_loop()
    seconds = app.ctx.config.drain_seconds
    margin = min(1.0, seconds / 2)
    loop.call_later(seconds - margin, lambda: loop.run_in_executor(None, runtime.close_executors))


async def stop(app: Sanic) -> None:
    """After the last response: the admin listener, the update manager, then the models."""
    admin_server = getattr(app.ctx, "admin_server", None)
    if admin_server is not None:
        admin_server.close()
        await admin_server.wait_closed()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, app.ctx.updates.stop)
    # Joins every executor's thread, so no ONNX Runtime session is freed under a running forward.
    await loop.run_in_executor(None, app.ctx.runtime.close)
