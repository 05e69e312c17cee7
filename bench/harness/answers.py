"""Reading decision answers back for comparison: each question's probabilities, and the largest
difference between two contestants' answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def answer_probabilities(answer: Mapping[str, Any]) -> dict[str, float]:
    """The probabilities an answer gives: Choice and Score by option key, Noul as ``{"true": p}``."""
    kind = answer.get("type")
    if kind == "noul" and "noul" in answer:
        return {"true": float(answer["noul"])}
    if kind in ("choice", "score") and isinstance(answer.get("probabilities"), Mapping):
        return {str(k): float(v) for k, v in answer["probabilities"].items()}
    raise ValueError(f"the answer carries no probabilities: {dict(answer)}")


def max_abs_diff(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]]) -> float:
    """The largest |p_a - p_b| over every question and option; raises when the two differ in shape."""
    if set(a) != set(b):
        raise ValueError(f"different questions: {sorted(a)} vs {sorted(b)}")
    worst = 0.0
    for qid, pa in a.items():
        pb = b[qid]
        if set(pa) != set(pb):
            raise ValueError(f"question {qid}: different options {sorted(pa)} vs {sorted(pb)}")
        worst = max(worst, *(abs(pa[k] - pb[k]) for k in pa))
    return worst


def response_probabilities(body: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Every question's probabilities from a decisions response (``answers``)."""
    answers = body.get("answers")
    if not isinstance(answers, Mapping):
        raise ValueError(f"no answers in the response: {str(body)[:300]}")
    return {qid: answer_probabilities(ans) for qid, ans in answers.items()}
