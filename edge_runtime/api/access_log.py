"""Structured access log: one JSON object per line per request, on stderr.

A line holds the time (UTC, ISO 8601), the request id, method, route, model (as the request named
it, when it named one), status, bytes in (the body as sent) and out, and the Server-Timing phases
in milliseconds. It never holds a header, a body or a key. ``serve --no-access-log`` turns it off.

Lines go to the descriptor with ``os.write`` rather than through ``logging``: the logging module's
record, caller lookup, lock and flush cost about as much as a whole sparrow-nano readout, on every
request. On the event loop lines are buffered, as nginx's ``access_log ... flush=`` does, and
written together FLUSH_SECONDS after the first of them, or at once when they fill PIPE_BUF bytes,
or at exit: a write per request would sit in the next request's path (the loop reads a waiting
request before it runs its callbacks). A hard kill loses at most FLUSH_SECONDS of lines. Each
write holds whole lines, at most PIPE_BUF bytes, so lines stay whole beside the other log lines on
stderr.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import select
from datetime import UTC, datetime
from typing import Any

import orjson

FLUSH_SECONDS = 0.05
_fd: int | None = None  # where lines go; None: the access log is off (the default until configured)
_pending = bytearray()  # lines made on the event loop, not yet written
_timer_loop: asyncio.AbstractEventLoop | None = None  # the loop a timed flush is pending on


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
    if _fd is None:
        return
    line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on a loop: write it now
        _write(_fd, line)
        return
    if len(_pending) + len(line) > select.PIPE_BUF:
        flush()  # a full write's worth: now, in one piece
    _pending.extend(line)
    global _timer_loop
    if _timer_loop is not loop:  # no flush pending on this loop (a closed loop's timer never fires)
        _timer_loop = loop
        loop.call_later(FLUSH_SECONDS, _timed_flush)


def _timed_flush() -> None:
    global _timer_loop
    _timer_loop = None
    flush()


def flush() -> None:
    """Write the lines made since the last flush."""
    if _pending and _fd is not None:
        data = bytes(_pending)
        _pending.clear()
        _write(_fd, data)


def _write(fd: int, data: bytes) -> None:
    # stderr gone: there is nowhere left to say so, and the requests were answered anyway
    with contextlib.suppress(OSError):
        while data:
            cut = len(data) if len(data) <= select.PIPE_BUF else data.rfind(b"\n", 0, select.PIPE_BUF) + 1
            written = os.write(fd, data[: cut or select.PIPE_BUF])
            data = data[written:]


atexit.register(flush)
