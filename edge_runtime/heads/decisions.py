"""Decision answers from probability vectors: Choice, Noul, Score, Set and Span, in numpy.

The formulas are the contract's (System One's published statistics):

- Choice over n options: the argmax, ties to the first option in request order, with
  ``confidence = (p_max - 1/n) / (1 - 1/n)``; probabilities keyed by the request's option keys.
- Noul: ``noul`` is the probability of true; a Noul has no confidence.
- Score over levels 0..n-1: ``score = sum_i i * p_i`` and
  ``confidence = max(0, 1 - sum_i p_i |i - m| / MAD_unif)`` with m the most likely level and
  ``MAD_unif = sum_i |i - (n - 1)/2| / n``; legend and probabilities keyed "0".."n-1".
- Set: every label a Noul under ``<id>.<label>``; ``sets.<id>.selected`` lists the labels at or
  above the question's threshold.
- Span: the spans found, and a Noul under the question's ID.

Code readout (the decision-codes family): ``softmax(z / T)`` over a question's first K codes with
``z = R[:K] @ h_last``, and the request's T from its number of Choice, Noul and Score questions.

Probabilities are read in float64 and renormalised, so a float32 softmax that sums to 1 within
rounding gives a score that is exactly the expectation. A vector that is not a distribution
(non-finite, negative, or summing to nothing) raises :class:`InvalidModelOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from edge_runtime.heads.tokens import Span


class InvalidModelOutput(ValueError):
    """The model's output is not a probability distribution (answered invalid_model_output)."""


#: The in-place error of a question whose model output was unusable.
INVALID_MODEL_OUTPUT = "invalid_model_output"


def distribution(probs: np.ndarray | Sequence[float], count: int | None = None) -> np.ndarray:
    """``probs`` as a float64 distribution that sums to 1; raises InvalidModelOutput otherwise."""
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    if count is not None and p.shape[0] != count:
        raise InvalidModelOutput(f"the model returned {p.shape[0]} probabilities for {count} options")
    if p.size == 0 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise InvalidModelOutput("the model returned probabilities that are not finite and non-negative")
    total = p.sum()
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


def choice_confidence(p: np.ndarray) -> float:
    """(p_max - 1/n) / (1 - 1/n), clipped to [0, 1] against rounding; 1 for a single option."""
    n = p.shape[0]
    if n == 1:
        return 1.0
    c = (float(p.max()) - 1.0 / n) / (1.0 - 1.0 / n)
    return min(1.0, max(0.0, c))


def score_confidence(p: np.ndarray) -> float:
    """max(0, 1 - sum_i p_i |i - m| / MAD_unif), m the most likely level; 1 for a single level."""
    n = p.shape[0]
    if n == 1:
        return 1.0
    levels = np.arange(n, dtype=np.float64)
    mode = int(np.argmax(p))
    mad_unif = float(np.abs(levels - (n - 1) / 2.0).sum() / n)
    spread = float((p * np.abs(levels - mode)).sum())
    return min(1.0, max(0.0, 1.0 - spread / mad_unif))


def choice_answer(keys: Sequence[str], probs: np.ndarray | Sequence[float],
                  abstain_probability: float | None = None) -> dict[str, Any]:
    """A Choice answer: the most likely key (the first on ties), its confidence, probabilities."""
    p = distribution(probs, len(keys))
    answer: dict[str, Any] = {
        "type": "choice",
        "choice": keys[int(np.argmax(p))],  # argmax returns the first of equal maxima
        "confidence": choice_confidence(p),
        "probabilities": {k: float(x) for k, x in zip(keys, p)},
    }
    if abstain_probability is not None:
        answer["abstain_probability"] = float(abstain_probability)
    return answer


def noul_answer(p_true: float) -> dict[str, Any]:
    """A Noul answer: the probability that the statement is true. No confidence, by the standard."""
    p = float(p_true)
    if not 0.0 <= p <= 1.0:  # also refuses NaN
        raise InvalidModelOutput("the model returned a noul probability outside [0, 1]")
    return {"type": "noul", "noul": p}


def noul_from_pair(probs: np.ndarray | Sequence[float]) -> dict[str, Any]:
    """A Noul read as a two-option choice (false, true): the renormalised probability of true."""
    return noul_answer(float(distribution(probs, 2)[1]))


def score_answer(legend: Sequence[str], probs: np.ndarray | Sequence[float]) -> dict[str, Any]:
    """A Score answer over levels 0..n-1: expected level, confidence, legend, probabilities."""
    p = distribution(probs, len(legend))
    keys = [str(i) for i in range(p.shape[0])]
    return {
        "type": "score",
        "score": float((np.arange(p.shape[0], dtype=np.float64) * p).sum()),
        "confidence": score_confidence(p),
        "legend": dict(zip(keys, legend)),
        "probabilities": {k: float(x) for k, x in zip(keys, p)},
    }


@dataclass
class DecisionAnswers:
    """The answers of one request, in question order, with the Set and Span extras beside them."""

    answers: dict[str, Any] = field(default_factory=dict)
    spans: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)

    def add(self, question_id: str, answer: dict[str, Any]) -> None:
        """A Choice, Noul or Score answer, or a failed question's in-place error."""
        self.answers[question_id] = answer

    def add_set(self, question_id: str, labels: Sequence[str], probs: np.ndarray | Sequence[float],
                threshold: float) -> None:
        """A Set: each label's independent probability as a Noul, and the labels >= threshold."""
        p = np.asarray(probs, dtype=np.float64).reshape(-1)
        if p.shape[0] != len(labels):
            raise InvalidModelOutput(f"the model returned {p.shape[0]} probabilities for {len(labels)} labels")
        nouls = [noul_answer(x) for x in p]  # validates every probability before anything is added
        for label, noul in zip(labels, nouls):
            self.answers[f"{question_id}.{label}"] = noul
        self.sets[question_id] = {
            "selected": [label for label, x in zip(labels, p) if x >= threshold],
            "probabilities": {label: float(x) for label, x in zip(labels, p)},
        }
        self.thresholds[question_id] = float(threshold)

    def add_span(self, question_id: str, spans: Sequence[Span], noul: float, threshold: float) -> None:
        """A Span: the spans found, in text order, and the question's Noul."""
        self.answers[question_id] = noul_answer(noul)
        self.spans[question_id] = [s.body() for s in sorted(spans, key=lambda s: (s.start, s.end))]
        self.thresholds[question_id] = float(threshold)

    def body(self) -> dict[str, Any]:
        """``{answers, spans?, sets?, thresholds?}``: the extras only when a question made them."""
        out: dict[str, Any] = {"answers": self.answers}
        if self.spans:
            out["spans"] = self.spans
        if self.sets:
            out["sets"] = self.sets
        if self.thresholds:
            out["thresholds"] = self.thresholds
        return out
