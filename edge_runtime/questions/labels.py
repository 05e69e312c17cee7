"""The request form Set and Span share: 1 to 255 labels, an optional threshold and preset."""

from __future__ import annotations

from typing import Any

from edge_runtime.questions.base import Json, Malformed, Question
from edge_runtime.questions.forms import keyed_options, threshold

MAX_LABELS = 255
FIELDS = frozenset({"type", "instructions", "criteria", "labels", "threshold", "preset", "overflow"})


def parse_labels(qid: str, qtype: str, raw: dict[str, Any], instructions: Json | None,
                 preset: str | None) -> Question:
    """A question over labels (criteria or ``labels``) with its threshold."""
    options, field = keyed_options(raw, "labels", qtype)
    if not 1 <= len(options) <= MAX_LABELS:
        raise Malformed(f"{field} must hold 1 to {MAX_LABELS} labels, not {len(options)}")
    return Question(qid, qtype, instructions, options, threshold=threshold(raw.get("threshold")), preset=preset)
