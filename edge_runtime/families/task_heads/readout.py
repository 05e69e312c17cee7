"""The numpy readouts of task packages whose head runs after the graph (shared with the converter's parity
check): a pooled classifier's logits from hidden states, a pair scorer's logit from an exit's CLS state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_runtime.heads.mlp import activation, layer_norm, linear
from edge_runtime.heads.pooling import pool


def classifier_logits(head: Mapping[str, Any], weights: Mapping[str, np.ndarray], hidden: np.ndarray) -> np.ndarray:
    """ModernBERT's pooled readout, ``classifier(norm(act(dense(pool(hidden)))))``, in float64: ``hidden``
    [n, h] is one row's last hidden states (specials included), pooled as the head's ``pooling`` says."""
    spec = head["classifier"]
    x = activation(spec["activation"])(linear(pool(hidden, head["pooling"]), weights, "head.dense"))
    return linear(layer_norm(x, weights, "head.norm", float(spec["norm_eps"])), weights, "classifier")


def relevance_logit(head: Mapping[str, Any], weights: Mapping[str, np.ndarray], exit_cls: np.ndarray, layer: int,
                    dimension: int) -> float:
    """The (layer, dimension) exit's scorer, ``Linear(D, D/2)``, GELU, ``Linear(D/2, 1)``, over the first
    ``dimension`` channels of that layer's final-normed CLS state (``exit_cls`` [layers, h], in
    ``head.layers`` order)."""
    x = exit_cls[list(head["layers"]).index(layer)][:dimension]
    name = f"scorer.{layer}.{dimension}"
    hidden = activation(head["scorer"]["activation"])(linear(x, weights, f"{name}.0"))
    return float(linear(hidden, weights, f"{name}.3")[0])
