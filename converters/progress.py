"""Progress lines on stderr, so that stdout stays free for results."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    """Print one progress line to stderr, prefixed with the converter's name."""
    print(f"[converters] {message}", file=sys.stderr, flush=True)


class Step:
    """A context manager that logs a step and how long it took."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seconds = 0.0

    def __enter__(self) -> Step:
        log(f"{self.what} ...")
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.seconds = time.perf_counter() - self._t0
        if exc_type is None:
            log(f"{self.what}: done in {self.seconds:.1f} s")
