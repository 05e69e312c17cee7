"""Summaries of repeated timings: medians, percentiles, ratios, and the spread of per-round medians."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


def timed(call: Callable[[], object], n: int) -> list[float]:
    """Seconds each of ``n`` calls took (perf_counter)."""
    seconds = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return seconds


def median(values: Sequence[float]) -> float:
    """The median; raises ValueError on no values (a benchmark that measured nothing is a bug)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100), linear between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within 0..100, not {p}")
    return float(np.percentile(np.asarray(values, dtype=np.float64), p))


def ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, or None when the denominator is zero or either side is not finite."""
    if denominator == 0 or not math.isfinite(numerator) or not math.isfinite(denominator):
        return None
    return numerator / denominator


@dataclass(frozen=True)
class Summary:
    """All samples of one measurement over its rounds."""

    median: float
    p90: float
    round_low: float   # the lowest per-round median
    round_high: float  # the highest per-round median
    samples: int


def summarize(rounds: Sequence[Sequence[float]]) -> Summary:
    """Median and p90 over every sample, and the range of the per-round medians (the run's noise)."""
    samples = [v for r in rounds for v in r]
    round_medians = [median(r) for r in rounds if r]
    return Summary(
        median=median(samples),
        p90=percentile(samples, 90.0),
        round_low=min(round_medians),
        round_high=max(round_medians),
        samples=len(samples),
    )
