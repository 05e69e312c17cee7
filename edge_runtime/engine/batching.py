"""Choosing which waiting rows share the next forward, as the model's grouping allows; and the sorted
greedy batches of the upstream runtimes that the parity pipelines (vela2, decision2) reproduce.

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

# Fixed-shape buckets ("buckets" grouping): widths are powers of two from 16 tokens up to the model's
# longest row (at most 2x the real tokens, few distinct shapes so that rows share them), and a
# fixed-rows bucket runs 32 rows (MiniLM's batch in the benches; a GPU forward of 32 rows costs about
# what one row does, issue 28).
SMALLEST_WIDTH = 16
BUCKET_ROWS = 32

# The upstream Vela 2.0 and Decision 2.0 runtimes' exact-profile batches (tokens = longest row x rows):
# 16,384 tokens on CPU (32,768 on GPU), 32 rows; their parity pipelines batch as they do.
GREEDY_TOKENS_CPU = 16_384
GREEDY_ROWS = 32


@dataclass(frozen=True)
class BatchLimits:
    """Caps on one forward: padded tokens (rows x longest row) and rows."""

    max_tokens: int = 16384
    max_rows: int = 64

    def __post_init__(self) -> None:
        if self.max_tokens < 1 or self.max_rows < 1:
            raise ValueError("batch limits must be >= 1")


@dataclass(frozen=True)
class Buckets:
    """Fixed forward shapes: a row pads to the first of ``widths`` that holds it, a batch holds rows
    of one width only, and with ``rows`` set every forward runs exactly that many rows (filled with
    copies of its first row, whose outputs are dropped). ``rows`` None: any row count up to the limits.
    """

    widths: tuple[int, ...]
    rows: int | None = None

    def __post_init__(self) -> None:
        if not self.widths or any(w < 1 for w in self.widths) or list(self.widths) != sorted(set(self.widths)):
            raise ValueError(f"bucket widths must be ascending positive integers, not {self.widths}")
        if self.rows is not None and self.rows < 1:
            raise ValueError(f"bucket rows must be >= 1, not {self.rows}")

    def width(self, length: int) -> int:
        """The width a row of ``length`` tokens pads to."""
        for w in self.widths:
            if length <= w:
                return w
        raise ValueError(f"a row of {length} tokens is longer than the widest bucket ({self.widths[-1]})")

    def describe(self) -> dict[str, object]:
        """The buckets as /v1/models shows them."""
        return {"widths": list(self.widths), "rows": self.rows}


def padded_width(longest: int, multiple: int = 1) -> int:
    """The width rows pad to: ``longest`` rounded up to a multiple of ``multiple`` (the session's
    ``row_multiple``: 1 leaves every width as it was)."""
    if multiple < 1:
        raise ValueError(f"the row multiple must be >= 1, not {multiple}")
    return -(-longest // multiple) * multiple


def power_of_two_widths(longest: int, smallest: int = SMALLEST_WIDTH) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``longest``, then ``longest`` itself (the widest row)."""
    if longest < 1:
        raise ValueError(f"the longest row must be >= 1 token, not {longest}")
    widths = []
    w = smallest
    while w < longest:
        widths.append(w)
        w *= 2
    return (*widths, longest)


def bucket_candidates(longest: int, limits: BatchLimits) -> tuple[Buckets, Buckets]:
    """The bucket groupings the probe tries, cheapest first: power-of-two widths with any row count,
    then the same widths at a fixed row count (a shape a GPU cannot choose its kernels by)."""
    widths = power_of_two_widths(longest)
    rows = max(1, min(BUCKET_ROWS, limits.max_rows, limits.max_tokens // widths[-1]))
    return Buckets(widths), Buckets(widths, rows)


def bucket_ceiling(shortest: int) -> int:
    """The longest row that may share a padded batch whose shortest row has `shortest` tokens."""
    return shortest + max(BUCKET_TOKENS, int(shortest * BUCKET_RATIO))


def plan_batch(lengths: Sequence[int], grouping: Grouping, limits: BatchLimits, pads: bool = True,
               buckets: Buckets | None = None, multiple: int = 1) -> list[int]:
    """Pick the rows of the next forward.

    `lengths` are the waiting rows' token counts in arrival order. Row 0, the oldest, is always
    in the batch, so no row waits forever. Returns indices into `lengths`; a single row longer
    than the token budget still runs (alone). ``pads`` False: the forward runs each row at its own
    length, so a "padded" batch is any rows, in arrival order, within the limits in real tokens.
    "buckets" needs ``buckets``: rows of row 0's bucket, in arrival order, up to its row count.
    ``multiple``: the forward's row multiple (Forward.row_multiple); a padded batch's token budget
    counts its width rounded up to it, as the forward pads it.
    """
    if not lengths:
        return []
    if grouping == "alone":
        return [0]
    if grouping == "equal_length":
        return _equal_length(lengths, limits, multiple)
    if grouping == "padded":
        return _padded(lengths, limits, multiple) if pads else _unpadded(lengths, limits)
    if grouping == "buckets":
        if buckets is None:
            raise ValueError("grouping 'buckets' needs the forward's buckets")
        return _bucketed(lengths, buckets, limits)
    raise ValueError(f"unknown grouping {grouping!r}")


def _fits(width: int, rows: int, limits: BatchLimits) -> bool:
    return rows <= limits.max_rows and width * rows <= limits.max_tokens


def _equal_length(lengths: Sequence[int], limits: BatchLimits, multiple: int) -> list[int]:
    target = lengths[0]
    width = padded_width(target, multiple)
    chosen = [0]
    for i in range(1, len(lengths)):
        if lengths[i] != target:
            continue
        if not _fits(width, len(chosen) + 1, limits):
            break
        chosen.append(i)
    return chosen


def _bucketed(lengths: Sequence[int], buckets: Buckets, limits: BatchLimits) -> list[int]:
    if lengths[0] > buckets.widths[-1]:
        return [0]  # no bucket holds it: alone, where the forward's error fails its job only
    width = buckets.width(lengths[0])
    most = limits.max_rows if buckets.rows is None else min(limits.max_rows, buckets.rows)
    chosen = [0]
    for i in range(1, len(lengths)):
        if len(chosen) >= most:
            break
        if lengths[i] > buckets.widths[-1] or buckets.width(lengths[i]) != width:
            continue
        # a fixed row count is the forward's shape whatever the rows: only the count caps it
        if buckets.rows is None and width * (len(chosen) + 1) > limits.max_tokens:
            break
        chosen.append(i)
    return chosen


def _padded(lengths: Sequence[int], limits: BatchLimits, multiple: int) -> list[int]:
    # Chunk the rows sorted by length (ties in arrival order) and run the chunk holding row 0.
    # Chunk boundaries depend only on the waiting rows, so planning is deterministic.
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    chunk: list[int] = []
    shortest = 0
    for i in order:
        width = lengths[i]
        if chunk and (width > bucket_ceiling(shortest)
                      or not _fits(padded_width(width, multiple), len(chunk) + 1, limits)):
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


def greedy_batches(lengths: Sequence[int], max_tokens: int = GREEDY_TOKENS_CPU, max_rows: int = GREEDY_ROWS
                   ) -> list[list[int]]:
    """Indices of sequences sorted by length, cut greedily while ``longest x rows <= max_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) >= max_rows or lengths[i] * (len(current) + 1) > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
