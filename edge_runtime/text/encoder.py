"""TextEncoder: a text (or pair) in, token rows within a budget out, or an item error.

Budgets count content plus specials. Overflow policies:

- ``reject``: more tokens than ``max_tokens`` is ``max_length_exceeded``.
- ``truncate``: keep the first tokens; a pair truncates longest-first, or only its first text
  (``only_first``).
- ``window``: rows of ``window.tokens`` tokens (specials included) stepping by
  ``window.tokens - specials - overlap``, the last ending at the content's end. The input is read
  up to its scan budget (``scan_tokens``, else ``max_tokens``); more is ``scan_budget_exceeded``
  and none of it is read. A pair windows its longer sequence (the second on a tie) and repeats
  the other whole in every row.

Long texts are read only as far as the budget decides (edge_runtime.text.bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.text.bounds import BudgetReader, Tokens
from edge_runtime.text.probe import ProbeReport
from edge_runtime.text.tokenizer import Envelope, Layout, TokenizerTraits, analyze, load_tokenizer
from edge_runtime.text.types import (
    MAX_LENGTH_EXCEEDED,
    SCAN_BUDGET_EXCEEDED,
    Encoded,
    EncodedRow,
    InputError,
    Window,
)
from edge_runtime.text.windows import longest_first, window_starts

Overflow = Literal["reject", "truncate", "window"]
_I64 = np.int64


def _plural(n: int, word: str = "token") -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


class TextEncoder:
    """Tokenizes inputs for one model, within its budgets."""

    def __init__(self, tokenizer_path: Path, max_input_tokens: int) -> None:
        """Load ``tokenizer_path`` (padding and truncation baked into the file are turned off)."""
        self._setup(load_tokenizer(Path(tokenizer_path)), max_input_tokens)

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, max_input_tokens: int) -> TextEncoder:
        """Wrap an already loaded tokenizer; its padding and truncation are turned off."""
        self = cls.__new__(cls)
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._setup(tokenizer, max_input_tokens)
        return self

    def _setup(self, tokenizer: Tokenizer, max_input_tokens: int) -> None:
        if max_input_tokens < 1:
            raise ValueError("max_input_tokens must be at least 1")
        self.tokenizer = tokenizer
        self.max_input_tokens = int(max_input_tokens)
        self.traits: TokenizerTraits = analyze(tokenizer)
        self.envelope = Envelope.probe(tokenizer)
        self._reader = BudgetReader(tokenizer, self.traits)

    # -- facts --------------------------------------------------------------------------------

    def num_special_tokens(self, pair: bool = False) -> int:
        """Specials the post-processor adds around a text (or a pair)."""
        return (self.envelope.pair if pair else self.envelope.single).specials

    @property
    def chars_per_token(self) -> int | None:
        """Most characters one token covers; None when the tokenizer drops or folds characters.

        Probes the tokenizer on first use."""
        return self._reader.chars_per_token

    def cut_report(self) -> ProbeReport:
        """Which cut classes this tokenizer passed (probes it on first use)."""
        return self._reader.report()

    # -- encode -------------------------------------------------------------------------------

    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        max_tokens: int,
        overflow: Overflow = "reject",
        window: Window | None = None,
        scan_tokens: int | None = None,
        only_first: bool = False,
    ) -> Encoded | InputError:
        """Token rows for ``text`` (and ``pair``) within the budget, or why the item cannot be read.

        ``max_tokens`` is capped at the model's ``max_input_tokens`` for reject and truncate; with
        ``window`` it is the scan budget unless ``scan_tokens`` is given, and ``window.tokens`` is
        capped at ``max_input_tokens``. ``only_first``: truncate cuts only the text, never the pair
        (the tokenizers library's ``only_first``); a pair that alone does not fit is max_length_exceeded.
        """
        if overflow == "window":
            if window is None:
                raise ValueError("overflow 'window' needs a window")
            scan = scan_tokens if scan_tokens is not None else max_tokens
            return self._windows(text, pair, window, scan)
        if overflow not in ("reject", "truncate"):
            raise ValueError(f"unknown overflow {overflow!r}")
        budget = min(int(max_tokens), self.max_input_tokens)
        layout = self.envelope.pair if pair is not None else self.envelope.single
        room = budget - layout.specials
        if room < 0:
            return InputError(
                MAX_LENGTH_EXCEEDED,
                f"a budget of {_plural(budget)} leaves no room for the {_plural(layout.specials, 'special token')}",
            )
        if overflow == "reject":
            return self._reject(text, pair, layout, budget, room)
        if only_first and pair is not None:
            return self._truncate_first(text, pair, layout, room)
        return self._truncate(text, pair, layout, room)

    def _too_many_chars(self, chars: int, room: int) -> bool:
        """True when ``chars`` characters surely give more than ``room`` tokens (no tokenizing)."""
        bound = self.traits.chars_per_token  # from the file; the probe can only withdraw it
        if bound is None or chars <= room * bound:
            return False
        bound = self._reader.chars_per_token
        return bound is not None and chars > room * bound

    def _reject(self, text: str, pair: str | None, layout: Layout, budget: int, room: int) -> Encoded | InputError:
        chars = len(text) + (len(pair) if pair is not None else 0)
        if self._too_many_chars(chars, room):
            return InputError(
                MAX_LENGTH_EXCEEDED,
                f"the input has {_plural(chars, 'character')}, more than {_plural(budget)} can hold "
                f"(a token of this model covers at most {self.chars_per_token} characters)",
            )
        seqs = [self._reader.read(text, room + 1)]
        complete = seqs[0].complete
        if pair is not None:
            if len(seqs[0]) <= room:
                seqs.append(self._reader.read(pair, room - len(seqs[0]) + 1))
                complete = complete and seqs[1].complete
            else:
                complete = False  # the pair was not read at all
        total = sum(len(s) for s in seqs) + layout.specials
        if total > budget:
            amount = _plural(total) if complete else f"at least {_plural(total)}"
            return InputError(MAX_LENGTH_EXCEEDED, f"the input has {amount}, more than the budget of {_plural(budget)}")
        row = self._row(layout, [(s, 0, len(s)) for s in seqs])
        return Encoded([row], len(row.ids), False, len(row.ids))

    def _truncate(self, text: str, pair: str | None, layout: Layout, room: int) -> Encoded:
        first = self._reader.read(text, room + 1)
        if pair is None:
            keep = min(len(first), room)
            row = self._row(layout, [(first, 0, keep)])
            return Encoded([row], len(first) + layout.specials, not first.complete, len(row.ids))
        second = self._reader.read(pair, room + 1)
        # longest-first needs to know which sequence is longer once both exceed half the budget;
        # when only one was read whole, read the other until it is known to be longer or whole
        if first.complete != second.complete:
            whole, part = (first, second) if first.complete else (second, first)
            if len(whole) > room and len(part) <= len(whole):
                more = self._reader.read(pair if first.complete else text, len(whole) + 1)
                first, second = (first, more) if first.complete else (more, second)
        # both read in part: their lengths are unknown, and count as equal (the odd token goes second)
        n1, n2 = (len(first), len(second)) if first.complete or second.complete else (room + 1, room + 1)
        k1, k2 = longest_first(n1, n2, room)
        row = self._row(layout, [(first, 0, min(k1, len(first))), (second, 0, min(k2, len(second)))])
        tokens = len(first) + len(second) + layout.specials
        return Encoded([row], tokens, not (first.complete and second.complete), len(row.ids))

    def _truncate_first(self, text: str, pair: str, layout: Layout, room: int) -> Encoded | InputError:
        second = self._reader.read(pair, room + 1)
        if len(second) > room:
            amount = _plural(len(second)) if second.complete else f"at least {_plural(len(second))}"
            return InputError(MAX_LENGTH_EXCEEDED, f"the second text alone has {amount}, more than the "
                                                   f"{_plural(room, 'content token')} the budget leaves; only the "
                                                   "first text may be cut")
        first = self._reader.read(text, room - len(second) + 1)
        row = self._row(layout, [(first, 0, min(len(first), room - len(second))), (second, 0, len(second))])
        tokens = len(first) + len(second) + layout.specials
        return Encoded([row], tokens, not first.complete, len(row.ids))

    def _windows(self, text: str, pair: str | None, window: Window, scan: int) -> Encoded | InputError:
        layout = self.envelope.pair if pair is not None else self.envelope.single
        size = min(int(window.tokens), self.max_input_tokens)
        overlap = int(window.overlap)
        room = int(scan) - layout.specials
        chars = len(text) + (len(pair) if pair is not None else 0)

        def over(amount: str, can_hold: str = "") -> InputError:
            return InputError(
                SCAN_BUDGET_EXCEEDED,
                f"the input has {amount}, more than its scan budget of {_plural(int(scan))}{can_hold}; "
                "none of it was read",
            )

        if room < 0:
            return over(f"at least {_plural(layout.specials, 'special token')}")
        if self._too_many_chars(chars, room):
            return over(_plural(chars, "character"), " can hold")
        seqs: list[Tokens] = []
        for piece in [text] if pair is None else [text, pair]:
            read = sum(len(s) for s in seqs)
            seqs.append(self._reader.read(piece, room - read + 1))
            if read + len(seqs[-1]) > room:
                count = read + len(seqs[-1]) + layout.specials
                exact = all(s.complete for s in seqs) and len(seqs) == (1 if pair is None else 2)
                return over(_plural(count) if exact else f"at least {_plural(count)}")
        first, second = seqs[0], (seqs[1] if pair is not None else None)
        total = sum(len(s) for s in seqs)
        if total + layout.specials <= size:
            row = self._row(layout, [(s, 0, len(s)) for s in seqs])
            moving = 0 if second is None or len(first) > len(second) else 1
            return Encoded([row], len(row.ids), False, len(row.ids), [(0, len(seqs[moving]))])
        # window the longer sequence (the second on a tie); the other repeats whole
        moving = 0 if second is None or len(first) > len(second) else 1
        fixed = sum(len(s) for i, s in enumerate(seqs) if i != moving)
        content = size - layout.specials - fixed
        if content <= overlap:
            return InputError(
                MAX_LENGTH_EXCEEDED,
                f"a window of {_plural(size)} holds {_plural(max(content, 0), 'content token')} "
                f"beside {_plural(layout.specials + fixed)} that every window repeats, "
                f"not more than its overlap of {_plural(overlap)}",
            )
        rows = []
        spans = []
        for start in window_starts(len(seqs[moving]), content, overlap, window.placement):
            end = min(start + content, len(seqs[moving]))  # a stride-placed last window runs short
            parts = [(s, start, end) if i == moving else (s, 0, len(s)) for i, s in enumerate(seqs)]
            rows.append(self._row(layout, parts))
            spans.append((start, end))
        # every token read, each once: the input as one row would hold it
        whole = total + layout.specials
        return Encoded(rows, whole, False, whole, spans)

    # -- rows ---------------------------------------------------------------------------------

    @staticmethod
    def _row(layout: Layout, parts: Sequence[tuple[Tokens, int, int]]) -> EncodedRow:
        """Assemble one row: the envelope around ``tokens[a:b]`` of each sequence."""
        specials = [(layout.before, layout.before_types)]
        specials.append((layout.between, layout.between_types) if len(parts) == 2 else ((), ()))
        specials.append((layout.after, layout.after_types))
        ids: list[np.ndarray] = []
        types: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        seq_ids: list[int | None] = []
        for i in range(len(parts) + 1):
            sp_ids, sp_types = specials[0] if i == 0 else specials[2] if i == len(parts) else specials[1]
            if sp_ids:
                ids.append(np.asarray(sp_ids, dtype=_I64))
                types.append(np.asarray(sp_types, dtype=_I64))
                offsets.append(np.zeros((len(sp_ids), 2), dtype=_I64))
                seq_ids.extend([None] * len(sp_ids))
            if i < len(parts):
                tokens, a, b = parts[i]
                ids.append(tokens.ids[a:b])
                types.append(np.full(b - a, layout.content_types[i], dtype=_I64))
                offsets.append(tokens.offsets[a:b])
                seq_ids.extend([i] * (b - a))
        return EncodedRow(
            ids=np.concatenate(ids) if ids else np.zeros(0, dtype=_I64),
            type_ids=np.concatenate(types) if types else np.zeros(0, dtype=_I64),
            offsets=np.concatenate(offsets) if offsets else np.zeros((0, 2), dtype=_I64),
            sequence_ids=seq_ids,
            sequence_starts=tuple(a for _, a, _ in parts),
        )
