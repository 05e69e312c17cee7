"""The numpy readouts a converter needs to judge a graph: pooling, softmax, sigmoid.

They mirror what the server's heads do with the same card fields, so that agreement figures
measure what a client would see.
"""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in float64."""
    z = x.astype(np.float64) - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64."""
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """Pool token states [b, s, h] under mask [b, s] into [b, h] (mean, cls or last), optionally L2-normalised."""
    h = hidden.astype(np.float64)
    m = mask.astype(np.float64)
    if pooling == "mean":
        out = (h * m[..., None]).sum(axis=1) / np.maximum(m.sum(axis=1, keepdims=True), 1e-9)
    elif pooling == "cls":
        out = h[:, 0]
    elif pooling == "last":
        last = np.maximum(m.sum(axis=1).astype(np.int64) - 1, 0)  # right padding: last real token
        out = h[np.arange(h.shape[0]), last]
    else:
        raise ValueError(f"unknown pooling {pooling!r}")
    if normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [n, d] arrays."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
