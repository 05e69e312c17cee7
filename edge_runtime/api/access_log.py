"""Structured access log: one JSON object per line per request, on the ``edge_runtime.access`` logger.

A line holds the time (UTC, ISO 8601), the request id, method, route, model (as the request named
it, when it named one), status, bytes in (the body as sent) and out, and the Server-Timing phases
in milliseconds. It never holds a header, a body or a key. ``serve --no-access-log`` turns it off.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

LOGGER_NAME = "edge_runtime.access"
log = logging.getLogger(LOGGER_NAME)


def configure(enabled: bool) -> None:
    """Send access lines, bare JSON, to stderr (not through the root's text format), or drop them."""
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    if enabled:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    else:
        log.setLevel(logging.CRITICAL + 1)


def enabled() -> bool:
    """Whether access lines are written (``serve --no-access-log`` turns them off)."""
    return log.isEnabledFor(logging.INFO)


def server_timing_phases(header: str | None) -> dict[str, float]:
    """``parse;dur=0.02, total;dur=5.1`` as ``{"parse": 0.02, "total": 5.1}``; malformed parts are skipped."""
    phases: dict[str, float] = {}
    if not header:
        return phases
    for part in header.split(","):
        name, sep, value = part.strip().partition(";dur=")
        if not sep:
            continue
        try:
            phases[name] = float(value)
        except ValueError:
            continue
    return phases


def access_record(
    rid: str, method: str, route: str, model: str | None, status: int,
    bytes_in: int, bytes_out: int, server_timing: str | None,
) -> dict[str, Any]:
    """One access line's fields."""
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "id": rid,
        "method": method,
        "route": route,
        "model": model,
        "status": status,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "timings": server_timing_phases(server_timing),
    }


def write(record: dict[str, Any]) -> None:
    """Log one access line (a no-op when the access log is off)."""
    if enabled():
        log.info(orjson.dumps(record).decode("utf-8"))
