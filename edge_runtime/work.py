"""The preparation pool: request work that must never run on Sanic's event loop.

Decoding compressed bodies, parsing large bodies, validation, tokenization, media decoding,
readout and serializing large answers run here, on a few threads owned by the runtime, so that
/health/live and every other request keep being answered while one request is prepared. A request
whose body is small stays on the loop: the thread hand-off costs more than its work (a few hundred
microseconds of a sub-millisecond answer). Media never stays on the loop: what an image or a video
costs to decode is not bounded by its bytes (a 12 KB PNG may claim four million pixels).

The queue of jobs waiting for a thread is bounded: a job that would wait behind ``max_queue``
others is refused at once (the runtime makes that the contract's overloaded, as a full model
queue is: api/statuses.py gives it its status), except the jobs that finish an answer already paid for.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")

# Bodies up to this many bytes are prepared on the loop. Measured: a 16 KiB decisions body
# parses, validates and tokenizes in well under a millisecond; a compressed body whose decoded
# form fits in it decodes in 15-110 us, a hand-off costs 30-120 us (docs/benchmarks.md).
INLINE_BODY_BYTES = 16 * 1024

# True while the current request (a contextvar, so bundle tasks inherit it) must not use the loop.
_offloaded: contextvars.ContextVar[bool] = contextvars.ContextVar("offloaded", default=True)
# True inside a request admitted whole (a bundle, once read): its tasks' jobs are bounded by the
# request's own limit (--max-bundle-tasks) and are never refused one by one for a full queue, where
# they would crowd out their own siblings; they still count in the queues, so other requests see them.
_admitted_whole: contextvars.ContextVar[bool] = contextvars.ContextVar("admitted_whole", default=False)


def keep_inline(body_bytes: int) -> None:
    """Record the current request's body size: small bodies are prepared on the loop."""
    _offloaded.set(body_bytes > INLINE_BODY_BYTES)


def admit_whole() -> None:
    """Admit the current request whole: the tasks it starts (which inherit the context) are not refused."""
    _admitted_whole.set(True)


def admitted_whole() -> bool:
    """Whether the current request was admitted whole (see admit_whole)."""
    return _admitted_whole.get()


def offloaded() -> bool:
    """Whether the current request's work goes to the pool (its body is large, or not read yet)."""
    return _offloaded.get()


def pool_threads(cpus: int | None = None) -> int:
    """Two threads per CPU the process may use (``cpus``, else the usable CPUs), at least two:
    preparation is short and mostly releases the GIL."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            cpus = os.cpu_count() or 1
    return max(2, 2 * cpus)


class PoolFull(Exception):
    """A job found ``max_queue`` jobs already waiting for a preparation thread."""


class WorkPool:
    """A small thread pool for request preparation, with an inline path for small requests.

    ``max_queue`` bounds the jobs waiting for a thread (``--max-prep-queue``, config.py).
    ``refuse`` is the exception type raised (with a message) for a job that finds the queue full;
    the runtime passes the engine's ``Overloaded``, which the status table answers as overloaded.
    """

    def __init__(self, threads: int | None = None, *, max_queue: int,
                 refuse: Callable[[str], Exception] = PoolFull) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, not {max_queue}")
        self.threads = threads or pool_threads()
        self.max_queue = max_queue
        self._refuse = refuse
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="edge-prep")
        # Jobs handed over and not yet started by a thread: the loop adds, the threads take away.
        self._waiting = 0
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Jobs waiting for a preparation thread now (the /metrics gauge reads it at scrape time)."""
        return self._waiting

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``: on a pool thread when the current request is large, else right here.

        Raises ``refuse`` when the job would have to wait behind ``max_queue`` others.
        """
        if not _offloaded.get():
            return fn(*args)
        return await self._submit(fn, args, refusable=not _admitted_whole.get())

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a pool thread whatever the body's size (decoding compressed bodies and
        media); raises ``refuse`` when the queue is full."""
        return await self._submit(fn, args, refusable=not _admitted_whole.get())

    async def finish(self, fn: Callable[..., T], *args: Any) -> T:
        """As :meth:`run`, never refused: the readout and serializing of an answer whose forward
        already ran (refusing them would throw that work away)."""
        if not _offloaded.get():
            return fn(*args)
        return await self._submit(fn, args, refusable=False)

    async def _submit(self, fn: Callable[..., T], args: tuple[Any, ...], refusable: bool) -> T:
        with self._lock:
            if refusable and self._waiting >= self.max_queue:
                raise self._refuse(f"the preparation queue is full: {self._waiting} waiting for "
                                   f"{self.threads} threads, at most {self.max_queue}")
            self._waiting += 1
        # Whichever comes first, the thread starting the job or the caller giving up on it (a
        # cancelled job may never start), takes it off the waiting count, once.
        taken = [False]

        def stop_waiting() -> None:
            with self._lock:
                if not taken[0]:
                    taken[0] = True
                    self._waiting -= 1

        def started() -> T:
            stop_waiting()
            return fn(*args)

        loop = asyncio.get_running_loop()
        # copy_context: the pool thread sees the same request context (timing phases, offload flag).
        ctx = contextvars.copy_context()
        try:
            return await loop.run_in_executor(self._pool, partial(ctx.run, started))
        finally:
            stop_waiting()

    def close(self) -> None:
        """Finish what was handed over, then stop the threads."""
        self._pool.shutdown(wait=True, cancel_futures=False)
