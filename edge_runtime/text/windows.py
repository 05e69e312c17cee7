"""Splitting token sequences: windows over a long sequence, longest-first truncation of a pair."""

from __future__ import annotations


def window_starts(n: int, size: int, overlap: int, placement: str = "end") -> list[int]:
    """Start of each window of ``size`` content tokens over ``n`` tokens.

    Windows step by ``size - overlap``. Placement ``end``: the last one ends at the content's end, so it
    may share more than ``overlap`` tokens with the one before. Placement ``stride``: the last one is
    the first whose stride reaches the content's end, and runs short. One window when everything fits.
    """
    if n <= size:
        return [0]
    stride = size - overlap
    if stride <= 0:
        raise ValueError(f"a window of {size} content tokens cannot overlap by {overlap}")
    if placement == "stride":
        return list(range(0, n - size + stride, stride))
    if placement != "end":
        raise ValueError(f"unknown window placement {placement!r}")
    return list(range(0, n - size, stride)) + [n - size]


def longest_first(n1: int, n2: int, budget: int) -> tuple[int, int]:
    """How many tokens of each sequence a pair keeps within ``budget`` content tokens.

    The same rule as the tokenizers library's LongestFirst truncation: the shorter sequence keeps
    all of itself when the longer can take the rest, else both get half the budget, the longer
    one the odd token (the second on a tie).
    """
    if n1 + n2 <= budget:
        return n1, n2
    short, long_ = (n2, n1) if n1 > n2 else (n1, n2)
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short = budget // 2
        long_ = short + budget % 2
    k1, k2 = (long_, short) if n1 > n2 else (short, long_)
    return min(n1, k1), min(n2, k2)
