"""Small dense readouts in numpy: linear layers, layer norm and activations over pooled vectors.

A head that pools over tokens (mean pooling) cannot run inside the graph without losing batch
invariance: ONNX Runtime's masked sum over a padded sequence rounds differently from the same row alone.
The graph therefore stops at the hidden states (bit-identical under right padding) and the pooled
readout runs here, one row at a time, in float64. Callers that read many rows hand in float64 weights
(:func:`float64_weights`, once at load): converting a 768 x 768 matrix on every row cost 0.25 ms a row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU with the exact error function (torch's default ``gelu``)."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.asarray(_erf(x / math.sqrt(2.0)), dtype=np.float64))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU's tanh approximation (``gelu_pytorch_tanh``)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": gelu,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def float64_weights(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays as float64 (shared, not copied, where they already are)."""
    return {name: np.asarray(w, dtype=np.float64) for name, w in weights.items()}


def linear(x: np.ndarray, weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """``x @ W.T + b`` with ``{name}.weight`` [out, in] and, when present, ``{name}.bias``."""
    y = np.asarray(x, dtype=np.float64) @ np.asarray(weights[f"{name}.weight"], dtype=np.float64).T
    bias = weights.get(f"{name}.bias")
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


def layer_norm(x: np.ndarray, weights: Mapping[str, np.ndarray], name: str, eps: float) -> np.ndarray:
    """LayerNorm over the last axis with ``{name}.weight`` and an optional ``{name}.bias``."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(axis=-1, keepdims=True)
    y = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)
    y = y * np.asarray(weights[f"{name}.weight"], dtype=np.float64)
    bias = weights.get(f"{name}.bias")
    return y if bias is None else y + np.asarray(bias, dtype=np.float64)


def activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The activation a config names; ValueError for one this module does not compute."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unsupported activation {name!r} (one of {', '.join(ACTIVATIONS)})") from None
