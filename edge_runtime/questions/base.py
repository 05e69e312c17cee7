"""What every question type shares: the parsed question, its in-place failure, and the type's contract.

A :class:`QuestionType` is one module's registration (``edge_runtime.questions.<type>``): the
members its questions take, how its request forms parse, the fixed reason a model that does not
answer it gives, and, for types answered from one probability vector, how that vector becomes the
answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# A JSON value as decoded: str, number, bool, None, list or dict.
Json = Any

#: The fixed reason of every validation failure; the message says which field and why.
QUESTION_MALFORMED = "question_malformed"
#: The fixed reason of a question of a type the model does not answer (box and track have their own).
TYPE_UNSUPPORTED = "question_type_unsupported"
#: The type of a bare preset question (``{"preset": name}``, no type): the card's preset defines it.
PRESET = "preset"


@dataclass(frozen=True)
class DecisionOption:
    """One option, level or label: its key and its description (None when the request gave none).

    Score levels are keyed "0".."n-1" and carry the level as their description.
    """

    key: str
    description: Json | None


@dataclass(frozen=True)
class Question:
    """A valid question. ``options`` hold the noul's false and true in that order, always both."""

    id: str
    type: str
    instructions: Json | None
    options: tuple[DecisionOption, ...] = ()
    threshold: float | None = None
    preset: str | None = None
    at: float | None = None
    rate: int | None = None
    overflow: str | None = None  # "truncate": read a state past the budget cut, where the family can


@dataclass(frozen=True)
class InvalidQuestion:
    """A question answered in place with an error; ``type`` is what the request gave (or None)."""

    id: str
    type: str | None
    reason: str
    message: str
    error: str = "invalid_question"

    def answer(self) -> dict[str, Any]:
        """The in-place answer of the failed question."""
        return {"type": self.type, "error": self.error, "reason": self.reason, "message": self.message}


class Malformed(Exception):
    """One question's validation failure, carried up to become an :class:`InvalidQuestion`."""

    def __init__(self, message: str, reason: str = QUESTION_MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


#: ``parse(qid, raw, instructions, preset)``: the question from its raw object, whose members and
#: common fields (instructions, preset) are already checked; raises :class:`Malformed`.
Parse = Callable[[str, dict[str, Any], Json | None, str | None], Question]
#: ``answer(question, probabilities)``: the answer from one probability vector over its options.
Answer = Callable[[Question, np.ndarray], dict[str, Any]]
#: ``clash(question, ids)``: why the question conflicts with its request's other question IDs, or None.
Clash = Callable[[Question, set[str]], str | None]


@dataclass(frozen=True)
class QuestionType:
    """One question type's contract with the rest of the runtime."""

    name: str
    fields: frozenset[str]
    parse: Parse
    answer: Answer | None = None
    unsupported_reason: str = TYPE_UNSUPPORTED
    clash: Clash | None = None
