"""What the text module hands to the families: token rows, or a per-item input error."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Where windows sit: ``end``, the last one ends at the content's end, full width (it may share more than
#: ``overlap`` with the one before); ``stride``, every one starts a stride after the one before and the last
#: runs short (upstream's task heads, whose operating points were calibrated that way).
PLACEMENTS = ("end", "stride")


@dataclass(frozen=True)
class Window:
    """Read an input in rows of ``tokens`` tokens (specials included), ``overlap`` shared, placed by
    ``placement`` (one of PLACEMENTS)."""

    tokens: int
    overlap: int
    placement: str = "end"


@dataclass
class EncodedRow:
    """One model input row.

    ``sequence_starts[s]`` is the index, within sequence s's own tokens, of this row's first token
    of it: 0 unless s is the windowed sequence.
    """

    ids: np.ndarray  # int64 [n], specials included
    type_ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2] code-point offsets into its own text, end exclusive; specials (0, 0)
    sequence_ids: list[int | None]  # 0 text, 1 pair, None special
    sequence_starts: tuple[int, ...] = field(default=(0,))


@dataclass
class Encoded:
    """An input as rows, and how much of it they hold.

    ``tokens`` counts the input's tokens as one row would hold them whole (specials included); it
    is a lower bound, and ``tokens_lower_bound`` is True, when the text was read only in part.
    ``processed`` counts the tokens the rows read, each once (fewer than ``tokens`` when truncated).
    ``windows`` holds each window's ``(start, end)`` in the windowed sequence's content tokens when
    the input was read under overflow ``window`` (one window when it fits), else None.
    """

    rows: list[EncodedRow]
    tokens: int
    tokens_lower_bound: bool
    processed: int
    windows: list[tuple[int, int]] | None = None

    @property
    def truncated(self) -> bool:
        """True when the rows leave some of the input unread."""
        return self.tokens_lower_bound or self.processed < self.tokens


@dataclass
class InputError:
    """A per-item failure: ``max_length_exceeded`` or ``scan_budget_exceeded``."""

    code: str
    message: str


MAX_LENGTH_EXCEEDED = "max_length_exceeded"
SCAN_BUDGET_EXCEEDED = "scan_budget_exceeded"
