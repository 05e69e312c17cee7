"""Validation of the decisions internal form (/v1/decisions and bundle `decisions` tasks).

A request is a standard request (one ``state`` and its ``questions``) or a batch (named standard
requests under ``states``); the two forms are mutually exclusive. Request-level problems raise a
400 ApiError. A malformed question never fails its siblings: it becomes an :class:`InvalidQuestion`
in place, answered ``{"type", "error": "invalid_question", "reason", "message"}``, whose reason is a
fixed word and whose message names the field. A request with no valid question at all raises
:class:`NoValidQuestion` (400 invalid_request), whose message lists every question's reason.

Validation only parses: whether a model answers box, track, set or span questions, or reads
images, is the family's decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from edge_runtime.errors import ApiError, invalid_request
from edge_runtime.requests.assets import check_references
from edge_runtime.requests.common import (
    Options, check_count, model_name, parse_options, reject_unknown, require_object,
)

#: Question types of the internal form, in the order messages list them.
QUESTION_TYPES: tuple[str, ...] = ("choice", "noul", "score", "set", "span", "box", "track")
MAX_OPTIONS = 255
MIN_LEVELS, MAX_LEVELS = 2, 10
MAX_LABELS = 255
NOUL_KEYS: tuple[str, ...] = ("false", "true")
ROLES: tuple[str, ...] = ("user", "context", "answer")
TRACK_RATES: tuple[int, ...] = (1, 2)

#: The fixed reason of every validation failure; the message says which field and why.
QUESTION_MALFORMED = "question_malformed"

# The members each question type takes; a question takes one option form or the other, never both.
_FIELDS: dict[str, frozenset[str]] = {
    "choice": frozenset({"type", "instructions", "criteria", "choices", "preset"}),
    "noul": frozenset({"type", "instructions", "criteria", "choices", "preset"}),
    "score": frozenset({"type", "instructions", "criteria", "levels", "preset"}),
    "set": frozenset({"type", "instructions", "criteria", "labels", "threshold", "preset"}),
    "span": frozenset({"type", "instructions", "criteria", "labels", "threshold", "preset"}),
    "box": frozenset({"type", "instructions", "at"}),
    "track": frozenset({"type", "instructions", "rate"}),
}
_LIST_FORM = {"choice": "choices", "noul": "choices", "score": "levels", "set": "labels", "span": "labels"}
_REQUEST_MEMBERS = frozenset({"model", "state", "questions", "states", "roles", "images", "videos", "assets",
                              "options"})
_STANDARD_ONLY = ("state", "questions", "images", "videos", "roles")
_ENTRY_MEMBERS = frozenset({"state", "questions", "images", "videos", "roles"})

# A JSON value as decoded: str, number, bool, None, list or dict.
Json = Any


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


@dataclass(frozen=True)
class DecisionState:
    """One standard request: a state and its questions in request order.

    ``roles_given`` tells an absent ``roles`` (an object state's keys name its parts) from
    ``null`` (no part has a role); ``roles`` maps state keys to roles otherwise.
    """

    state: Json
    questions: tuple[Question | InvalidQuestion, ...]
    roles: Mapping[str, str | None] | None = None
    roles_given: bool = False
    images: tuple[str, ...] = ()
    videos: tuple[str, ...] = ()

    @property
    def valid(self) -> tuple[Question, ...]:
        """The questions that passed validation, in request order."""
        return tuple(q for q in self.questions if isinstance(q, Question))


@dataclass(frozen=True)
class DecisionsRequest:
    """A validated decisions request: ``single`` for the standard form, ``states`` for a batch."""

    model: str | None
    options: Options
    single: DecisionState | None = None
    states: tuple[tuple[str, DecisionState], ...] | None = None
    assets: Mapping[str, Any] | None = None

    @property
    def is_batch(self) -> bool:
        return self.states is not None

    def entries(self) -> tuple[tuple[str | None, DecisionState], ...]:
        """(name, entry) pairs: one unnamed entry for a standard request, the batch's otherwise."""
        if self.states is not None:
            return self.states
        assert self.single is not None
        return ((None, self.single),)


class NoValidQuestion(ApiError):
    """400 invalid_request for a request none of whose questions is valid.

    ``reason`` and ``question`` are the first failed question's; the message lists them all.
    """

    def __init__(self, failed: list[tuple[str | None, InvalidQuestion]]) -> None:
        parts = []
        for entry, q in failed:
            where = f"{entry}.{q.id}" if entry is not None else q.id
            parts.append(f"{where} ({q.reason}): {q.message}")
        super().__init__(400, "invalid_request", "no question is valid: " + "; ".join(parts),
                         reason=failed[0][1].reason)
        self.question = failed[0][1].id
        self.state = failed[0][0]
        self.failed = failed

    def body(self) -> dict[str, Any]:
        body = super().body()
        body["error"]["question"] = self.question
        if self.state is not None:
            body["error"]["state"] = self.state
        return body


class _Malformed(Exception):
    """Internal: one question's validation failure, carried up to become an InvalidQuestion."""

    def __init__(self, message: str, reason: str = QUESTION_MALFORMED) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


# ---- request level -------------------------------------------------------------------------


def parse_decisions_request(body: Any, max_inputs: int | None = None) -> DecisionsRequest:
    """Validate a decisions request body (already decoded JSON) into a :class:`DecisionsRequest`.

    ``max_inputs`` bounds the questions of the whole request (413 request_too_large above it).
    Raises ApiError 400 for request-level problems, NoValidQuestion when no question is valid.
    """
    obj = require_object(body)
    reject_unknown(obj, set(_REQUEST_MEMBERS), "a decisions request")
    model = model_name(obj)
    options = parse_options(obj.get("options"), overflows=(), extra=frozenset({"long_context"}))
    assets = _assets(obj.get("assets"))
    if "states" in obj:
        mixed = [k for k in _STANDARD_ONLY if k in obj]
        if mixed:
            raise invalid_request(f"a batch (states) has no top-level {mixed}: send one form or the other")
        entries = _states(obj["states"])
        if max_inputs is not None:
            check_count(sum(len(e.questions) for _, e in entries), "questions", max_inputs)
        failed = [(name, q) for name, e in entries for q in e.questions if isinstance(q, InvalidQuestion)]
        if not any(e.valid for _, e in entries):
            raise NoValidQuestion(failed)
        return DecisionsRequest(model=model, options=options, states=entries, assets=assets)
    single = _entry(obj, "request")
    if max_inputs is not None:
        check_count(len(single.questions), "questions", max_inputs)
    if not single.valid:
        raise NoValidQuestion([(None, q) for q in single.questions])  # type: ignore[misc]
    return DecisionsRequest(model=model, options=options, single=single, assets=assets)


def _states(raw: Any) -> tuple[tuple[str, DecisionState], ...]:
    if not isinstance(raw, dict) or not raw:
        raise invalid_request("states must be a non-empty object of named requests")
    out = []
    for name, entry in raw.items():
        _check_text(name, "a states name")
        if not name.strip():
            raise invalid_request("states names must be non-blank strings")
        where = f"states.{name}"
        entry = require_object(entry, where)
        reject_unknown(entry, set(_ENTRY_MEMBERS), where)
        out.append((name, _entry(entry, where)))
    return tuple(out)


def _entry(obj: dict[str, Any], where: str) -> DecisionState:
    if "state" not in obj or obj["state"] is None:
        raise invalid_request(f"{where} needs a state (a string, an object or an array)")
    state = obj["state"]
    if not isinstance(state, (str, dict, list)):
        raise invalid_request(f"{where}: state must be a string, an object or an array")
    _check_json_text(state, f"{where}: state")
    roles_given = "roles" in obj
    roles = _roles(obj.get("roles"), state, where) if roles_given else None
    questions = _questions(obj.get("questions"), where)
    return DecisionState(
        state=state, questions=questions, roles=roles, roles_given=roles_given,
        images=_media_list(obj.get("images"), f"{where}: images"),
        videos=_media_list(obj.get("videos"), f"{where}: videos"),
    )


def _roles(raw: Any, state: Json, where: str) -> Mapping[str, str | None] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid_request(f"{where}: roles must be null or an object of state keys to roles")
    if not isinstance(state, dict):
        raise invalid_request(f"{where}: roles name the keys of an object state; this state is not an object")
    for key, role in raw.items():
        if key not in state:
            raise invalid_request(f"{where}: roles names {key!r}, which is not a key of the state")
        if role is not None and role not in ROLES:
            raise invalid_request(f"{where}: roles.{key} must be one of {list(ROLES)} or null")
    return dict(raw)


def _media_list(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise invalid_request(f"{where} must be a list of data URLs")
    return tuple(raw)


def _assets(raw: Any) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise invalid_request("assets must be a non-empty object of placeholders to assets")
    check_references(raw)  # empty or over-long references: their own reasons and limits
    for key, value in raw.items():
        if not isinstance(value, dict):
            raise invalid_request(f"assets[{key!r}] must be an object")
    return raw


def _questions(raw: Any, where: str) -> tuple[Question | InvalidQuestion, ...]:
    if not isinstance(raw, dict) or not raw:
        raise invalid_request(f"{where} needs questions: a non-empty object of question IDs to questions")
    for qid in raw:
        _check_text(qid, "a question ID")
        if not qid.strip():
            raise invalid_request(f"{where}: question IDs must be non-blank strings")
    parsed = [_question(qid, q) for qid, q in raw.items()]
    # A Set answers each label under "<id>.<label>", which must not shadow another question.
    ids = set(raw)
    out: list[Question | InvalidQuestion] = []
    for q in parsed:
        if isinstance(q, Question) and q.type == "set":
            clash = sorted(f"{q.id}.{o.key}" for o in q.options if f"{q.id}.{o.key}" in ids)
            if clash:
                q = InvalidQuestion(q.id, q.type, QUESTION_MALFORMED,
                                    f"set labels answer under {clash}, which are other question IDs")
        out.append(q)
    return tuple(out)


# ---- one question --------------------------------------------------------------------------


def _question(qid: str, raw: Any) -> Question | InvalidQuestion:
    qtype = raw.get("type") if isinstance(raw, dict) else None
    given_type = qtype if isinstance(qtype, str) else None
    try:
        return _parse_question(qid, raw)
    except _Malformed as e:
        return InvalidQuestion(qid, given_type, e.reason, e.message)


def _parse_question(qid: str, raw: Any) -> Question:
    if not isinstance(raw, dict):
        raise _Malformed("a question must be an object")
    qtype = raw.get("type")
    if not isinstance(qtype, str) or qtype not in _FIELDS:
        raise _Malformed(f"type must be one of {list(QUESTION_TYPES)}")
    unknown = sorted(set(raw) - _FIELDS[qtype])
    if unknown:
        raise _Malformed(f"{qtype} questions do not take {unknown}")
    instructions = _optional_text(raw.get("instructions"), "instructions")
    preset = raw.get("preset")
    if preset is not None and (not isinstance(preset, str) or not preset.strip()):
        raise _Malformed("preset must be a non-blank string")
    if qtype == "box":
        return Question(qid, qtype, _required(instructions, qtype), at=_at(raw.get("at")))
    if qtype == "track":
        return Question(qid, qtype, _required(instructions, qtype), rate=_rate(raw.get("rate", 1)))
    list_form = _LIST_FORM[qtype]
    if "criteria" in raw and list_form in raw:
        raise _Malformed(f"{qtype} questions take criteria or {list_form}, not both")
    threshold = None
    if qtype == "choice":
        options = _choice_options(raw)
    elif qtype == "noul":
        options = _noul_options(raw)
        if instructions is None and all(o.description is None for o in options):
            raise _Malformed("noul questions need instructions, or criteria that describe an outcome")
    elif qtype == "score":
        options = _score_levels(raw)
    else:
        options = _labels(raw, qtype)
        threshold = _threshold(raw.get("threshold"))
    return Question(qid, qtype, instructions, options, threshold=threshold, preset=preset)


def _required(instructions: Json | None, qtype: str) -> Json:
    if instructions is None:
        raise _Malformed(f"{qtype} questions need instructions")
    return instructions


def _choice_options(raw: dict[str, Any]) -> tuple[DecisionOption, ...]:
    if "choices" in raw:
        options = _keyed_list(raw["choices"], "choices")
    elif "criteria" in raw:
        options = _keyed_object(raw["criteria"], "criteria")
    else:
        raise _Malformed("choice questions need criteria or choices")
    if not 2 <= len(options) <= MAX_OPTIONS:
        field = "choices" if "choices" in raw else "criteria"
        raise _Malformed(f"{field} must hold 2 to {MAX_OPTIONS} options, not {len(options)}")
    return options


def _noul_options(raw: dict[str, Any]) -> tuple[DecisionOption, ...]:
    given: dict[str, Json | None] = {}
    if "choices" in raw:
        options = _keyed_list(raw["choices"], "choices")
        if not options:
            raise _Malformed("choices must hold the options false and true")
        given = {o.key: o.description for o in options}
        field = "choices"
    elif raw.get("criteria") is not None:
        crit = raw["criteria"]
        if not isinstance(crit, dict):
            raise _Malformed("criteria of a noul question must be an object {false, true}")
        given = {o.key: o.description for o in _keyed_object(crit, "criteria")}
        field = "criteria"
    else:
        field = "criteria"
    other = sorted(set(given) - set(NOUL_KEYS))
    if other:
        raise _Malformed(f"{field} of a noul question take only the keys false and true, not {other}")
    return tuple(DecisionOption(k, given.get(k)) for k in NOUL_KEYS)


def _score_levels(raw: dict[str, Any]) -> tuple[DecisionOption, ...]:
    field = "levels" if "levels" in raw else "criteria"
    if field not in raw:
        raise _Malformed("score questions need criteria or levels: a list of levels, lowest first")
    levels = raw[field]
    if not isinstance(levels, list):
        raise _Malformed(f"{field} of a score question must be a list of levels, lowest first")
    if not MIN_LEVELS <= len(levels) <= MAX_LEVELS:
        raise _Malformed(f"{field} must hold {MIN_LEVELS} to {MAX_LEVELS} levels, not {len(levels)}")
    out = []
    for i, level in enumerate(levels):
        if level is None:
            raise _Malformed(f"{field}[{i}] is null: every level needs a description")
        out.append(DecisionOption(str(i), _text(level, f"{field}[{i}]")))
    return tuple(out)


def _labels(raw: dict[str, Any], qtype: str) -> tuple[DecisionOption, ...]:
    if "labels" in raw:
        options = _keyed_list(raw["labels"], "labels")
        field = "labels"
    elif "criteria" in raw:
        options = _keyed_object(raw["criteria"], "criteria")
        field = "criteria"
    else:
        raise _Malformed(f"{qtype} questions need criteria or labels")
    if not 1 <= len(options) <= MAX_LABELS:
        raise _Malformed(f"{field} must hold 1 to {MAX_LABELS} labels, not {len(options)}")
    return options


def _keyed_object(crit: Any, field: str) -> tuple[DecisionOption, ...]:
    if not isinstance(crit, dict):
        raise _Malformed(f"{field} must be an object of keys to descriptions")
    out = []
    for key, desc in crit.items():
        _key(key, field)
        out.append(DecisionOption(key, _description(desc, f"{field}[{key!r}]")))
    return tuple(out)


def _keyed_list(items: Any, field: str) -> tuple[DecisionOption, ...]:
    if not isinstance(items, list):
        raise _Malformed(f"{field} must be a list of {{key, description}}")
    out, seen = [], set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _Malformed(f"{field}[{i}] must be an object {{key, description}}")
        extra = sorted(set(item) - {"key", "description"})
        if extra:
            raise _Malformed(f"{field}[{i}] does not take {extra}")
        if "key" not in item:
            raise _Malformed(f"{field}[{i}] needs a key")
        key = item["key"]
        _key(key, f"{field}[{i}].key")
        if key in seen:
            raise _Malformed(f"{field}[{i}].key {key!r} is a duplicate")
        seen.add(key)
        out.append(DecisionOption(key, _description(item.get("description"), f"{field}[{i}].description")))
    return tuple(out)


def _key(key: Any, where: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise _Malformed(f"{where}: keys must be non-blank strings")
    if not _encodable(key):
        raise _Malformed(f"{where}: a key holds an unpaired surrogate")


def _description(value: Any, where: str) -> Json | None:
    if value is None:
        return None  # the option is read by its key
    return _text(value, where)


def _optional_text(value: Any, where: str) -> Json | None:
    return None if value is None else _text(value, where)


def _text(value: Any, where: str) -> Json:
    """Text content: a non-blank string, or a non-empty object or array."""
    if isinstance(value, str):
        if not value.strip():
            raise _Malformed(f"{where} is blank")
    elif isinstance(value, (dict, list)):
        if not value:
            raise _Malformed(f"{where} is empty")
    else:
        raise _Malformed(f"{where} must be a string, an object or an array")
    if not _json_encodable(value):
        raise _Malformed(f"{where} holds an unpaired surrogate")
    return value


def _threshold(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise _Malformed("threshold must be a number from 0 to 1")
    return float(value)


def _at(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _Malformed("at must be a number of seconds >= 0")
    return float(value)


def _rate(value: Any) -> int:
    if isinstance(value, bool) or value not in TRACK_RATES:
        raise _Malformed(f"rate must be one of {list(TRACK_RATES)}")
    return int(value)


# ---- text hygiene --------------------------------------------------------------------------
# json.loads accepts escaped lone surrogates ("\ud800"); no tokenizer can read them, so they are
# refused here rather than failing later inside a forward.


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_encodable(value: Json) -> bool:
    if isinstance(value, str):
        return _encodable(value)
    if isinstance(value, dict):
        return all(_encodable(k) and _json_encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_encodable(v) for v in value)
    return True


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise invalid_request(f"{what} must be a string")
    if not _encodable(value):
        raise invalid_request(f"{what} holds an unpaired surrogate")


def _check_json_text(value: Json, where: str) -> None:
    if not _json_encodable(value):
        raise invalid_request(f"{where} holds an unpaired surrogate")
