"""Choice: pick one of 2 to 255 options.

Forms: ``criteria`` ``{key: description}`` or ``choices`` ``[{key, description?}]``. The answer is
the argmax, ties to the first option in request order, with
``confidence = (p_max - 1/n) / (1 - 1/n)`` and the probabilities keyed by the request's keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_runtime.heads.decisions import distribution
from edge_runtime.questions.base import Json, Malformed, Question, QuestionType
from edge_runtime.questions.forms import keyed_options

MAX_OPTIONS = 255


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    options, field = keyed_options(raw, "choices", "choice")
    if not 2 <= len(options) <= MAX_OPTIONS:
        raise Malformed(f"{field} must hold 2 to {MAX_OPTIONS} options, not {len(options)}")
    return Question(qid, "choice", instructions, options, preset=preset)


def confidence(p: np.ndarray | Sequence[float]) -> float:
    """(p_max - 1/n) / (1 - 1/n), clipped to [0, 1] against rounding; 1 for a single option."""
    n = len(p)
    if n == 1:
        return 1.0
    c = (float(max(p)) - 1.0 / n) / (1.0 - 1.0 / n)
    return min(1.0, max(0.0, c))


def choice_answer(keys: Sequence[str], probs: np.ndarray | Sequence[float],
                  abstain_probability: float | None = None) -> dict[str, Any]:
    """A Choice answer: the most likely key (the first on ties), its confidence, probabilities."""
    # One distribution in numpy, then plain floats: max and index are exact, and a handful of
    # options cost less as a list than as numpy calls.
    p = distribution(probs, len(keys)).tolist()
    answer: dict[str, Any] = {
        "type": "choice",
        "choice": keys[p.index(max(p))],  # the first of equal maxima
        "confidence": confidence(p),
        "probabilities": dict(zip(keys, p)),
    }
    if abstain_probability is not None:
        answer["abstain_probability"] = float(abstain_probability)
    return answer


def answer(q: Question, probs: np.ndarray) -> dict[str, Any]:
    return choice_answer([o.key for o in q.options], probs)


TYPE = QuestionType(
    name="choice",
    fields=frozenset({"type", "instructions", "criteria", "choices", "preset", "overflow"}),
    parse=parse,
    answer=answer,
)
