"""Structured access log: one JSON object per line per request, on stderr.

A line holds the time (UTC, ISO 8601), the request id, method, route, model (as the request named
it, when it named one), status, bytes in (the body as sent) and out, and the Server-Timing phases
in milliseconds. It never holds a header, a body or a key. ``serve --no-access-log`` turns it off.

Lines go to the descriptor with ``os.write`` rather than through ``logging``: the logging module's
record, caller lookup, lock and flush cost about as much as a whole sparrow-nano readout, on every
request. On the event loop a request leaves only its fields (:func:`log`, a tuple kept in memory);
they are formatted and written together FLUSH_SECONDS after the first of them, or as soon as the
response that makes MAX_PENDING is sent, or at exit, as nginx's ``access_log ... flush=`` buffers: formatting and
writing in the request's own path cost a sparrow-nano decision ~5 % of its latency served (the
time formatted, the line serialized, a write per request in the next request's path). A hard kill
loses at most FLUSH_SECONDS of lines. Each write holds whole lines, at most PIPE_BUF bytes, so
lines stay whole beside the other log lines on stderr.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import select
import time
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

FLUSH_SECONDS = 0.05
MAX_PENDING = 16  # lines that, waiting, are written without waiting for the timer (~4 KB)
_fd: int | None = None  # where lines go; None: the access log is off (the default until configured)
_pending: list[tuple[Any, ...]] = []  # requests' fields noted on the event loop, not yet written
_timer_loop: asyncio.AbstractEventLoop | None = None  # the loop a timed flush is pending on


class Timings(Protocol):
    """What a line reads of a request's timing (edge_runtime.timing.Timing)."""

    def milliseconds(self) -> dict[str, float]: ...


def configure(enabled: bool, fd: int = 2) -> None:
    """Write access lines to ``fd`` (stderr), or drop them."""
    global _fd
    _fd = fd if enabled else None


def enabled() -> bool:
    """Whether access lines are written (``serve --no-access-log`` turns them off)."""
    return _fd is not None


def access_record(
    rid: str, method: str, route: str, model: str | None, status: int,
    bytes_in: int, bytes_out: int, timings: dict[str, float], at: float | None = None,
) -> dict[str, Any]:
    """One access line's fields; ``timings`` are the Server-Timing phases in ms ({} for other routes);
    ``at`` is when the request was answered (time.time(); default now)."""
    return {
        "time": datetime.fromtimestamp(time.time() if at is None else at, UTC).isoformat(timespec="milliseconds"),
        "id": rid,
        "method": method,
        "route": route,
        "model": model,
        "status": status,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
        "timings": timings,
    }


def log(rid: str, method: str, route: str, model: str | None, status: int, bytes_in: int, bytes_out: int,
        timing: Timings | None) -> None:
    """Note one request's access line (a no-op when the access log is off): on the event loop it is
    formatted and written at the next flush, elsewhere at once. ``timing`` is read when the line is
    formatted: the request's phases must be final."""
    if _fd is None:
        return
    entry = (time.time(), rid, method, route, model, status, bytes_in, bytes_out, timing)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on a loop: write it now
        _write(_fd, _line(entry))
        return
    _pending.append(entry)
    if len(_pending) == MAX_PENDING:
        loop.call_soon(flush)  # once this response is on its way
        return
    global _timer_loop
    if _timer_loop is not loop:  # no flush pending on this loop (a closed loop's timer never fires)
        _timer_loop = loop
        loop.call_later(FLUSH_SECONDS, _timed_flush)


def _line(entry: tuple[Any, ...]) -> bytes:
    at, rid, method, route, model, status, bytes_in, bytes_out, timing = entry
    record = access_record(rid, method, route, model, status, bytes_in, bytes_out,
                           timing.milliseconds() if timing is not None else {}, at)
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


def _timed_flush() -> None:
    global _timer_loop
    _timer_loop = None
    flush()


def flush() -> None:
    """Format and write the lines noted since the last flush."""
    if _pending and _fd is not None:
        data = b"".join(_line(entry) for entry in _pending)
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
