"""The admin API: model versions, loads, promotions, rollbacks, unloads and models.yaml reloads, on
a listener of its own (docs/updating-models.md, admin-openapi.yaml).

It is off unless ``serve --admin-key-file`` is given (the serving listener has no /admin route, so
it answers 404 there), listens on 127.0.0.1 unless told otherwise, and takes only its own keys
(never the serving keys nor EDGE_RUNTIME_API_KEY), re-read on SIGHUP. A package is a local
directory under the allowed root (403 otherwise); there are no uploads and no URLs. Errors have
the contract's shape: ``{"error": {"code", "message", "reason"?}}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

from sanic import Request, Sanic
from sanic.response import HTTPResponse

from edge_runtime.api.auth import ApiKeys, bearer_token
from edge_runtime.api.body import parse_json
from edge_runtime.api.responses import error_response, install_error_handlers, json_response
from edge_runtime.api.routes import Route
from edge_runtime.config import ConfigError, ServeConfig, update_rules
from edge_runtime.errors import ApiError
from edge_runtime.updates import Updates

log = logging.getLogger("edge_runtime.admin")
_ids = itertools.count()

PREFIX = "/admin/v1"
OPENAPI_FILE = "admin-openapi.yaml"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="edge-runtime-admin"'}
MAX_BODY = 64 * 1024
MAX_WAIT_S = 30.0


def admin_openapi_bytes() -> bytes:
    """The admin API's OpenAPI document, as shipped."""
    return resources.files("edge_runtime.api").joinpath(OPENAPI_FILE).read_bytes()


