"""Sentence embeddings from token states: pooling, dense projections, Matryoshka truncation, L2 normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

POOLINGS = ("mean", "cls", "last")
#: the activations a dense projection may end with
ACTIVATIONS = ("identity", "tanh")
#: One dense projection after pooling (a sentence-transformers Dense module): weight [out, in], bias [out]
#: or None, activation.
Dense = tuple[np.ndarray, np.ndarray | None, str]


def pool(hidden: np.ndarray, mode: str) -> np.ndarray:
    """Pool one row's token states [n, d] (real tokens only, specials included) into [d] float32.

    Mean pooling sums in float64: the row is the whole of what is averaged, so no mask is needed.
    """
    if mode == "mean":
        return hidden.astype(np.float64).mean(axis=0).astype(np.float32)
    if mode == "cls":
        return hidden[0].astype(np.float32)
    if mode == "last":
        return hidden[-1].astype(np.float32)
    raise ValueError(f"unknown pooling {mode!r}")


def weighted_mean(vectors: list[np.ndarray], weights: list[float]) -> np.ndarray:
    """The mean of several vectors of one input (its audio windows) weighted by what each covered,
    in float64; a single vector comes back as it is."""
    if len(vectors) == 1:
        return vectors[0]
    w = np.asarray(weights, dtype=np.float64)
    stacked = np.stack([v.astype(np.float64) for v in vectors])
    return ((w[:, None] * stacked).sum(axis=0) / w.sum()).astype(np.float32)


def normalize(vector: np.ndarray) -> np.ndarray:
    """L2-normalise, leaving an all-zero vector as it is."""
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if norm == 0.0:
        return vector
    return (vector.astype(np.float64) / norm).astype(np.float32)


def project(vector: np.ndarray, layers: Sequence[Dense]) -> np.ndarray:
    """A pooled vector through dense projections in order, ``activation(weight @ x + bias)``, in float64."""
    x = vector.astype(np.float64)
    for weight, bias, activation in layers:
        x = np.asarray(weight, dtype=np.float64) @ x  # no copy: the encoder family loads them as float64
        if bias is not None:
            x = x + bias
        if activation == "tanh":
            x = np.tanh(x)
        elif activation != "identity":
            raise ValueError(f"unknown activation {activation!r}")
    return x.astype(np.float32)


def embed(hidden: np.ndarray, mode: str, normalized: bool, dimensions: int | None,
          dense: Sequence[Dense] = ()) -> np.ndarray:
    """Pool, project through ``dense``, truncate to ``dimensions`` (Matryoshka), then normalise when the
    model does."""
    vector = pool(hidden, mode)
    if dense:
        vector = project(vector, dense)
    if dimensions is not None:
        vector = vector[:dimensions]
    return normalize(vector) if normalized else vector
