"""The Forward protocol (what a family hands the engine) and the batch grouping kinds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

# How rows of concurrent jobs may share a forward without changing any row's answer:
#   "padded"        any rows together, right-padded (sorted into length buckets for speed)
#   "equal_length"  only rows of identical length together (no padding)
#   "buckets"       every forward has a fixed shape: rows padded to a bucket width (batching.Buckets),
#                   only rows of one bucket together, and (where the buckets fix it) a fixed row count,
#                   so a GPU whose kernels depend on the shape still computes each row the same way
#   "alone"         every row is its own forward
Grouping = Literal["padded", "equal_length", "buckets", "alone"]
GROUPINGS: tuple[Grouping, ...] = ("padded", "equal_length", "buckets", "alone")


@runtime_checkable
class Forward(Protocol):
    """Runs one batch of rows through a model; supplied by the family.

    A forward whose rows each run at their own length (nothing is padded to the longest row) may
    set ``pads = False``: its "padded" batches then take waiting rows in arrival order up to the
    limits in real tokens, with no length buckets (which only save padding). Absent, it pads.

    A forward that can run fixed shapes offers ``bucketed(buckets) -> Forward``: the same forward
    with every batch padded to its bucket's width (and row count); the probe tries it where
    padded batches are not exact, and a bucketed forward carries its ``buckets`` for the planner.

    A forward that pads rows to a sequence width rounds that width up to its session's
    ``row_multiple`` (engine/cpu.py: 8 on ARM cores without SVE, else 1), alone and batched alike, and
    may carry ``row_multiple`` so that the planner counts the padded width in its token budget.
    """

    def __call__(self, rows: Sequence[Any]) -> list[Any]:
        """Return one result per row, in the order of `rows`."""
        ...

    def length(self, row: Any) -> int:
        """The row's token count, used for grouping, token budgets and metrics."""
        ...
