"""Structured access log: one JSON object per line per request, on stderr.

A line holds the time (UTC, ISO 8601), the request id, method, route, model (as the request named
it, when it named one), status, bytes in (the body as sent) and out, and the Server-Timing phases
in milliseconds. It never holds a header, a body or a key. ``serve --no-access-log`` turns it off.

Lines go to the descriptor in one ``os.write`` each rather than through ``logging``: the logging
module's record, caller lookup, lock and flush cost about as much as a whole sparrow-nano answer's
readout, on every request. One write per line (well under PIPE_BUF) keeps lines whole beside the
other log lines on stderr.
"""

from __future__ import annotations

import contextlib
import os
from datetime import UTC, datetime
from typing import Any

import orjson

_fd: int | None = None  # where lines go; None: the access log is off (the default until configured)


def configure(enabled: bool, fd: int = 2) -> None:
    """Write access lines to ``fd`` (stderr), or drop them."""
    global _fd
    _fd = fd if enabled else None


def enabled() -> bool:
    """Whether access lines are written (``serve --no-access-log`` turns them off)."""
    return _fd is not None


def access_record(
    rid: str, method: str, route: str, model: str | None, status: int,
    bytes_in: int, bytes_out: int, timings: dict[str, float],
) -> dict[str, Any]:
    """One access line's fields; ``timings`` are the Server-Timing phases in ms ({} for other routes)."""
    return {
        "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "id": rid,
        "method": method,
        "route": route,
        "model": model,
        "status": status,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "timings": timings,
    }


def write(record: dict[str, Any]) -> None:
    """Write one access line (a no-op when the access log is off)."""
    fd = _fd
    if fd is None:
        return
    # stderr gone: there is nowhere left to say so, and the request was answered anyway
    with contextlib.suppress(OSError):
        os.write(fd, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
