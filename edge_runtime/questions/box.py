"""Box: locate a target in an image (or a video frame ``at`` seconds in); needs instructions.

Models that do not see answer it in place with the fixed reason box_unsupported.
"""

from __future__ import annotations

import math
from typing import Any

from edge_runtime.questions.base import Json, Malformed, Question, QuestionType
from edge_runtime.questions.forms import required_instructions


def at_seconds(value: Any) -> float | None:
    """``at``: a video time in seconds >= 0, or None for an image."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise Malformed("at must be a number of seconds >= 0")
    return float(value)


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    return Question(qid, "box", required_instructions(instructions, "box"), at=at_seconds(raw.get("at")))


TYPE = QuestionType(name="box", fields=frozenset({"type", "instructions", "at"}), parse=parse,
                    unsupported_reason="box_unsupported")


def box_answer(left: float, top: float, right: float, bottom: float, confidence: float | None,
               time: float | None = None) -> dict[str, Any]:
    """The contract's Box answer: edges as fractions of the image as sent, from its top-left corner."""
    out: dict[str, Any] = {"type": "box", "box": {"top": float(top), "left": float(left), "bottom": float(bottom),
                                                  "right": float(right)},
                           "confidence": None if confidence is None else float(confidence)}
    if time is not None:
        out["time"] = float(time)
    return out
