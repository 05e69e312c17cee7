"""Long ASCII words and white-space runs read at the cost of their ends, for WordPiece tokenizers.

WordPiece reads a word (a pre-token) longer than ``max_input_chars_per_word`` as one unknown token
spanning the whole word, whatever its letters. An 8 MiB state of one word (letters, hex, base64
without ``+/=``) therefore has one token, but the tokenizer still normalizes and aligns all 8 MiB
to find that out: 6 s and 160 MB on sparrow-nano's tokenizer. Such a word has no boundary for the
budget cut to go before, so the budget reader has to hand it over whole.

:class:`LongWords` removes the middle of every run of ASCII letters and digits longer than
``2 * keep`` characters before a text is tokenized, and maps the offsets back. It is exact when
the tokenizer's pipeline leaves such a run one pre-token of as many normalized characters as it has
(checked on the tokenizer's spec below, and on a sample at construction): the word is longer than
the limit before and after the cut, so it is the same single unknown token, and every other token
is untouched. Tokenizers that do not qualify get None and read texts as they are.

White space is the same story the other way round: the pre-tokenizer drops it, so a run of it only
separates the words around it, whatever its length. Runs of 2,000 spaces between words put a
512-token budget a megabyte into the text, and the normalizer costs ~0.7 us per character; such a
run is cut to its first and last character (the set below is white space for the normalizer, the
pre-tokenizer and Python alike).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

# Normalizers that map each ASCII letter or digit to exactly one character and never remove one.
_ASCII_KEEPING_NORMALIZERS = frozenset({"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
# Pre-tokenizers that never split between two ASCII letters or digits.
_ALNUM_KEEPING_PRETOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
MIN_RUN = 4096  # shorter runs are cheap to tokenize: leave them alone
MIN_SPACE_RUN = 64  # white-space runs this long or longer keep only their first and last character
_SPACES = np.array([0x09, 0x0A, 0x0D, 0x20, 0xA0, 0x3000], dtype=np.uint32)
# The same runs as a pattern: on a text of one scan chunk or less, one search (about a microsecond)
# tells whether there is any run to find, where the numpy scan costs tens of microseconds.
_SPACE_RUN = re.compile("[\t\n\r \u00a0\u3000]{" + str(MIN_SPACE_RUN) + "}")
SCAN_CHUNK = 65536  # characters looked at per step (the GIL is free between steps)

_ASCII_ALNUM = np.zeros(128, dtype=np.bool_)
for _c in b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz":
    _ASCII_ALNUM[_c] = True


def _flatten(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [leaf for child in node.get(key, []) for leaf in _flatten(child, key)]
    return [node]


def _code_points(chunk: str) -> np.ndarray:
    return np.frombuffer(chunk.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def alnum_mask(chunk: str) -> np.ndarray:
    """True where ``chunk`` holds an ASCII letter or digit."""
    cps = _code_points(chunk)
    return (cps < 128) & _ASCII_ALNUM[np.minimum(cps, 127)]


def space_mask(chunk: str) -> np.ndarray:
    """True where ``chunk`` holds one of the white-space characters runs of which are shortened."""
    return np.isin(_code_points(chunk), _SPACES)


def long_runs(text: str, min_len: int, mask: Callable[[str], np.ndarray] = alnum_mask) -> list[tuple[int, int]]:
    """The maximal runs ``[start, end)`` of characters ``mask`` marks (by default ASCII letters and
    digits) at least ``min_len`` long."""
    runs: list[tuple[int, int]] = []
    start = 0  # where the current run began
    for lo in range(0, len(text), SCAN_CHUNK):
        breaks = np.flatnonzero(~mask(text[lo: lo + SCAN_CHUNK])) + lo
        if not len(breaks):
            continue  # the run goes on through this chunk
        # runs end at each break: the one open from before, and those between breaks
        ends = np.concatenate(([start], breaks + 1))
        lengths = breaks - ends[:-1]
        for i in np.flatnonzero(lengths >= min_len):
            runs.append((int(ends[i]), int(breaks[i])))
        start = int(breaks[-1]) + 1
    if len(text) - start >= min_len:
        runs.append((start, len(text)))
    return runs


@dataclass(frozen=True)
class Shortened:
    """A text with the middles of its long runs removed, and how to map its offsets back."""

    text: str
    joints: np.ndarray  # int64 [k]: positions in ``text`` after which characters were removed
    shifts: np.ndarray  # int64 [k]: characters removed up to and including each joint

    def original_offsets(self, offsets: np.ndarray) -> np.ndarray:
        """Offsets into the shortened text as offsets into the original one."""
        if not len(self.joints):
            return offsets
        # a value past a joint moves by what was removed up to the last joint before it
        at = np.searchsorted(self.joints, offsets, side="left")
        return offsets + np.concatenate(([0], self.shifts))[at]


class LongWords:
    """Shortens long ASCII words for one qualifying WordPiece tokenizer (see :meth:`for_tokenizer`)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep  # characters kept at each end of a run: more than the word limit
        self.min_len = max(MIN_RUN, 2 * keep + 1)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> LongWords | None:
        """A LongWords when ``tokenizer`` reads a long ASCII word as one unknown token, else None."""
        spec = json.loads(tokenizer.to_str())
        model = spec.get("model", {})
        limit = model.get("max_input_chars_per_word")
        if model.get("type") != "WordPiece" or not isinstance(limit, int) or limit < 1:
            return None
        normalizers = _flatten(spec.get("normalizer"), "normalizers")
        if any(n.get("type") not in _ASCII_KEEPING_NORMALIZERS for n in normalizers):
            return None
        pres = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
        if not pres or any(p.get("type") not in _ALNUM_KEEPING_PRETOKENIZERS for p in pres):
            return None  # no pre-tokenizer: the whole text is one word
        keep = limit + 1
        for added in spec.get("added_tokens", []):
            content = added.get("content", "")
            # an added token made of letters and digits could match inside a run (or across a cut),
            # one with white space in it inside a white-space run
            if len(content) >= keep or (content.isascii() and content.isalnum()) or space_mask(content).any():
                return None
        words = cls(keep)
        return words if words._agrees(tokenizer) else None

    def _agrees(self, tokenizer: Tokenizer) -> bool:
        """Whether a shortened sample tokenizes as the sample does (a last check of the spec reading)."""
        run = ("Zq9" * self.min_len)[: self.min_len + 777]
        spaces = " \t\n\r\u00a0\u3000" * MIN_SPACE_RUN
        sample = f"before {run}, {run[:-5]}x after.{spaces}\u00e9t\u00e9{spaces[:-3]}{run}{spaces}"
        whole = tokenizer.encode(sample, add_special_tokens=False)
        short = self.shorten(sample)
        got = tokenizer.encode(short.text, add_special_tokens=False)
        offsets = short.original_offsets(np.asarray(got.offsets, dtype=np.int64).reshape(-1, 2))
        return (len(short.text) < len(sample) and got.ids == whole.ids
                and np.array_equal(offsets, np.asarray(whole.offsets, dtype=np.int64).reshape(-1, 2)))

    def shorten(self, text: str) -> Shortened:
        """``text`` with each run of ASCII letters and digits over ``min_len`` cut to its first and
        last ``keep`` characters, and each white-space run of ``MIN_SPACE_RUN`` or more to its
        first and last character."""
        runs: list[tuple[int, int, int]] = []
        if len(text) >= self.min_len:
            runs = [(start, end, self.keep) for start, end in long_runs(text, self.min_len)]
        if len(text) >= MIN_SPACE_RUN and (len(text) > SCAN_CHUNK or _SPACE_RUN.search(text)):
            runs = sorted(runs + [(start, end, 1) for start, end in long_runs(text, MIN_SPACE_RUN, space_mask)])
        if not runs:
            return Shortened(text, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        parts: list[str] = []
        joints, shifts = [], []
        pos = removed = 0
        for start, end, keep in runs:
            cut_from, cut_to = start + keep, end - keep
            parts.append(text[pos:cut_from])
            removed += cut_to - cut_from
            joints.append(cut_from - (removed - (cut_to - cut_from)))  # where the joint is in the short text
            shifts.append(removed)
            pos = cut_to
        parts.append(text[pos:])
        return Shortened("".join(parts), np.asarray(joints, dtype=np.int64), np.asarray(shifts, dtype=np.int64))

    def encode(self, tokenizer: Tokenizer, text: str) -> tuple[Encoding, np.ndarray]:
        """``encode_batch([text])``'s encoding of the shortened text (ids are the text's own) and
        the offsets into ``text`` (int64 [n, 2])."""
        short = self.shorten(text)
        enc = tokenizer.encode_batch([short.text], add_special_tokens=False)[0]
        return enc, short.original_offsets(np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2))
