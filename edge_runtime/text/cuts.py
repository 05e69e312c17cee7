"""Where to cut a long text so that the tokens before the cut are the ones the whole text gives.

A cut ends the prefix that is tokenized; the keep limit says which of the prefix's tokens are
exact: those that end at or before it.

- At a boundary: the cut goes before a boundary character (of an enabled class) at most
  ``target`` characters in. The exact tokens are those before the last word start at least
  ``lookback`` characters before the cut (more than the longest added token or vocabulary entry),
  so the tokenizer saw every word they belong to whole, with context to spare.
- Inside a run with no boundary in the last ``RUN_WINDOW`` characters (base64, hex, Chinese for a
  tokenizer that splits only at spaces): the cut goes before a letter or digit that NFC never
  composes with its predecessor, and the exact tokens are those ending ``RUN_MARGIN`` characters
  before it.
- When cuts inside runs are off, the run is read whole: the cut moves to the first boundary
  ``lookback`` characters past the run's end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from edge_runtime.text.chars import CutClass, boundary_pattern, is_run_cut, starts_cleanly

RUN_MARGIN = 1024  # characters of context kept after the last exact token of a cut inside a run
RUN_WINDOW = 4096  # a run is a stretch this long with no boundary before the target
MIN_LOOKBACK = 16


def lookback_for(longest_added_chars: int, longest_token_chars: int = 0) -> int:
    """Context after the last kept word: enough for any added token to be matched whole, and for
    any token to end before the cut when the cut falls inside one pre-token (a BPE run of '='s or
    emoji merges into tokens as long as its vocabulary's longest)."""
    return max(MIN_LOOKBACK, longest_added_chars + 1, longest_token_chars + 1)


@dataclass(frozen=True)
class Cut:
    """Tokenize ``text[:end]``; its tokens that end at or before ``keep`` are exact."""

    end: int
    keep: int


class Cutter:
    """Cuts for one set of enabled cut classes."""

    def __init__(self, classes: Iterable[CutClass], lookback: int) -> None:
        self.classes = frozenset(classes)
        self.run = CutClass.RUN in self.classes
        self.lookback = lookback
        self._pattern = boundary_pattern(self.classes - {CutClass.RUN})

    @property
    def cuts_at_all(self) -> bool:
        return self._pattern is not None or self.run

    def _last_boundary(self, text: str, lo: int, hi: int) -> int | None:
        """The last position p in [lo, hi) where a boundary character stands."""
        if self._pattern is None or hi <= lo:
            return None
        last = None
        for m in self._pattern.finditer(text, lo, hi):
            last = m.start()
        return last

    def _last_boundary_before(self, text: str, hi: int, lo: int = 0) -> int | None:
        """The last boundary in [lo, hi), searching back in growing steps (most are a few
        characters away)."""
        step = 32
        while hi > lo:
            start = max(lo, hi - step)
            p = self._last_boundary(text, start, hi)
            if p is not None:
                return p
            hi = start
            step = min(step * 4, RUN_WINDOW)
        return None

    def _next_boundary(self, text: str, start: int) -> int | None:
        if self._pattern is None:
            return None
        m = self._pattern.search(text, start)
        return m.start() if m else None

    def keep_limit(self, text: str, end: int) -> int:
        """The last word start (or boundary) at least ``lookback`` characters before ``end``."""
        x = end - self.lookback
        if x <= 0:
            return 0
        b = self._last_boundary_before(text, x + 1)
        if b is None:
            return 0
        # the character after the last boundary starts a word (it is not a boundary itself)
        if b + 1 <= x and starts_cleanly(text[b + 1]):
            return b + 1
        return b

    def _run_cut(self, text: str, target: int) -> int | None:
        stop = max(RUN_MARGIN, target - RUN_WINDOW)
        for q in range(target, stop, -1):
            if is_run_cut(text[q]):
                return q
        return None

    def plan(self, text: str, target: int) -> Cut | None:
        """A cut for a prefix of about ``target`` characters; None means read the whole text."""
        if target >= len(text) or not self.cuts_at_all:
            return None
        p = self._last_boundary_before(text, target + 1, max(1, target - RUN_WINDOW))
        if p is not None:
            return Cut(p, self.keep_limit(text, p))
        if self.run:
            q = self._run_cut(text, target)
            if q is not None:
                return Cut(q, q - RUN_MARGIN)
        # read the run whole: cut at a boundary far enough past its end to keep it
        run_end = self._next_boundary(text, target)
        if run_end is None:
            return None
        end = self._next_boundary(text, run_end + self.lookback)
        if end is None:
            return None
        return Cut(end, self.keep_limit(text, end))
