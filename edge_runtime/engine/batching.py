"""Choosing which waiting rows share the next forward, as the model's grouping allows.

Pure functions over row lengths, so the policy is testable without threads or models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .forward import Grouping

# A padded batch only holds rows whose lengths lie within max(16 tokens, 25 %) of its shortest
# row. Measured on MiniLM (docs/reference/feasibility-notes.md A.3): length-sorted chunks / 16-token buckets ran
# 1.6x faster than padding 32 mixed rows to the longest, which computes ~2x the real tokens.
BUCKET_TOKENS = 16
BUCKET_RATIO = 0.25


@dataclass(frozen=True)
class BatchLimits:
    """Caps on one forward: padded tokens (rows x longest row) and rows."""

    max_tokens: int = 16384
    max_rows: int = 64

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_rows < 1:
            raise ValueError("batch limits must be >= 1")


def bucket_ceiling(shortest: int) -> int:
    """The longest row that may share a padded batch whose shortest row has `shortest` tokens."""
    return shortest + max(BUCKET_TOKENS, int(shortest * BUCKET_RATIO))


def plan_batch(lengths: Sequence[int], grouping: Grouping, limits: BatchLimits, pads: bool = True) -> list[int]:
    """Pick the rows of the next forward.

    `lengths` are the waiting rows' token counts in arrival order. Row 0, the oldest, is always
    in the batch, so no row waits forever. Returns indices into `lengths`; a single row longer
    than the token budget still runs (alone). ``pads`` False: the forward runs each row at its own
    length, so a "padded" batch is any rows, in arrival order, within the limits in real tokens.
    """
    if not lengths:
        return []
    if grouping == "alone":
        return [0]
    if grouping == "equal_length":
        return _equal_length(lengths, limits)
    if grouping == "padded":
        return _padded(lengths, limits) if pads else _unpadded(lengths, limits)
    raise ValueError(f"unknown grouping {grouping!r}")


def _fits(width: int, rows: int, limits: BatchLimits) -> bool:
    return rows <= limits.max_rows and width * rows <= limits.max_tokens


def _equal_length(lengths: Sequence[int], limits: BatchLimits) -> list[int]:
    target = lengths[0]
    chosen = [0]
    for i in range(1, len(lengths)):
        if lengths[i] != target:
            continue
        if not _fits(target, len(chosen) + 1, limits):
            break
        chosen.append(i)
    return chosen


def _padded(lengths: Sequence[int], limits: BatchLimits) -> list[int]:
    # Chunk the rows sorted by length (ties in arrival order) and run the chunk holding row 0.
    # Chunk boundaries depend only on the waiting rows, so planning is deterministic.
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    chunk: list[int] = []
    shortest = 0
    for i in order:
        width = lengths[i]
        if chunk and (width > bucket_ceiling(shortest) or not _fits(width, len(chunk) + 1, limits)):
            if 0 in chunk:
                return chunk
            chunk = []
        if not chunk:
            shortest = width
        chunk.append(i)
    return chunk


def _unpadded(lengths: Sequence[int], limits: BatchLimits) -> list[int]:
    chosen: list[int] = []
    tokens = 0
    for i, n in enumerate(lengths):
        if chosen and (len(chosen) >= limits.max_rows or tokens + n > limits.max_tokens):
            break
        chosen.append(i)
        tokens += n
    return chosen
