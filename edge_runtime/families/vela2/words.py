"""Words of a Vela 2.0 span part: the word regex, the unit regex and the span trim.

A span question scores words, not tokens. A word is a unit of a GLiNER2-style regex (a URL, an
e-mail address, an @handle, one CJK character, a run of word characters joined by ``-``/``_``,
or one other non-space character), read at its first sub-word token. Decoding then groups words
by a second, coarser regex (``unit``) and trims the decoded spans. Upstream Vela 2.0 packages
(docs/reference/upstream-formats.md §2.8) use these exact character classes, including the CJK range
``U+8C48-U+FAFF`` (wider than the compatibility block it was meant to be); answers only agree with
the packages' own runtime if the classes agree code point for code point, so they are kept as is.

All offsets are Python code points (what ``tokenizers`` reports for ``str`` input), end exclusive.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# The packages' CJK class, verbatim (see the module docstring for the U+8C48 oddity).
CJK_CLASS = (
    "\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua000-\ua4cf\uac00-\ud7af\u8c48-\ufaff\ufe30-\ufe4f\uff00-\uffef"
)
# What may follow a URL without being part of it (the lazy URL stops before a run of these).
_URL_TAIL = ".,;:!?)\\]}>\"'\u201d\u2019\u00bb"

WORD_RE = re.compile(
    "|".join((
        rf"(?:https?://|www\.)[^\s{CJK_CLASS}]+?(?=[{_URL_TAIL}]*(?![^\s{CJK_CLASS}]))",
        r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}",
        r"@[a-z0-9_]+",
        rf"[{CJK_CLASS}]",
        rf"[^\W{CJK_CLASS}]+(?:[-_][^\W{CJK_CLASS}]+)*",
        r"\S",
    )),
    re.IGNORECASE,
)

# A unit body character: not space, not a closing bracket or quote, not CJK.
_UNIT_CHAR = rf"[^\s\]\)\}}>\u300c\u300d\u300e\u300f\"'\u201c\u201d{CJK_CLASS}]"
UNIT_RE = re.compile(
    "|".join((
        rf"(?:https?://|www\.){_UNIT_CHAR}+?(?=[.,;:!?]*(?!{_UNIT_CHAR}))",
        rf"(?:(?![{CJK_CLASS}])[^\W_]|[@._\-+])+",
        r"\S",
    ))
)
_URL_START = re.compile(r"(?:https?://|www\.)", re.IGNORECASE)
_CJK_CHAR = re.compile(rf"[{CJK_CLASS}]")
#: Brackets and quotes trimmed off both ends of a span.
EDGE_CHARS = frozenset(
    "[](){}<>\u300c\u300d\u300e\u300f\u3010\u3011\u300a\u300b\u3008\u3009"
    "\"'\u201c\u201d\u2018\u2019\u00ab\u00bb\u2039\u203a"
)
#: Punctuation trimmed off the end of a URL span.
URL_TRAIL_CHARS = frozenset(".,;:!?)")


@dataclass(frozen=True)
class Words:
    """Words of a part that some token covers.

    ``offsets`` int32 [W, 2]: ``[start, end)`` code points in the part; ``first`` int32 [W]: the index
    (in the part's tokens) of the first token that covers the word.
    """

    offsets: np.ndarray
    first: np.ndarray

    def __len__(self) -> int:
        return int(self.first.shape[0])

    @staticmethod
    def empty() -> Words:
        return Words(np.zeros((0, 2), np.int32), np.zeros(0, np.int32))


def split_words(text: str) -> list[tuple[int, int]]:
    """The word units of ``text`` as ``(start, end)`` code-point ranges."""
    return [m.span() for m in WORD_RE.finditer(text)]


def words_of(text: str, token_offsets: np.ndarray) -> Words:
    """The words of ``text`` with the first non-empty token whose running end passes the word start.

    A token counts for a word when it is non-empty, its running end (the largest end so far) passes
    the word's start, and it starts before the word's end; a word no token covers is dropped (so a
    word the tokenizer dropped, such as a control character, is never scored).
    """
    offsets = np.asarray(token_offsets, dtype=np.int64).reshape(-1, 2)
    units = split_words(text)
    if not units or offsets.shape[0] == 0:
        return Words.empty()
    starts, ends = offsets[:, 0], offsets[:, 1]
    nonempty = ends > starts
    # running end over non-empty tokens; empty tokens never advance it
    reach = np.maximum.accumulate(np.where(nonempty, ends, -1))
    spans = np.asarray(units, dtype=np.int64)
    candidate = np.searchsorted(reach, spans[:, 0], side="right")
    nonempty_idx = np.flatnonzero(nonempty)
    pos = np.searchsorted(nonempty_idx, candidate)
    count = offsets.shape[0]
    token = np.full(len(units), count, dtype=np.int64)
    ok = pos < len(nonempty_idx)
    token[ok] = nonempty_idx[pos[ok]]
    covered = token < count
    covered[covered] &= starts[token[covered]] < spans[covered, 1]
    return Words(spans[covered].astype(np.int32), token[covered].astype(np.int32))


def window_words(words: Words, start: int, end: int) -> tuple[Words, np.ndarray]:
    """The words whose first token lies in token range ``[start, end)``, first tokens re-based to
    ``start``, and their indices among all the part's words."""
    selected = np.flatnonzero((words.first >= start) & (words.first < end))
    return Words(words.offsets[selected], (words.first[selected] - start).astype(np.int32)), selected


def word_units(text: str, offsets: np.ndarray) -> np.ndarray:
    """For each word, the index of the ``UNIT_RE`` match holding its first non-space character (-1: none)."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    bounds = np.asarray([m.span() for m in UNIT_RE.finditer(text)], dtype=np.int64).reshape(-1, 2)
    out = np.full(offsets.shape[0], -1, dtype=np.int64)
    if bounds.shape[0] == 0:
        return out
    for i, (a, b) in enumerate(offsets.tolist()):
        while a < b and a < len(text) and text[a].isspace():
            a += 1
        if a >= b or a >= len(text):
            continue
        u = int(np.searchsorted(bounds[:, 0], a, side="right")) - 1
        if u >= 0 and a < bounds[u, 1]:
            out[i] = u
    return out


def trim(text: str, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` without surrounding whitespace, brackets and quotes; a URL span also loses
    everything from its first CJK character on and its trailing punctuation."""
    while start < end and (text[start].isspace() or text[start] in EDGE_CHARS):
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in EDGE_CHARS):
        end -= 1
    if not _URL_START.match(text, start):
        return start, end
    cjk = _CJK_CHAR.search(text, start, end)
    if cjk:
        end = cjk.start()
    while end > start and (text[end - 1] in URL_TRAIL_CHARS or text[end - 1] in EDGE_CHARS
                           or text[end - 1].isspace()):
        end -= 1
    return start, end
