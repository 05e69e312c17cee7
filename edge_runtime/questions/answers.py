"""One request's answers in question order, with the Set and Span extras beside them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.heads.tokens import Span
from edge_runtime.questions.noul import noul_answer
from edge_runtime.questions.sets import set_answers
from edge_runtime.questions.span import span_list


@dataclass
class DecisionAnswers:
    """``{answers, spans?, sets?, thresholds?}`` as questions are answered."""

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
        nouls, entry = set_answers(question_id, labels, probs, threshold)  # validates before adding
        self.answers.update(nouls)
        self.sets[question_id] = entry
        self.thresholds[question_id] = float(threshold)

    def add_span(self, question_id: str, spans: Sequence[Span], noul: float, threshold: float) -> None:
        """A Span: the spans found, in text order, and the question's Noul."""
        self.answers[question_id] = noul_answer(noul)
        self.spans[question_id] = span_list(spans)
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
