"""Box edges as exact distributions over the 0..1000 grid, read from a digit token tree (numpy only).

A Qwen-VL model writes a box edge as the decimal digits of v in 0..1000 (one token per digit, the
Qwen2 pre-tokenizer splits every digit) followed by a terminator (``,`` between edges, ``]`` after
the last). Instead of generating, one forward reads every way the number can go
(docs/reference/multimodal-feasibility.md §2): the committed text's last position gives the first digit,
and a tree of 101 tokens under the 4-D bias gives the rest: the ten first digits, the ninety
two-digit prefixes 10..99, and ``100`` (whose next token decides 100 against 1000). Each position's
logits over the 11 tokens the grammar can continue with (digits 0-9, the terminator) go through a
softmax restricted to the tokens allowed there, so P(v) is the product along v's path and the
1001 probabilities sum to 1:

- after nothing: a digit (no empty number);
- after ``0``: the terminator only (no leading zeros);
- after one or two digits: a digit or the terminator;
- after three digits: the terminator, except after ``100``: ``0`` (for 1000) or the terminator;
- after ``1000``: the terminator.

Rows of the readout: digits 0-9, then the terminator (index :data:`TERMINATOR`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID = 1000
TERMINATOR = 10
#: Confidence window: P(|v - v_hat| <= this), per edge, in grid units.
CONFIDENCE_WINDOW = 25
CONFIDENCE_FORMULA = "geometric mean over the four edges of P(|v - v_hat| <= 25) on the 0..1000 grid"


@dataclass(frozen=True)
class DigitTree:
    """The tree's tokens as digits, each node's parent (-1: the committed text) and depth."""

    digits: np.ndarray   # int64 [T]: the digit each node adds
    parents: np.ndarray  # int64 [T]
    depths: np.ndarray   # int64 [T]
    index: dict[str, int]  # the node of each prefix ("7", "42", "100")

    def ancestors(self) -> np.ndarray:
        """bool [T, T]: node i sees node j (j is i or one of its ancestors)."""
        n = len(self.digits)
        sees = np.eye(n, dtype=bool)
        for i in range(n):
            p = int(self.parents[i])
            while p >= 0:
                sees[i, p] = True
                p = int(self.parents[p])
        return sees


def digit_tree() -> DigitTree:
    """Nodes "0".."9", then "10".."99", then "100"."""
    prefixes = [str(d) for d in range(10)] + [str(v) for v in range(10, 100)] + ["100"]
    index = {p: i for i, p in enumerate(prefixes)}
    digits = np.array([int(p[-1]) for p in prefixes], dtype=np.int64)
    parents = np.array([index[p[:-1]] if len(p) > 1 else -1 for p in prefixes], dtype=np.int64)
    depths = np.array([len(p) - 1 for p in prefixes], dtype=np.int64)
    return DigitTree(digits, parents, depths, index)


def _allowed(prefix: str) -> np.ndarray:
    """bool [11]: what may follow ``prefix`` (see the module docstring)."""
    ok = np.zeros(11, dtype=bool)
    if prefix == "":
        ok[:10] = True
    elif prefix == "0" or len(prefix) == 4 or (len(prefix) == 3 and prefix != "100"):
        ok[TERMINATOR] = True
    elif prefix == "100":
        ok[[0, TERMINATOR]] = True
    else:
        ok[:] = True
    return ok


def _constrained(z: np.ndarray, allowed: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of z / T over the allowed entries (others 0), in float64."""
    z = np.asarray(z, dtype=np.float64) / temperature
    out = np.zeros_like(z)
    zz = z[allowed]
    e = np.exp(zz - zz.max())
    out[allowed] = e / e.sum()
    return out


def edge_distribution(logits: np.ndarray, tree: DigitTree, temperature: float = 1.0) -> np.ndarray:
    """P(v) for v = 0..1000 from ``logits [1 + T, 11]``: the committed text's last position, then each node."""
    root = _constrained(logits[0], _allowed(""), temperature)
    step = {p: _constrained(logits[1 + i], _allowed(p), temperature) for p, i in tree.index.items()}
    probs = np.empty(GRID + 1, dtype=np.float64)
    for v in range(GRID + 1):
        text = str(v)
        p = root[int(text[0])]
        for k in range(1, len(text)):
            p *= step[text[:k]][int(text[k])] if text[:k] in step else 1.0
        # the terminator after the whole number ("1000" and three-digit numbers but 100 have no choice)
        p *= step[text][TERMINATOR] if text in step else 1.0
        probs[v] = p
    return probs


def pick(probs: np.ndarray, at_least: int = 0) -> int:
    """The most likely v >= ``at_least`` (a right edge is never left of its left edge)."""
    return int(at_least + np.argmax(probs[at_least:]))


def window_probability(probs: np.ndarray, v: int, window: int = CONFIDENCE_WINDOW) -> float:
    """P(|v' - v| <= window)."""
    return float(probs[max(0, v - window): v + window + 1].sum())


__all__ = ["CONFIDENCE_FORMULA", "CONFIDENCE_WINDOW", "DigitTree", "GRID", "TERMINATOR", "digit_tree",
           "edge_distribution", "pick", "window_probability"]
