"""The CPU cores every model's forwards share: a forward of T intra-op threads runs once T cores are free.

ONNX Runtime's intra-op threads spin between kernels (and after a forward) so that a lone forward does
not wait for wake-ups; several forwards at once, each spinning its threads, oversubscribe the cores and
all of them crawl. Measured on 2 vCPUs with six Vela 1.0 specialists of two threads each: one text 33 ms,
but a bundle of six (their forwards at once) 293 ms, where one after another takes about 190. The gate
admits forwards in arrival order while their threads fit the cores; one wider than the cores runs alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["CoreGate"]


class CoreGate:
    """``cores`` shared by forwards that each hold as many as they have threads, first come first served."""

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)
        self.used = 0
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()

    @contextmanager
    def held(self, threads: int) -> Iterator[None]:
        """Wait until ``threads`` cores are free and every earlier waiter has gone in, hold them inside."""
        want = min(max(1, threads), self.cores)
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._queue[0] is not ticket or self.used + want > self.cores:
                self._cond.wait()
            self._queue.popleft()
            self.used += want
            self._cond.notify_all()  # the next in line may fit beside this one
        try:
            yield
        finally:
            with self._cond:
                self.used -= want
                self._cond.notify_all()
