"""The question types of the decisions surface, one module each, and the registry that joins them.

Each module (choice, noul, score, sets, span, box, track) registers a :class:`QuestionType`: the
members it takes, its request forms and limits, its fixed refusal reason and, where a probability
vector answers it, its answer and confidence. Requests parse questions through :func:`parse_question`;
families refuse the types their card does not list through :func:`refusal` and answer through
:func:`answer`. Adding a type is adding a module here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import numpy as np
import orjson

from edge_runtime.heads.decisions import INVALID_MODEL_OUTPUT, InvalidModelOutput
from edge_runtime.questions import box, choice, noul, score, sets, span, track
from edge_runtime.questions.base import (
    PRESET,
    QUESTION_MALFORMED,
    TYPE_UNSUPPORTED,
    DecisionOption,
    InvalidQuestion,
    Json,
    Malformed,
    Question,
    QuestionType,
)
from edge_runtime.questions.forms import optional_text, threshold
from edge_runtime.questions.sets import label_id

#: Every question type, in the order messages list them.
REGISTRY: dict[str, QuestionType] = {
    t.name: t for t in (choice.TYPE, noul.TYPE, score.TYPE, sets.TYPE, span.TYPE, box.TYPE, track.TYPE)
}
QUESTION_TYPES: tuple[str, ...] = tuple(REGISTRY)


#: Questions repeat across requests (a Router asks the same ones): parses of questions whose JSON is
#: at most this long are kept, keyed by their ID and JSON, up to PARSED_QUESTIONS of them.
PARSED_QUESTION_BYTES = 2048
PARSED_QUESTIONS = 4096


def parse_question(qid: str, raw: Any) -> Question | InvalidQuestion:
    """One question of a request; a malformed one (whatever its shape) becomes an InvalidQuestion.

    Parses are deterministic, so a question seen before is answered from a bounded cache; the
    cached question is parsed from its own copy of the JSON, and questions are immutable.
    """
    if isinstance(raw, dict):
        try:
            data = orjson.dumps(raw)
        except TypeError:  # not plain JSON (e.g. unpaired surrogates): parsed, and refused, below
            data = b""
        if 0 < len(data) <= PARSED_QUESTION_BYTES:
            return _parse_known(qid, data)
    return _parse_or_invalid(qid, raw)


@lru_cache(maxsize=PARSED_QUESTIONS)
def _parse_known(qid: str, data: bytes) -> Question | InvalidQuestion:
    return _parse_or_invalid(qid, orjson.loads(data))


def _parse_or_invalid(qid: str, raw: Any) -> Question | InvalidQuestion:
    qtype = raw.get("type") if isinstance(raw, dict) else None
    given_type = qtype if isinstance(qtype, str) else None
    try:
        return _parse(qid, raw)
    except Malformed as e:
        return InvalidQuestion(qid, given_type, e.reason, e.message)


#: What a bare preset question may hold besides its preset.
PRESET_FIELDS = frozenset({"preset", "threshold", "overflow"})


def _parse(qid: str, raw: Any) -> Question:
    if not isinstance(raw, dict):
        raise Malformed("a question must be an object")
    qtype = raw.get("type")
    if qtype is None and "preset" in raw:
        return _bare_preset(qid, raw)
    kind = REGISTRY.get(qtype) if isinstance(qtype, str) else None
    if kind is None:
        raise Malformed(f"type must be one of {list(QUESTION_TYPES)}")
    unknown = sorted(set(raw) - kind.fields)
    if unknown:
        raise Malformed(f"{kind.name} questions do not take {unknown}")
    instructions = optional_text(raw.get("instructions"), "instructions")
    preset = raw.get("preset")
    if preset is not None:
        _check_preset(preset)
    question = kind.parse(qid, raw, instructions, preset)
    overflow = _overflow(raw)
    return question if overflow is None else replace(question, overflow=overflow)


def _bare_preset(qid: str, raw: dict[str, Any]) -> Question:
    """``{"preset", "threshold"?, "overflow"?}``: the model's trained question of that name, whose
    type, instructions and options its card defines (the Router's preset form)."""
    unknown = sorted(set(raw) - PRESET_FIELDS)
    if unknown:
        raise Malformed(f"a preset question without a type takes only {sorted(PRESET_FIELDS)}, not {unknown}")
    preset = _check_preset(raw["preset"])
    return Question(qid, PRESET, None, preset=preset, threshold=threshold(raw.get("threshold")),
                    overflow=_overflow(raw))


def _check_preset(preset: Any) -> str:
    if not isinstance(preset, str) or not preset.strip():
        raise Malformed("preset must be a non-blank string")
    return preset


def _overflow(raw: dict[str, Any]) -> str | None:
    """A question's ``overflow``: "truncate", or None for reject (the default)."""
    overflow = raw.get("overflow")
    if overflow not in (None, "reject", "truncate"):
        raise Malformed("overflow must be reject or truncate")
    return "truncate" if overflow == "truncate" else None


def check_clashes(questions: Sequence[Question | InvalidQuestion]) -> tuple[Question | InvalidQuestion, ...]:
    """The questions, each one that conflicts with its siblings' IDs failed in place.

    Besides the question IDs, an answer key two Sets would both write (Set ``p`` with label ``q.r``
    and Set ``p.q`` with label ``r``) is taken: each of those Sets fails.
    """
    ids = {q.id for q in questions}
    sets = [q for q in questions if isinstance(q, Question) and q.type == "set"]
    if sets:  # most requests have none: no Counter to build
        written = Counter(label_id(q.id, o.key) for q in sets for o in q.options)
        ids |= {key for key, n in written.items() if n > 1}
    out: list[Question | InvalidQuestion] = []
    for q in questions:
        problem = None
        if isinstance(q, Question):
            clash = REGISTRY[q.type].clash if q.type in REGISTRY else None
            problem = clash(q, ids) if clash is not None else None
        out.append(q if problem is None else InvalidQuestion(q.id, q.type, QUESTION_MALFORMED, problem))
    return tuple(out)


def refusal(q: Question, model: str, answered: Sequence[str], truncates: bool = False) -> InvalidQuestion | None:
    """A question the model cannot answer as asked, failed in place: a type it does not answer (with
    the type's fixed reason), or ``overflow: truncate`` on a model that never cuts a state
    (``truncates`` False: it reads each question whole or fails it with max_length_exceeded)."""
    if q.type == PRESET:
        return InvalidQuestion(q.id, None, QUESTION_MALFORMED,
                               f"model {model!r} has no preset {q.preset!r}: name a type and instructions to ask "
                               "the question as written")
    if q.overflow == "truncate" and not truncates:
        return InvalidQuestion(q.id, q.type, QUESTION_MALFORMED,
                               f"model {model!r} reads every question whole: it does not take overflow truncate")
    if q.type in answered:
        return None
    reason = REGISTRY[q.type].unsupported_reason
    if reason == TYPE_UNSUPPORTED:
        return InvalidQuestion(q.id, q.type, reason,
                               f"model {model!r} answers {', '.join(answered)} questions, not {q.type}")
    return InvalidQuestion(q.id, q.type, reason, f"model {model!r} does not answer {q.type} questions")


def failed_answer(qtype: str | None, error: str, reason: str, message: str) -> dict[str, Any]:
    """A question's in-place error: ``{type, error, reason, message}``."""
    return {"type": qtype, "error": error, "reason": reason, "message": message}


def answer(q: Question, probs: np.ndarray) -> dict[str, Any]:
    """A question's answer from one probability vector over its options (Choice, Noul, Score).

    A vector that is not a distribution answers the question with invalid_model_output in place.
    """
    read = REGISTRY[q.type].answer
    if read is None:
        raise ValueError(f"{q.type} questions are not answered from one probability vector")
    try:
        return read(q, np.asarray(probs))
    except InvalidModelOutput as e:
        return failed_answer(q.type, INVALID_MODEL_OUTPUT, "model_output_invalid", str(e))


def vector_types() -> tuple[str, ...]:
    """The types a probability vector over the options answers."""
    return tuple(name for name, t in REGISTRY.items() if t.answer is not None)


__all__ = ["QUESTION_MALFORMED", "QUESTION_TYPES", "REGISTRY", "DecisionOption", "InvalidQuestion", "Json",
           "Malformed", "Question", "QuestionType", "answer", "check_clashes", "failed_answer", "parse_question",
           "refusal", "vector_types"]
