"""Reading an input that was split into overlapping windows back as one answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def max_over_windows(values: Sequence[np.ndarray]) -> np.ndarray:
    """Sequence heads keep each window's values and reduce them with the per-label max."""
    if len(values) == 1:
        return np.asarray(values[0], dtype=np.float64)
    return np.max(np.stack([np.asarray(v, dtype=np.float64) for v in values]), axis=0)


def pick_token_rows(
    windows: Sequence[tuple[np.ndarray, Any]], sequence: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-token probabilities and offsets of one sequence, over all its windows.

    ``windows`` holds (probabilities [n, L], row) pairs, where row has ``sequence_ids``, ``offsets``
    and ``sequence_starts`` (per sequence, the index of the row's first token within that sequence).
    Every content token takes its row from the window where it has the most context on its shorter
    side (the earlier window on ties), so each token is read once.
    """
    best: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
    for probs, row in windows:
        positions = [p for p, s in enumerate(row.sequence_ids) if s == sequence]
        m = len(positions)
        for k, p in enumerate(positions):
            token = int(row.sequence_starts[sequence]) + k
            context = min(k, m - 1 - k)
            if token not in best or context > best[token][0]:
                best[token] = (context, probs[p], np.asarray(row.offsets[p]))
    if not best:
        return np.zeros((0, 1)), np.zeros((0, 2), dtype=np.int64)
    order = sorted(best)
    return (
        np.stack([best[t][1] for t in order]),
        np.stack([best[t][2] for t in order]).astype(np.int64),
    )
