"""Validation of the decisions internal form (/v1/decisions and bundle `decisions` tasks).

A request is a standard request (one ``state`` and its ``questions``) or a batch (named standard
requests under ``states``); the two forms are mutually exclusive. Request-level problems raise
ApiError invalid_request. A malformed question never fails its siblings: it becomes an :class:`InvalidQuestion`
in place, answered ``{"type", "error": "invalid_question", "reason", "message"}``, whose reason is a
fixed word and whose message names the field. A request with no valid question at all raises
:class:`NoValidQuestion` (400 invalid_request), whose message lists every question's reason.

Each question is parsed by its type's module (edge_runtime.questions). Validation only parses:
whether a model answers box, track, set or span questions, or reads images, is the family's decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import ApiError, invalid_request
from edge_runtime.media.assets import check_references
from edge_runtime.questions import InvalidQuestion, Json, Question, check_clashes, parse_question
from edge_runtime.questions.forms import encodable, json_encodable
from edge_runtime.requests.common import (
    Options,
    check_count,
    model_name,
    parse_options,
    reject_unknown,
    require_object,
)

ROLES: tuple[str, ...] = ("user", "context", "answer")

_REQUEST_MEMBERS = frozenset({"model", "state", "questions", "states", "roles", "images", "videos", "assets",
                              "options"})
_STANDARD_ONLY = ("state", "questions", "images", "videos", "roles")
_ENTRY_MEMBERS = frozenset({"state", "questions", "images", "videos", "roles"})


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

    @property
    def has_media(self) -> bool:
        """Whether an entry carries images or videos, or the request assets: media to decode."""
        return self.assets is not None or any(e.images or e.videos for _, e in self.entries())

    def entries(self) -> tuple[tuple[str | None, DecisionState], ...]:
        """(name, entry) pairs: one unnamed entry for a standard request, the batch's otherwise."""
        if self.states is not None:
            return self.states
        assert self.single is not None
        return ((None, self.single),)


class NoValidQuestion(ApiError):
    """invalid_request (400) for a request none of whose questions is valid.

    ``reason`` and ``question`` are the first failed question's; the message lists them all.
    """

    def __init__(self, failed: list[tuple[str | None, InvalidQuestion]]) -> None:
        parts = []
        for entry, q in failed:
            where = f"{entry}.{q.id}" if entry is not None else q.id
            parts.append(f"{where} ({q.reason}): {q.message}")
        super().__init__("invalid_request", "no question is valid: " + "; ".join(parts),
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


# ---- request level -------------------------------------------------------------------------


def parse_decisions_request(body: Any, max_inputs: int | None = None) -> DecisionsRequest:
    """Validate a decisions request body (already decoded JSON) into a :class:`DecisionsRequest`.

    ``max_inputs`` bounds the answers of the whole request, a Set counting one per label (413
    request_too_large above it).
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
            check_count(sum(_answers(e.questions) for _, e in entries), "questions", max_inputs)
        failed: list[tuple[str | None, InvalidQuestion]] = [
            (name, q) for name, e in entries for q in e.questions if isinstance(q, InvalidQuestion)]
        if not any(e.valid for _, e in entries):
            raise NoValidQuestion(failed)
        return DecisionsRequest(model=model, options=options, states=entries, assets=assets)
    single = _entry(obj, "request")
    if max_inputs is not None:
        check_count(_answers(single.questions), "questions", max_inputs)
    if not single.valid:
        raise NoValidQuestion([(None, q) for q in single.questions])  # type: ignore[misc]
    return DecisionsRequest(model=model, options=options, single=single, assets=assets)


def _answers(questions: tuple[Question | InvalidQuestion, ...]) -> int:
    """How many answers the questions ask for: a Set one per label (a decision-codes model reads each
    label as a row of its own), any other question one."""
    return sum(len(q.options) if isinstance(q, Question) and q.type == "set" else 1 for q in questions)


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
    return check_clashes([parse_question(qid, q) for qid, q in raw.items()])


# ---- text hygiene (request level) ---------------------------------------------------------


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise invalid_request(f"{what} must be a string")
    if not encodable(value):
        raise invalid_request(f"{what} holds an unpaired surrogate")


def _check_json_text(value: Json, where: str) -> None:
    if not json_encodable(value):
        raise invalid_request(f"{where} holds an unpaired surrogate")
