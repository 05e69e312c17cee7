"""Load-time probe: which batch groupings leave every row's answer bit-identical to running it alone."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .forward import Grouping

log = logging.getLogger(__name__)

# Lengths as upstream probes them (docs/reference/upstream-runtime-digest.md §1.4): short to long, one repeated so an
# equal-length group exists.
PROBE_LENGTHS: tuple[int, ...] = (3, 9, 9, 17, 40, 130)


def probe_grouping(
    forward: Callable[[Sequence[Any]], list[Any]],
    make_row: Callable[[int], Any],
    lengths: Sequence[int] = PROBE_LENGTHS,
    max_tokens: int | None = None,
) -> Grouping:
    """Find the widest grouping under which the model's rows answer exactly as they do alone.

    Runs one row per length alone, then each group of equal-length rows together, then all rows
    right-padded in one batch in reverse order, and compares every output bit for bit (dtype,
    shape and bytes). Returns "padded" when both batched runs match, "equal_length" when only the
    equal-length groups do, else "alone". Lengths are capped at max_tokens. A batched run that
    raises counts as a mismatch; a row that fails alone is an error of the model and propagates.

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
    equal_ok = all(_batch_matches(forward, rows, alone, list(reversed(m))) for m in groups)
    if not equal_ok:
        log.info("probe: rows of equal length change when batched; grouping 'alone'")
        return "alone"
    if _batch_matches(forward, rows, alone, list(reversed(range(len(rows))))):
        return "padded"
    if not distinct:
        return "alone"
    log.info("probe: right-padded rows change when batched; grouping 'equal_length'")
    return "equal_length"


def _by_length(lengths: Sequence[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        groups.setdefault(n, []).append(i)
    return groups


def _single(outputs: list[Any]) -> Any:
    if len(outputs) != 1:
        raise ValueError(f"the forward returned {len(outputs)} results for 1 row")
    return outputs[0]


def _batch_matches(
    forward: Callable[[Sequence[Any]], list[Any]], rows: list[Any], alone: list[Any], order: list[int]
) -> bool:
    try:
        batched = forward([rows[i] for i in order])
    except Exception as exc:  # a graph that cannot batch is simply not batch-invariant
        log.info("probe: a batch of %d rows failed: %s", len(order), exc)
        return False
    if len(batched) != len(order):
        return False
    return all(bitwise_equal(result, alone[i]) for i, result in zip(order, batched))


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
