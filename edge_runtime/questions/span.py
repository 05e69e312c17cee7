"""Span: the passages of the state that a label names, and whether any was found.

``spans.<id>`` lists ``{label, start, end, text, probability}`` in text order (code-point offsets,
end exclusive); the question's own answer is a Noul under its ID; ``thresholds.<id>`` the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge_runtime.heads.tokens import Span
from edge_runtime.questions.base import Json, Question, QuestionType
from edge_runtime.questions.labels import FIELDS, parse_labels


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    return parse_labels(qid, "span", raw, instructions, preset)


def span_list(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """The spans as the answer lists them: in text order."""
    return [s.body() for s in sorted(spans, key=lambda s: (s.start, s.end))]


TYPE = QuestionType(name="span", fields=FIELDS, parse=parse)
