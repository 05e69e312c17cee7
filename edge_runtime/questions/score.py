"""Score: an expected level over 2 to 10 levels, lowest first.

Forms: ``criteria`` or ``levels``, a list of level descriptions. Over levels 0..n-1:
``score = sum_i i * p_i`` and ``confidence = max(0, 1 - sum_i p_i |i - m| / MAD_unif)`` with m the
most likely level and ``MAD_unif = sum_i |i - (n - 1)/2| / n``; legend and probabilities keyed
"0".."n-1".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from edge_runtime.heads.decisions import distribution
from edge_runtime.questions.base import DecisionOption, Json, Malformed, Question, QuestionType
from edge_runtime.questions.forms import text

MIN_LEVELS, MAX_LEVELS = 2, 10


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    if "criteria" in raw and "levels" in raw:
        raise Malformed("score questions take criteria or levels, not both")
    field = "levels" if "levels" in raw else "criteria"
    if field not in raw:
        raise Malformed("score questions need criteria or levels: a list of levels, lowest first")
    levels = raw[field]
    if not isinstance(levels, list):
        raise Malformed(f"{field} of a score question must be a list of levels, lowest first")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise Malformed(f"{field} must hold {MIN_LEVELS} to {MAX_LEVELS} levels, not {len(levels)}")
    options = []
    for i, level in enumerate(levels):
        if level is None:
            raise Malformed(f"{field}[{i}] is null: every level needs a description")
        options.append(DecisionOption(str(i), text(level, f"{field}[{i}]")))
    return Question(qid, "score", instructions, tuple(options), preset=preset)


@lru_cache(maxsize=MAX_LEVELS)
def _levels(n: int) -> tuple[np.ndarray, float, tuple[str, ...]]:
    """Levels 0..n-1 as float64, MAD_unif for n levels, and the levels' keys "0".."n-1"."""
    levels = np.arange(n, dtype=np.float64)
    levels.flags.writeable = False
    return levels, float(np.abs(levels - (n - 1) / 2.0).sum() / n), tuple(str(i) for i in range(n))


@lru_cache(maxsize=MAX_LEVELS * MAX_LEVELS)
def _distances(n: int, mode: int) -> np.ndarray:
    """|i - mode| over levels 0..n-1, float64."""
    out = np.abs(_levels(n)[0] - mode)
    out.flags.writeable = False
    return out


def confidence(p: np.ndarray) -> float:
    """max(0, 1 - sum_i p_i |i - m| / MAD_unif), m the most likely level; 1 for a single level."""
    n = p.shape[0]
    if n == 1:
        return 1.0
    values = p.tolist()
    mode = values.index(max(values))  # argmax: the first of equal maxima
    spread = float((p * _distances(n, mode)).sum())
    return min(1.0, max(0.0, 1.0 - spread / _levels(n)[1]))


def legend_text(value: Any) -> str:
    """A level as the legend shows it: the request's string, or canonical JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def score_answer(legend: Sequence[str], probs: np.ndarray | Sequence[float]) -> dict[str, Any]:
    """A Score answer over levels 0..n-1: expected level, confidence, legend, probabilities."""
    p = distribution(probs, len(legend))
    levels, _, keys = _levels(p.shape[0])
    return {
        "type": "score",
        "score": float((levels * p).sum()),
        "confidence": confidence(p),
        "legend": dict(zip(keys, legend)),
        "probabilities": dict(zip(keys, p.tolist())),
    }


def answer(q: Question, probs: np.ndarray) -> dict[str, Any]:
    return score_answer([legend_text(o.description) for o in q.options], probs)


TYPE = QuestionType(
    name="score",
    fields=frozenset({"type", "instructions", "criteria", "levels", "preset", "overflow"}),
    parse=parse,
    answer=answer,
)
