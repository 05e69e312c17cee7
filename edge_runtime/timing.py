"""Per-request phase timings, reported in the Server-Timing header and in meta.timings."""

from __future__ import annotations

import time

PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


class _Phase:
    """A timed block (a class, not contextlib.contextmanager: a third of the cost, ~0.4 us, and
    sub-millisecond requests time five of them)."""

    __slots__ = ("_seconds", "_name", "_start")

    def __init__(self, seconds: dict[str, float], name: str) -> None:
        self._seconds = seconds
        self._name = name

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._seconds[self._name] += time.perf_counter() - self._start


class Timing:
    """Accumulates seconds per phase from the handler's start; `total` is stamped at the end."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def phase(self, name: str) -> _Phase:
        """``with timing.phase(name):`` adds the block's seconds to ``name``, also when it raises."""
        return _Phase(self.seconds, name)

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
