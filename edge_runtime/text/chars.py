"""Character classes for cutting a long text: where a cut may go and which characters it keeps whole.

A cut goes *before* a character. It is safe for Unicode normalization only when neither NFC nor NFKC
ever composes that character with the one before it (combining marks, Hangul vowel and final jamo,
the few starters that are the second half of a canonical pair, and characters whose compatibility
decomposition begins with one of those). Everything here follows the Unicode tables of the running
Python (``unicodedata``), built once per process on first use (tens of milliseconds).
"""

from __future__ import annotations

import enum
import re
import threading
import unicodedata
from collections.abc import Iterable
from functools import lru_cache


class CutClass(str, enum.Enum):
    """The kinds of cut the budget reader can make; the probe enables them per tokenizer."""

    WHITESPACE = "whitespace"  # before a white-space character
    PUNCTUATION = "punctuation"  # before a Unicode punctuation character (P*)
    ASCII_SYMBOL = "ascii_symbol"  # before an ASCII symbol (S*: $ + < = > ^ ` | ~)
    SYMBOL = "symbol"  # before any other symbol (S*: emoji, currency, math, ...)
    HAN = "han"  # before a CJK ideograph
    KANA = "kana"  # before a hiragana or katakana letter
    HANGUL = "hangul"  # before a precomposed Hangul syllable
    RUN = "run"  # inside a run with no boundary: before a letter or digit


BOUNDARY_CLASSES: tuple[CutClass, ...] = (
    CutClass.WHITESPACE,
    CutClass.PUNCTUATION,
    CutClass.ASCII_SYMBOL,
    CutClass.SYMBOL,
    CutClass.HAN,
    CutClass.KANA,
    CutClass.HANGUL,
)

# Code points worth scanning: planes 0-3 (everything assigned there in Unicode 15) and plane 14's
# tags and variation selectors; the rest is unassigned or private use, which are never boundaries.
_SCAN_RANGES: tuple[tuple[int, int], ...] = ((0, 0x32400), (0xE0000, 0xE01F0))

_HAN_RANGES = ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F), (0x30000, 0x323AF))
_KANA_RANGES = ((0x3041, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9D), (0x1AFF0, 0x1B16F))
_HANGUL_RANGES = ((0xAC00, 0xD7A3),)
# Conjoining vowel and final jamo compose with the syllable or jamo before them (algorithmically,
# so unicodedata.decomposition does not list them).
_HANGUL_COMPOSING = ((0x1161, 0x1175), (0x11A8, 0x11C2))


def _in(cp: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


class _Tables:
    """Unicode facts computed once: characters unsafe to cut before, and per-class ranges."""

    def __init__(self) -> None:
        second_starters: set[str] = {
            chr(cp) for lo, hi in _HANGUL_COMPOSING for cp in range(lo, hi + 1)
        }
        for start, stop in _SCAN_RANGES:
            for cp in range(start, stop):
                d = unicodedata.decomposition(chr(cp))
                if not d or d.startswith("<"):
                    continue
                parts = d.split()
                if len(parts) == 2:
                    a, b = chr(int(parts[0], 16)), chr(int(parts[1], 16))
                    if unicodedata.combining(b) == 0 and unicodedata.normalize("NFC", a + b) == chr(cp):
                        second_starters.add(b)
        unsafe: set[str] = set(second_starters)
        for start, stop in _SCAN_RANGES:
            for cp in range(start, stop):
                ch = chr(cp)
                if unicodedata.combining(ch):
                    unsafe.add(ch)
                elif unicodedata.decomposition(ch):
                    first = unicodedata.normalize("NFKD", ch)[:1]
                    if first and (unicodedata.combining(first) or first in second_starters):
                        unsafe.add(ch)
        self.unsafe: frozenset[str] = frozenset(unsafe)
        ranges: dict[CutClass, list[tuple[int, int]]] = {c: [] for c in BOUNDARY_CLASSES}
        for start, stop in _SCAN_RANGES:
            current: CutClass | None = None
            run_start = start
            for cp in range(start, stop + 1):
                cls = self.classify(chr(cp)) if cp < stop else None
                if cls is not current:
                    if current is not None:
                        ranges[current].append((run_start, cp - 1))
                    current, run_start = cls, cp
        self.ranges = {c: tuple(r) for c, r in ranges.items()}

    def classify(self, ch: str) -> CutClass | None:
        if ch in self.unsafe:
            return None
        cat = unicodedata.category(ch)
        if cat == "Lo":  # most code points: check the CJK ranges first
            cp = ord(ch)
            if _in(cp, _HAN_RANGES):
                return CutClass.HAN
            if _in(cp, _KANA_RANGES):
                return CutClass.KANA
            if _in(cp, _HANGUL_RANGES):
                return CutClass.HANGUL
            return None
        if cat[0] == "P":
            return CutClass.PUNCTUATION
        if cat[0] == "S":
            return CutClass.ASCII_SYMBOL if ord(ch) < 128 else CutClass.SYMBOL
        if ch.isspace():
            return CutClass.WHITESPACE
        return None


_tables: _Tables | None = None
_tables_lock = threading.Lock()


def _get_tables() -> _Tables:
    global _tables
    if _tables is None:
        with _tables_lock:
            if _tables is None:
                _tables = _Tables()
    return _tables


def boundary_class(ch: str) -> CutClass | None:
    """The cut class of ``ch`` when a cut may go before it; None for word characters."""
    return _get_tables().classify(ch)


def starts_cleanly(ch: str) -> bool:
    """True when NFC and NFKC never compose ``ch`` with the character before it."""
    return ch not in _get_tables().unsafe


def is_run_cut(ch: str) -> bool:
    """True for a letter or digit that a cut inside an unbroken run may go before."""
    return unicodedata.category(ch)[0] in "LN" and ch not in _get_tables().unsafe


@lru_cache(maxsize=64)
def boundary_pattern(classes: frozenset[CutClass]) -> re.Pattern[str] | None:
    """A regex matching one character of any of ``classes`` (a cut may go before it)."""
    parts: list[str] = []
    tables = _get_tables()
    for cls in BOUNDARY_CLASSES:
        if cls in classes:
            for lo, hi in tables.ranges[cls]:
                parts.append(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}")
    if not parts:
        return None
    return re.compile("[" + "".join(parts) + "]")
