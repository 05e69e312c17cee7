"""Decision readout in numpy: probability vectors from model outputs.

Each question type's answer and confidence from such a vector are its module's
(edge_runtime.questions.choice, noul, score, set, span).

Code readout (the decision-codes family): ``softmax(z / T)`` over a question's first K codes with
``z = R[:K] @ h_last``, and the request's T from its number of Choice, Noul and Score questions.

Probabilities are read in float64 and renormalised, so a float32 softmax that sums to 1 within
rounding gives a score that is exactly the expectation. A vector that is not a distribution
(non-finite, negative, or summing to nothing) raises :class:`InvalidModelOutput`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


class InvalidModelOutput(ValueError):
    """The model's output is not a probability distribution (answered invalid_model_output)."""


#: The in-place error of a question whose model output was unusable.
INVALID_MODEL_OUTPUT = "invalid_model_output"
#: Below this many numbers numpy's sum adds them one after another (pairwise summation starts at 8).
IN_ORDER_SUM = 8


def distribution(probs: np.ndarray | Sequence[float], count: int | None = None) -> np.ndarray:
    """``probs`` as a float64 distribution that sums to 1; raises InvalidModelOutput otherwise."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if count is not None and p.shape[0] != count:
        raise InvalidModelOutput(f"the model returned {p.shape[0]} probabilities for {count} options")
    if p.size == 0:
        raise InvalidModelOutput("the model returned no probabilities")
    # Two reductions cover every case: a NaN makes the sum NaN, an infinity makes it infinite.
    if p.size < IN_ORDER_SUM:
        # a few options as Python floats: numpy's own two reductions cost more than the arithmetic, and
        # below 8 numbers its sum adds them in order, as this loop does (the same bits)
        values = p.tolist()
        lowest, total = min(values), 0.0
        for value in values:
            total += value
    else:
        lowest, total = p.min(), p.sum()
    if not (lowest >= 0 and math.isfinite(total)):
        raise InvalidModelOutput("the model returned probabilities that are not finite and non-negative")
    if not total > 0:
        raise InvalidModelOutput("the model returned probabilities that sum to zero")
    return p / total


def code_probabilities(hidden: np.ndarray, readout: np.ndarray, count: int, temperature: float,
                       bias: np.ndarray | None = None, softcap: float | None = None) -> np.ndarray:
    """``softmax(z / T)`` over the first ``count`` codes, ``z = readout[:count] @ hidden`` (float64 out).

    The dot products are float32, as the model's LM head computes its logits; the softmax is
    float64 with the maximum subtracted. A non-finite hidden state gives NaN probabilities, which
    the answer heads refuse as invalid_model_output.
    """
    z = readout[:count] @ np.asarray(hidden, dtype=np.float32)
    if bias is not None:
        z = z + bias[:count]
    z = z.astype(np.float64)
    if softcap:
        z = softcap * np.tanh(z / softcap)
    z = z / temperature
    e = np.exp(z - z.max())
    return e / e.sum()


def select_temperature(config: dict[str, Any], questions: int) -> float:
    """The temperature of a request with ``questions`` Choice, Noul and Score questions.

    ``temperature_by_questions`` ``{"max_questions": [n_1..n_k], "temperature": [t_1..t_k, t_rest]}``
    gives the t_i of the first n <= n_i, else t_rest; without it, ``temperature``.
    """
    table = config.get("temperature_by_questions")
    if not table:
        return float(config.get("temperature", 1.0))
    for n_i, t_i in zip(table["max_questions"], table["temperature"]):
        if questions <= n_i:
            return float(t_i)
    return float(table["temperature"][-1])