def package_path(root: Path, raw: Any) -> Path:
    """A package directory named by the admin API: a local path under ``root``, never a URL.

    Relative paths are read from ``root``; symbolic links are resolved before the check, so a link
    cannot lead outside it. 403 forbidden outside the root (before anything is said about existence).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ApiError("invalid_request", "package must be a local directory path")
    if "://" in raw or raw.split(":", 1)[0].lower() in ("http", "https", "s3", "gs", "file", "hf"):
        raise ApiError("invalid_request", "package must be a local path: URLs and uploads are not taken",
                       "url_unsupported")
    path = Path(raw)
    resolved = (path if path.is_absolute() else root / path).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ApiError("forbidden", f"package {raw!r} is outside the allowed root {root}")
    if not resolved.is_dir():
        raise ApiError("invalid_request", f"package {raw!r} is not a directory")
    return resolved


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ApiError("invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError("invalid_request", f"unknown members {unknown}; this route takes {sorted(allowed)}")
    return body


async def _authorize(request: Request) -> HTTPResponse | None:
    """Every admin route but the OpenAPI document needs an admin key."""
    if request.path == f"{PREFIX}/openapi.yaml":
        return None
    if not request.app.ctx.keys.check(bearer_token(request.headers)):
        log.info("admin: refused %s %s: no valid admin key", request.method, request.path)
        response = error_response(ApiError("unauthorized", "a valid admin key is required: send "
                                           "Authorization: Bearer <admin key>"))
        response.headers.update(CHALLENGE)
        return response
    return None


async def _off_loop(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, partial(fn, *args))


def _body(request: Request, allowed: set[str]) -> dict[str, Any]:
    raw = request.body or b""
    return _object(parse_json(raw) if raw.strip() else None, allowed)


def _accepted(op: Any) -> HTTPResponse:
    return json_response(op.describe(), 202, {"Location": f"{PREFIX}/operations/{op.id}"})


async def list_versions(request: Request) -> HTTPResponse:
    return json_response(await _off_loop(request.app.ctx.updates.describe))


async def load(request: Request, name: str) -> HTTPResponse:
    updates: Updates = request.app.ctx.updates
    body = _body(request, {"package", "variant", "promote", "policy", "update"})
    promote = body.get("promote", True)
    policy = body.get("policy")
    if not isinstance(promote, bool):
        raise ApiError("invalid_request", "promote must be true or false")
    if policy not in (None, "beside", "replace"):
        raise ApiError("invalid_request", "policy must be beside or replace")
    variant = body.get("variant")
    if variant is not None and not isinstance(variant, str):
        raise ApiError("invalid_request", "variant must be a string")
    path = package_path(request.app.ctx.package_root, body.get("package"))
    entry = updates.entry_for(name, path, variant)
    if body.get("update") is not None:  # this load's rules, over the entry's in models.yaml
        if not isinstance(body["update"], dict):
            raise ApiError("invalid_request", "update must be an object")
        try:
            rules = update_rules({**dataclasses.asdict(entry.update), **body["update"]}, "update")
        except ConfigError as exc:
            raise ApiError("invalid_request", str(exc)) from None
        entry = dataclasses.replace(entry, update=rules)
    return _accepted(await _off_loop(updates.load, entry, promote, policy))


async def promote(request: Request, name: str) -> HTTPResponse:
    version = _body(request, {"version"}).get("version")
    if not isinstance(version, str | int) or isinstance(version, bool):
        raise ApiError("invalid_request", "version (a version_id or serial) is required")
    return _accepted(request.app.ctx.updates.promote(name, str(version)))


async def rollback(request: Request, name: str) -> HTTPResponse:
    _body(request, set())
    return _accepted(request.app.ctx.updates.rollback(name))


async def unload(request: Request, name: str, version: str) -> HTTPResponse:
    return _accepted(request.app.ctx.updates.unload(name, version))


async def reload(request: Request) -> HTTPResponse:
    updates: Updates = request.app.ctx.updates
    dry_run = _body(request, {"dry_run"}).get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ApiError("invalid_request", "dry_run must be true or false")
    if dry_run:
        try:
            changes = await _off_loop(updates.plan, True)
        except ConfigError as exc:
            raise ApiError("invalid_request", f"models file not valid: {exc}") from None
        return json_response({"dry_run": True, "plan": [c.describe() for c in changes]})
    return _accepted(updates.reload("admin"))


async def operation(request: Request, op_id: str) -> HTTPResponse:
    op = request.app.ctx.updates.operation(op_id)
    if op is None:
        raise ApiError("invalid_request", f"no operation {op_id!r} (the last {64} are kept)", "route_not_found")
    wait = request.args.get("wait")
    if wait is not None:
        try:
            seconds = min(MAX_WAIT_S, max(0.0, float(wait)))
        except ValueError:
            raise ApiError("invalid_request", "wait must be a number of seconds") from None
        await _off_loop(op.done.wait, seconds)
    return json_response(op.describe())


async def openapi(request: Request) -> HTTPResponse:
    return HTTPResponse(admin_openapi_bytes(), content_type="application/yaml")


async def _api_error(request: Request, exc: ApiError) -> HTTPResponse:
    return error_response(exc)


#: The admin listener's routes.
ADMIN_ROUTES: tuple[Route, ...] = (
    Route(f"{PREFIX}/models", list_versions),
    Route(f"{PREFIX}/models/<name>/versions", load, ("POST",)),
    Route(f"{PREFIX}/models/<name>/promote", promote, ("POST",)),
    Route(f"{PREFIX}/models/<name>/rollback", rollback, ("POST",)),
    Route(f"{PREFIX}/models/<name>/versions/<version>", unload, ("DELETE",)),
    Route(f"{PREFIX}/reload", reload, ("POST",)),
    Route(f"{PREFIX}/operations/<op_id>", operation),
    Route(f"{PREFIX}/openapi.yaml", openapi),
)


def create_admin_app(config: ServeConfig, updates: Updates, keys: ApiKeys) -> Sanic:
    """The admin listener's app; every route but the OpenAPI document needs an admin key."""
    app = Sanic(f"edge_runtime_admin_{next(_ids)}")
    app.config.MOTD = False
    app.config.ACCESS_LOG = False
    app.config.REQUEST_MAX_SIZE = MAX_BODY
    # Sanic's TouchUp rewrites its HTTP classes once per process, for the serving app; a second
    # pass for this app fails (the methods are already rewritten), so it is skipped here.
    app.config.TOUCHUP = False
    app.ctx.updates = updates
    app.ctx.keys = keys
    app.ctx.package_root = config.admin_package_root or (
        config.models_file.parent if config.models_file else Path.cwd())
    app.register_middleware(_authorize, "request")
    for route in ADMIN_ROUTES:
        app.add_route(route.handler, route.path, methods=list(route.methods))
    app.error_handler.add(ApiError, _api_error)
    install_error_handlers(app, log)
    return app
