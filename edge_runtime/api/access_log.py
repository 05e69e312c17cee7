"""Structured access log: one JSON object per line per request, on stderr.

A line holds the time (UTC, ISO 8601), the request id, method, route, model (as the request named
it, when it named one), status, bytes in (the body as sent) and out, and the Server-Timing phases
in milliseconds. It never holds a header, a body or a key. ``serve --no-access-log`` turns it off.

Lines go to the descriptor with ``os.write`` rather than through ``logging``: the logging module's
record, caller lookup, lock and flush cost about as much as a whole sparrow-nano readout, on every
request. On the event loop a request leaves only its :class:`Access` (the fields as taken, the
Timing unread); lines are formatted and written together, as nginx's ``access_log ... flush=`` does:
FLUSH_SECONDS after the first of them, at once when PENDING_LINES wait, or at exit. A write per
request would sit in the next request's path (the loop reads a waiting request before it runs its
callbacks), and a line formatted per request is code that this VM runs cold between requests,
several times its cost in a hot loop; formatted together, lines cost a few microseconds each. A hard
kill loses at most FLUSH_SECONDS of lines. Each write holds whole lines, at most PIPE_BUF bytes, so
lines stay whole beside the other log lines on stderr.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import select
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from edge_runtime.timing import Timing

FLUSH_SECONDS = 0.05
PENDING_LINES = 16  # about PIPE_BUF's worth of lines: written in one piece
_fd: int | None = None  # where lines go; None: the access log is off (the default until configured)
_pending: list[Access] = []  # requests answered on the event loop whose lines are not yet written
_timer_loop: asyncio.AbstractEventLoop | None = None  # the loop a timed flush is pending on


def configure(enabled: bool, fd: int = 2) -> None:
    """Write access lines to ``fd`` (stderr), or drop them."""
    global _fd
    _fd = fd if enabled else None


def enabled() -> bool:
    """Whether access lines are written (``serve --no-access-log`` turns them off)."""
    return _fd is not None


@dataclass(slots=True)
class Access:
    """What one request's access line says, as taken when it was answered."""

    rid: str
    method: str
    route: str
    model: str | None
    status: int
    bytes_in: int
    bytes_out: int
    timing: Timing | None  # the surfaces' Server-Timing phases, read when the line is formatted
    at: float = field(default_factory=time.time)  # when it was answered

    def fields(self) -> dict[str, Any]:
        """The line's fields: time in UTC ISO 8601 (ms), timings in ms ({} for routes without phases)."""
        return {
            "time": datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds"),
            "id": self.rid,
            "method": self.method,
            "route": self.route,
            "model": self.model,
            "status": self.status,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "timings": self.timing.milliseconds() if self.timing is not None else {},
        }

    def line(self) -> bytes:
        return orjson.dumps(self.fields(), option=orjson.OPT_APPEND_NEWLINE)


def write(access: Access) -> None:
    """Write one request's access line (a no-op when the access log is off)."""
    if _fd is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on a loop: write it now
        _write(_fd, access.line())
        return
    _pending.append(access)
    if len(_pending) >= PENDING_LINES:
        flush()
        return
    global _timer_loop
    if _timer_loop is not loop:  # no flush pending on this loop (a closed loop's timer never fires)
        _timer_loop = loop
        loop.call_later(FLUSH_SECONDS, _timed_flush)


def _timed_flush() -> None:
    global _timer_loop
    _timer_loop = None
    flush()


def flush() -> None:
    """Write the lines of the requests answered since the last flush."""
    if _pending and _fd is not None:
        data = b"".join(access.line() for access in _pending)
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
