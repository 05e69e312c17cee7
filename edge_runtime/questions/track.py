"""Track: follow a target through a video, ``rate`` boxes per second (1 or 2); needs instructions.

Models that do not see video answer it in place with the fixed reason track_unsupported.
"""

from __future__ import annotations

from typing import Any

from edge_runtime.questions.base import Json, Malformed, Question, QuestionType
from edge_runtime.questions.forms import required_instructions

RATES: tuple[int, ...] = (1, 2)


def parse(qid: str, raw: dict[str, Any], instructions: Json | None, preset: str | None) -> Question:
    rate = raw.get("rate", 1)
    if isinstance(rate, bool) or rate not in RATES:
        raise Malformed(f"rate must be one of {list(RATES)}")
    return Question(qid, "track", required_instructions(instructions, "track"), rate=int(rate))


TYPE = QuestionType(name="track", fields=frozenset({"type", "instructions", "rate"}), parse=parse,
                    unsupported_reason="track_unsupported")


def track_answer(points: list[tuple[float, dict[str, float], float | None, float]]) -> dict[str, Any]:
    """The contract's track answer: per sampled moment its time, box, confidence and visible."""
    return {"type": "track", "track": [{"time": float(t), "box": box, "confidence": c, "visible": float(v)}
                                       for t, box, c, v in points]}
