"""The preparation pool: request work that must never run on Sanic's event loop.

Parsing large bodies, validation, tokenization, readout and serializing large answers run here,
on a few threads owned by the runtime, so that /health/live and every other request keep being
answered while one request is prepared. A request whose body is small stays on the loop: the
thread hand-off costs more than its work (a few hundred microseconds of a sub-millisecond answer).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

# Bodies up to this many bytes are prepared on the loop. Measured: a 16 KiB decisions body
# parses, validates and tokenizes in well under a millisecond.
INLINE_BODY_BYTES = 16 * 1024

# True while the current request (a contextvar, so bundle tasks inherit it) must not use the loop.
_offloaded: contextvars.ContextVar[bool] = contextvars.ContextVar("offloaded", default=True)


def keep_inline(body_bytes: int) -> None:
    """Record the current request's body size: small bodies are prepared on the loop."""
    _offloaded.set(body_bytes > INLINE_BODY_BYTES)


def pool_threads() -> int:
    """Two threads per usable CPU, at least two: preparation is short and mostly releases the GIL."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(2, 2 * cpus)


class WorkPool:
    """A small thread pool for request preparation, with an inline path for small requests."""

    def __init__(self, threads: int | None = None) -> None:
        self._pool = ThreadPoolExecutor(threads or pool_threads(), thread_name_prefix="edge-prep")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: on a pool thread when the current request is large, else right here."""
        if not _offloaded.get():
            return fn(*args)
        loop = asyncio.get_running_loop()
        # copy_context: the pool thread sees the same request context (timing phases, offload flag).
        ctx = contextvars.copy_context()
        return await loop.run_in_executor(self._pool, partial(ctx.run, fn, *args))

    def close(self) -> None:
        """Finish what was handed over, then stop the threads."""
        self._pool.shutdown(wait=True, cancel_futures=False)
