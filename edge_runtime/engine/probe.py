"""Load-time probe: which batch groupings leave every row's answer bit-identical to running it alone."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .batching import Buckets
from .forward import Grouping

log = logging.getLogger(__name__)

# Lengths as upstream probes them (docs/reference/upstream-runtime-digest.md §1.4): short to long, one repeated so an
# equal-length group exists.
PROBE_LENGTHS: tuple[int, ...] = (3, 9, 9, 17, 40, 130)


@dataclass(frozen=True)
class Trial:
    """One grouping the probe tried: whether every row came back bit-identical to the same row alone,
    and the largest absolute difference it measured (None when the batch could not run).

    Buckets are compared with rows alone at their bucket's shape (their answer in service);
    ``vs_own_length`` is how far that answer is from the row alone at its own length."""

    grouping: Grouping
    exact: bool
    max_abs_diff: float | None
    buckets: Buckets | None = None
    vs_own_length: float | None = None

    def describe(self) -> dict[str, Any]:
        """The trial as /v1/models shows it (engine_args.probe)."""
        out: dict[str, Any] = {"grouping": self.grouping, "exact": self.exact,
                               "max_abs_diff": finite_or_none(self.max_abs_diff)}
        if self.buckets is not None:
            out.update(self.buckets.describe(), max_abs_diff_vs_own_length=finite_or_none(self.vs_own_length))
        return out


@dataclass(frozen=True)
class ProbeResult:
    """The widest exact grouping found, its buckets (grouping "buckets" only) and every trial run."""

    grouping: Grouping
    buckets: Buckets | None
    trials: tuple[Trial, ...]

    def trial(self, grouping: Grouping) -> Trial | None:
        """The first trial of ``grouping``, if the probe ran one."""
        return next((t for t in self.trials if t.grouping == grouping), None)

    def describe(self) -> list[dict[str, Any]]:
        """Every trial, in the order run."""
        return [t.describe() for t in self.trials]


def probe_grouping(
    forward: Callable[[Sequence[Any]], list[Any]],
    make_row: Callable[[int], Any],
    lengths: Sequence[int] = PROBE_LENGTHS,
    max_tokens: int | None = None,
) -> Grouping:
    """The grouping :func:`probe` proves, without buckets (every caller but the loader's)."""
    return probe(forward, make_row, lengths, max_tokens).grouping


def probe(
    forward: Callable[[Sequence[Any]], list[Any]],
    make_row: Callable[[int], Any],
    lengths: Sequence[int] = PROBE_LENGTHS,
    max_tokens: int | None = None,
    buckets: Sequence[Buckets] = (),
) -> ProbeResult:
    """Find the widest grouping under which the model's rows answer exactly as they do alone.

    Runs one row per length alone, then each group of equal-length rows together, then all rows
    right-padded in one batch in reverse order, and compares every output bit for bit (dtype,
    shape and bytes). The grouping is "padded" when both batched runs match, "equal_length" when
    only the equal-length groups do; else each of ``buckets`` in turn (where the forward offers
    ``bucketed``, see :func:`probe_buckets`) and "buckets" for the first proven; else "alone".
    Lengths are capped at max_tokens. A batched run that raises counts as a mismatch; a row that
    fails alone is an error of the model and propagates. Every batched run also measures its
    largest difference from the rows alone, which is what an approximate grouping costs.

    make_row(n) should draw a new random row on every call. Identical rows in an equal-length
    group hide batch-dependent graphs (dynamic int8 quantizes with a scale over the whole batch),
    so such a group proves nothing: the answer is then "padded" or "alone", never "equal_length".
    """
    if not lengths:
        raise ValueError("probe lengths must not be empty")
    capped = [max(1, min(int(n), max_tokens)) if max_tokens is not None else max(1, int(n)) for n in lengths]
    if len(set(capped)) == len(capped):
        capped.append(capped[0])  # an equal-length group must exist to test equal_length
    rows = [make_row(n) for n in capped]
    alone = [_single(forward([row])) for row in rows]
    groups = [members for members in _by_length(capped).values() if len(members) > 1]

    distinct = all(not bitwise_equal(rows[m[0]], rows[i]) for m in groups for i in m[1:])
    if not distinct:
        log.warning("probe: make_row returned identical rows of one length; equal_length cannot be proven")
    equal = _trial("equal_length", [_batch(forward, rows, alone, list(reversed(m))) for m in groups])
    # the padded batch runs even when equal lengths already differ: its difference is what
    # `batching: padded` costs, shown in the card
    padded = _trial("padded", [_batch(forward, rows, alone, list(reversed(range(len(rows)))))])
    trials = [equal, padded]
    if equal.exact and padded.exact:
        return ProbeResult("padded", None, tuple(trials))
    if equal.exact and distinct:
        log.info("probe: right-padded rows change when batched; grouping 'equal_length'")
        return ProbeResult("equal_length", None, tuple(trials))
    if not equal.exact:
        log.info("probe: rows of equal length change when batched")
    bucketed: Callable[[Buckets], Callable[[Sequence[Any]], list[Any]]] | None = getattr(forward, "bucketed", None)
    for candidate in buckets if bucketed is not None else ():
        trial = _bucket_trial(bucketed, forward, make_row, candidate)
        trials.append(trial)
        if trial.exact:
            log.info("probe: rows in fixed-shape buckets %s answer as alone; grouping 'buckets'", candidate)
            return ProbeResult("buckets", candidate, tuple(trials))
    log.info("probe: grouping 'alone'")
    return ProbeResult("alone", None, tuple(trials))


def _bucket_trial(bucketed: Callable[[Buckets], Callable[[Sequence[Any]], list[Any]]] | None,
                  plain: Callable[[Sequence[Any]], list[Any]], make_row: Callable[[int], Any],
                  buckets: Buckets) -> Trial:
    if bucketed is None:
        return Trial("buckets", False, None, buckets)
    try:
        return probe_buckets(bucketed(buckets), plain, make_row, buckets)
    except Exception as exc:  # a shape the device cannot run (memory) is no grouping, not a failed model
        log.info("probe: buckets %s failed: %s", buckets, exc)
        return Trial("buckets", False, None, buckets)


def probe_buckets(
    bucketed: Callable[[Sequence[Any]], list[Any]],
    plain: Callable[[Sequence[Any]], list[Any]],
    make_row: Callable[[int], Any],
    buckets: Buckets,
) -> Trial:
    """Prove each bucket of ``buckets`` on its own rows: per width, rows of the shortest, a middle
    and the widest length in it (and a second, different row of the widest), each run alone through
    ``bucketed``, then all of them in reverse order and the first with the last: every row must come
    back bit-identical to itself alone. ``plain`` runs the same rows at their own length, for the
    trial's ``vs_own_length``."""
    results: list[tuple[bool, float | None]] = []
    own = 0.0
    previous = 0
    for width in buckets.widths:
        sizes = sorted({previous + 1, (previous + 1 + width) // 2, width}) + [width]
        previous = width
        rows = [make_row(n) for n in sizes]
        alone = [_single(bucketed([row])) for row in rows]
        own = max(own, max(max_abs_diff(_single(plain([row])), a) for row, a in zip(rows, alone)))
        orders = [list(reversed(range(len(rows)))), [0, len(rows) - 1]]
        if buckets.rows is not None:
            orders = [order[: buckets.rows] for order in orders]
        results += [_batch(bucketed, rows, alone, order) for order in orders]
    trial = _trial("buckets", results)
    return Trial("buckets", trial.exact, trial.max_abs_diff, buckets, own)


def _trial(grouping: Grouping, results: Sequence[tuple[bool, float | None]]) -> Trial:
    diffs = [d for _, d in results if d is not None]
    measured = max(diffs, default=0.0) if len(diffs) == len(results) else None
    return Trial(grouping, all(ok for ok, _ in results), measured)


def _by_length(lengths: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    return groups


def _single(outputs: list[Any]) -> Any:
    if len(outputs) != 1:
        raise ValueError(f"the forward returned {len(outputs)} results for 1 row")
    return outputs[0]


def _batch(
    forward: Callable[[Sequence[Any]], list[Any]], rows: list[Any], alone: list[Any], order: list[int]
) -> tuple[bool, float | None]:
    """Whether the rows in ``order``, as one batch, come back bit-identical to ``alone``, and the
    largest difference (None when the batch could not run)."""
    try:
        batched = forward([rows[i] for i in order])
    except Exception as exc:  # a graph that cannot batch is simply not batch-invariant
        log.info("probe: a batch of %d rows failed: %s", len(order), exc)
        return False, None
    if len(batched) != len(order):
        return False, None
    same = all(bitwise_equal(result, alone[i]) for i, result in zip(order, batched))
    try:
        diff = max(max_abs_diff(result, alone[i]) for i, result in zip(order, batched))
    except (TypeError, ValueError):  # outputs with no numeric difference: the figure is informative only
        diff = math.inf
    return same, diff


def bitwise_equal(a: Any, b: Any) -> bool:
    """True when two outputs are identical bit for bit: arrays by dtype, shape and bytes
    (stricter than np.array_equal: NaN payloads and the sign of zero count), containers element
    by element, dataclasses field by field, other values by ==."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        return (
            a_arr.dtype == b_arr.dtype
            and a_arr.shape == b_arr.shape
            and np.ascontiguousarray(a_arr).tobytes() == np.ascontiguousarray(b_arr).tobytes()
        )
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(bitwise_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(bitwise_equal(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return all(bitwise_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return bool(a == b)


def finite_or_none(value: float | None) -> float | None:
    """A difference as JSON can carry it: None for none measured or an incomparable (infinite) one."""
    return value if value is not None and math.isfinite(value) else None


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest absolute difference between two outputs of the same structure (as bitwise_equal
    walks them): numbers as float64, NaN against NaN 0; inf where the structures, shapes or
    non-numeric values differ."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.shape != b_arr.shape:
            return math.inf
        if not (np.issubdtype(a_arr.dtype, np.number) and np.issubdtype(b_arr.dtype, np.number)):
            return 0.0 if np.array_equal(a_arr, b_arr) else math.inf
        if a_arr.size == 0:
            return 0.0
        x, y = a_arr.astype(np.float64), b_arr.astype(np.float64)
        both_nan = np.isnan(x) & np.isnan(y)
        with np.errstate(invalid="ignore"):
            diff = np.where(both_nan | (x == y), 0.0, np.abs(x - y))  # equal infinities differ by 0
        return math.inf if np.isnan(diff).any() else float(diff.max())
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return math.inf
        return max((max_abs_diff(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return math.inf
        return max((max_abs_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        return max((max_abs_diff(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)),
                   default=0.0)
    if isinstance(a, int | float | np.number) and isinstance(b, int | float | np.number):
        return max_abs_diff(np.asarray(a), np.asarray(b))
    return 0.0 if a == b else math.inf
