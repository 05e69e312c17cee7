"""The Forward protocol (what a family hands the engine) and the batch grouping kinds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

# How rows of concurrent jobs may share a forward without changing any row's answer:
#   "padded"        any rows together, right-padded (sorted into length buckets for speed)
#   "equal_length"  only rows of identical length together (no padding)
#   "alone"         every row is its own forward
Grouping = Literal["padded", "equal_length", "alone"]
GROUPINGS: tuple[Grouping, ...] = ("padded", "equal_length", "alone")


@runtime_checkable
class Forward(Protocol):
    """Runs one batch of rows through a model; supplied by the family.

    A forward whose rows each run at their own length (nothing is padded to the longest row) may
    set ``pads = False``: its "padded" batches then take waiting rows in arrival order up to the
    limits in real tokens, with no length buckets (which only save padding). Absent, it pads.
    """

    def __call__(self, rows: Sequence[Any]) -> list[Any]:
        """Return one result per row, in the order of `rows`."""
        ...

    def length(self, row: Any) -> int:
        """The row's token count, used for grouping, token budgets and metrics."""
        ...
