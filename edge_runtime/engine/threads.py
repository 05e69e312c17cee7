"""Threads by measurement: each model's forward, timed at every power of two up to its thread budget
over a few sizes, served at the fastest count for each size.

ONNX Runtime fixes a session's intra-op threads when it is made, and a small forward loses more to
the threads' synchronisation than it gains from them (MiniLM int8 at batch 1: 1.55 ms on one thread
against 1.9 ms on two, docs/benchmarks.md), while a large one wants them all. So a CPU model with a
budget above one thread keeps a session per count it serves (engine/session.py ``GraphSession``),
and each forward takes the count measured fastest for its size. Numerics do not move: a count is
used only where its outputs were bit-identical to the budget's on every measured shape, so the
load-time probe's grouping holds whatever count a forward runs at.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .probe import bitwise_equal
from .session import GraphSession

log = logging.getLogger(__name__)

#: The forwards measured: (rows, tokens a row), lengths capped at the model's limit. One sentence is
#: 16-32 tokens, where one thread and two are closest (MiniLM int8: 1 thread wins at 16 and 32, ties
#: at 64), so that bucket is measured on its own.
SHAPES: tuple[tuple[int, int], ...] = ((1, 16), (1, 32), (1, 64), (1, 256), (8, 64), (32, 64))
#: Timed runs per count and shape (after one untimed), the counts taking turns so that a slow moment
#: of a shared machine falls on each count alike; the medians are compared.
RUNS = 7
#: A forward this long at the full budget is past where threads cost more than they give: it and every
#: larger shape take the budget unmeasured (a 30 s Whisper window would otherwise cost minutes of load).
LONG_FORWARD_MS = 20.0


@dataclass(frozen=True)
class ThreadChoice:
    """The measured plan: ``plan`` as GraphSession.use_threads takes it, each shape's median
    milliseconds by count, and the counts left out because their outputs differed."""

    plan: tuple[tuple[int, int], ...]
    timings: tuple[tuple[int, int, dict[int, float]], ...]  # (rows, tokens a row, {threads: ms})
    unequal: tuple[int, ...]

    def describe(self) -> dict[str, Any]:
        """The choice as /v1/models shows it (engine_args.threads_by_tokens)."""
        return {
            "plan": [{"up_to_tokens": most, "threads": threads} for most, threads in self.plan],
            "measured_ms": [{"rows": rows, "tokens": tokens, **{f"threads_{n}": round(ms, 3) for n, ms in by.items()}}
                            for rows, tokens, by in self.timings],
            **({"differing_counts": list(self.unequal)} if self.unequal else {}),
        }


def counts(budget: int) -> list[int]:
    """Every power of two below ``budget``, and the budget itself."""
    out, n = [], 1
    while n < budget:
        out.append(n)
        n *= 2
    return [*out, budget]


def choose_threads(session: GraphSession, forward: Callable[[Sequence[Any]], list[Any]],
                   make_row: Callable[[int], Any], max_tokens: int, batches: bool = True) -> ThreadChoice | None:
    """Measure ``forward`` at each count of the session's budget and return the plan, or None where
    there is nothing to choose (one thread, or not on the CPU). ``batches`` False: the model's rows
    run alone, so only one-row forwards are measured."""
    if session.device != "cpu" or session.threads <= 1:
        return None
    candidates = counts(session.threads)
    unequal: set[int] = set()
    timings = []
    shapes = [(r, min(n, max_tokens)) for r, n in SHAPES if batches or r == 1]
    for rows, length in sorted(dict.fromkeys(shapes), key=lambda s: s[0] * s[1]):
        batch = [make_row(length) for _ in range(rows)]
        with session.forced_threads(session.threads):
            started = time.perf_counter()
            reference = forward(batch)
            full_ms = (time.perf_counter() - started) * 1000.0
        if full_ms > LONG_FORWARD_MS:
            timings.append((rows, length, {session.threads: full_ms}))
            break
        runs: dict[int, list[float]] = {}
        for n in candidates:
            with session.forced_threads(n):
                if bitwise_equal(forward(batch), reference):
                    runs[n] = []
                else:
                    unequal.add(n)
        for _ in range(RUNS):
            for n, times in runs.items():
                with session.forced_threads(n):
                    started = time.perf_counter()
                    forward(batch)
                    times.append((time.perf_counter() - started) * 1000.0)
        timings.append((rows, length, {n: statistics.median(times) for n, times in runs.items()}))
    usable = [n for n in candidates if n not in unequal] or [session.threads]
    plan = _plan(timings, usable, session.threads)
    if unequal:
        log.warning("threads %s give other outputs than %d: not used", sorted(unequal), session.threads)
    return ThreadChoice(plan, tuple(timings), tuple(sorted(unequal)))


def _plan(timings: Sequence[tuple[int, int, dict[int, float]]], usable: Sequence[int],
          budget: int) -> tuple[tuple[int, int], ...]:
    """(most tokens, threads) from the smallest measured forward to the largest: each size takes its
    fastest usable count (a forward larger than every measured one takes the largest's)."""
    plan: list[tuple[int, int]] = []
    for rows, length, measured in sorted(timings, key=lambda t: t[0] * t[1]):
        best = min((n for n in usable if n in measured), key=lambda n: measured[n], default=budget)
        if plan and plan[-1][1] == best:
            plan[-1] = (rows * length, best)
        else:
            plan.append((rows * length, best))
    return tuple(plan)
