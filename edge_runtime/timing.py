"""Per-request phase timings, reported in the Server-Timing header and in meta.timings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


class Timing:
    """Accumulates seconds per phase from the handler's start; `total` is stamped at the end."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def set_model_phases(self, queue: float, forward: float, post: float) -> None:
        """A bundle reports the queue, forward and post of the model group answered last."""
        self.seconds["queue"], self.seconds["forward"], self.seconds["post"] = queue, forward, post

    def finish(self) -> None:
        self.seconds["total"] = time.perf_counter() - self.started

    def milliseconds(self, phases: tuple[str, ...] = PHASES) -> dict[str, float]:
        return {p: round(self.seconds[p] * 1000.0, 3) for p in phases}

    def header(self) -> str:
        """The Server-Timing header value, durations in ms with 3 decimals."""
        return ", ".join(f"{p};dur={self.seconds[p] * 1000.0:.3f}" for p in PHASES)
