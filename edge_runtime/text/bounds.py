"""The budget cut: read the exact first tokens of a text, tokenizing only as far as a budget needs.

The first prefix tried is ``need * 6 + 1024`` characters; it doubles until the cut keeps at least
``need`` exact tokens, or the whole text is read. The cut classes come from a probe of the
tokenizer (edge_runtime.text.probe), run once on first use: a tokenizer whose cuts fail the probe
reads whole texts. Only a prefix of the text is ever sliced, so a long input costs time and memory
that follow its budget, not its length.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from edge_runtime.text.ascii_words import AsciiWords
from edge_runtime.text.cuts import Cutter, lookback_for
from edge_runtime.text.longwords import MIN_SPACE_RUN, LongWords
from edge_runtime.text.probe import ProbeReport, probe_cuts
from edge_runtime.text.tokenizer import TokenizerTraits

PREFIX_CHARS_PER_TOKEN = 6
PREFIX_EXTRA_CHARS = 1024

# Probe findings by tokenizer content: models that share a tokenizer are probed once per process.
_REPORTS: dict[str, ProbeReport] = {}
_REPORTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Tokens:
    """The first tokens of a text (no specials): all of them when ``complete``, else at least the
    number asked for, each exactly as the whole text's tokenization has it."""

    ids: np.ndarray  # int64 [n]
    offsets: np.ndarray  # int64 [n, 2], code points, end exclusive
    complete: bool

    def __len__(self) -> int:
        return int(self.ids.shape[0])


# Above this many characters a text is encoded through encode_batch, which releases the GIL while
# the tokenizer works (encode holds it). Measured: 2,048 texts of 3.6 kB tokenized with encode on a
# worker thread starved the event loop for up to 1.8 s (the GIL's forced switching did not reach
# it); through encode_batch the longest gap was 18 ms, at the same speed (1.5 us more per call).
RELEASE_GIL_CHARS = 256


def encode_plain(tokenizer: Tokenizer, text: str) -> Encoding:
    """``tokenizer.encode(text, add_special_tokens=False)``, releasing the GIL for long texts."""
    if len(text) > RELEASE_GIL_CHARS:
        return tokenizer.encode_batch([text], add_special_tokens=False)[0]
    return tokenizer.encode(text, add_special_tokens=False)


def _first_prefix(need: int) -> int:
    """The characters read first for ``need`` tokens; a text no longer than this is read whole."""
    return max(need, 1) * PREFIX_CHARS_PER_TOKEN + PREFIX_EXTRA_CHARS


def _tokens(ids: list[int], offsets: np.ndarray, n: int, complete: bool) -> Tokens:
    return Tokens(np.asarray(ids[:n], dtype=np.int64), offsets[:n], complete)


def _offsets(enc: Encoding) -> np.ndarray:
    return np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)


class BudgetReader:
    """Reads texts for one tokenizer, cutting long ones where its probe allows."""

    def __init__(self, tokenizer: Tokenizer, traits: TokenizerTraits) -> None:
        self._tokenizer = tokenizer
        self.traits = traits
        self.lookback = lookback_for(traits.longest_added_chars, traits.longest_token_chars)
        self._report: ProbeReport | None = None
        self._cutter: Cutter | None = None
        # A word with no boundary in it is handed to the tokenizer whole; for WordPiece a long
        # ASCII one is read at the cost of its ends (edge_runtime.text.longwords), None otherwise.
        self._long_words = LongWords.for_tokenizer(tokenizer)
        # Short ASCII texts of BERT WordPiece tokenizers: ids a cached word at a time, None otherwise.
        self._ascii_words = AsciiWords.for_tokenizer(tokenizer)

    def report(self) -> ProbeReport:
        """The probe's findings, probing on the first call (once per distinct tokenizer)."""
        if self._report is None:
            key = hashlib.sha256(self._tokenizer.to_str().encode("utf-8")).hexdigest()
            with _REPORTS_LOCK:
                report = _REPORTS.get(key)
                if report is None:
                    report = _REPORTS[key] = probe_cuts(self._tokenizer, self.traits, self.lookback)
                self._cutter = Cutter(report.enabled, self.lookback)
                self._report = report
        return self._report

    @property
    def chars_per_token(self) -> int | None:
        """Most characters one token covers (probed), None when the tokenizer drops or folds."""
        return self.report().chars_per_token

    def _encode(self, text: str) -> tuple[list[int], np.ndarray]:
        """The ids and offsets of all of ``text`` (no specials)."""
        fast = self._ascii_words.encode(text) if self._ascii_words is not None else None
        if fast is not None:
            return fast
        if self._long_words is not None and len(text) >= MIN_SPACE_RUN:
            enc, offsets = self._long_words.encode(self._tokenizer, text)
            return enc.ids, offsets
        enc = encode_plain(self._tokenizer, text)
        return enc.ids, _offsets(enc)

    def whole(self, text: str) -> Tokens:
        """Tokenize all of ``text`` (no specials)."""
        ids, offsets = self._encode(text)
        return _tokens(ids, offsets, len(ids), True)

    def ids(self, text: str, need: int) -> tuple[list[int], bool]:
        """The first ``need`` ids of ``text``, and whether it has more tokens than those (or may:
        it was read in part).

        read()'s ids for callers that need no offsets: a text that read() would tokenize whole is
        tokenized without them (a third of the cost of a few-hundred-character text).
        """
        if _first_prefix(need) >= len(text):
            fast = self._ascii_words.ids(text) if self._ascii_words is not None else None
            if fast is not None:
                return fast[:need], len(fast) > need
            if self._long_words is not None and len(text) >= MIN_SPACE_RUN:
                text = self._long_words.shorten(text).text  # same ids, long runs cut short
            # encode_batch_fast: no offsets tracked, and the GIL is released while it works
            ids = self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
            return ids[:need], len(ids) > need
        read = self.read(text, need)
        return read.ids[:need].tolist(), not read.complete or len(read) > need

    def read(self, text: str, need: int) -> Tokens:
        """At least ``need`` exact first tokens of ``text``, or all of them if it has fewer."""
        target = _first_prefix(need)
        if target >= len(text):
            return self.whole(text)
        self.report()
        cutter = self._cutter
        assert cutter is not None
        last_end = -1
        while True:
            cut = cutter.plan(text, target)
            if cut is None:
                return self.whole(text)
            if cut.end > target:
                # the cut went past a run that has to be read whole: aim beyond it instead
                target = cut.end + need * PREFIX_CHARS_PER_TOKEN + PREFIX_EXTRA_CHARS
                continue
            if cut.end != last_end:  # a cut that did not move keeps no more tokens
                last_end = cut.end
                ids, offsets = self._encode(text[: cut.end])
                over = np.nonzero(offsets[:, 1] > cut.keep)[0]
                kept = int(over[0]) if len(over) else len(offsets)
                if kept >= need:
                    return _tokens(ids, offsets, kept, False)
            target *= 2
