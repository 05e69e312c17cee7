"""Noul: the probability that a statement is true.

Forms: ``criteria`` ``{false?, true?}`` or ``choices`` over the keys false and true; the options are
always both, false first. A Noul has no confidence, by the standard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_runtime.heads.decisions import InvalidModelOutput, distribution
from edge_runtime.questions.base import DecisionOption, Json, Malformed, Question, QuestionType
from edge_runtime.questions.forms import keyed_list, keyed_object

KEYS: tuple[str, ...] = ("false", "true")


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    if "criteria" in raw and "choices" in raw:
        raise Malformed("noul questions take criteria or choices, not both")
    given: dict[str, Json | None] = {}
    field = "criteria"
    if "choices" in raw:
        options = keyed_list(raw["choices"], "choices")
        if not options:
            raise Malformed("choices must hold the options false and true")
        given = {o.key: o.description for o in options}
        field = "choices"
    elif raw.get("criteria") is not None:
        crit = raw["criteria"]
        if not isinstance(crit, dict):
            raise Malformed("criteria of a noul question must be an object {false, true}")
        given = {o.key: o.description for o in keyed_object(crit, "criteria")}
    other = sorted(set(given) - set(KEYS))
    if other:
        raise Malformed(f"{field} of a noul question take only the keys false and true, not {other}")
    options = tuple(DecisionOption(k, given.get(k)) for k in KEYS)
    if instructions is None and all(o.description is None for o in options):
        raise Malformed("noul questions need instructions, or criteria that describe an outcome")
    return Question(qid, "noul", instructions, options, preset=preset)


def noul_answer(p_true: float) -> dict[str, Any]:
    """A Noul answer: the probability that the statement is true."""
    p = float(p_true)
    if not 0.0 <= p <= 1.0:  # also refuses NaN
        raise InvalidModelOutput("the model returned a noul probability outside [0, 1]")
    return {"type": "noul", "noul": p}


def noul_from_pair(probs: np.ndarray | Sequence[float]) -> dict[str, Any]:
    """A Noul read as a two-option choice (false, true): the renormalised probability of true."""
    return noul_answer(float(distribution(probs, 2)[1]))


def answer(q: Question, probs: np.ndarray) -> dict[str, Any]:
    return noul_from_pair(probs)


TYPE = QuestionType(
    name="noul",
    fields=frozenset({"type", "instructions", "criteria", "choices", "preset", "overflow"}),
    parse=parse,
    answer=answer,
)
