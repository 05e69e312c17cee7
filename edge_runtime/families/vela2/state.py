"""A decisions request as a Vela 2.0 encoder reads it: state parts, engine questions and rows.

docs/reference/upstream-formats.md §2.3. The state becomes parts in the fixed order user, context,
answer. Questions become the engine's form: Noul is a two-option choice (``no``, ``yes``), Choice
and Noul show the abstain marker, Score levels are the options; Set and Span carry labels; presets
(``pii``, ``halu``, ``relevance``) expand from the package's calibration; ``over`` names the parts
a question reads. Rows: the first row holds every non-span question and the first span question,
each further span question gets its own row.

Pure Python. The family reads questions as edge_runtime.questions parsed them
(:func:`question_in_engine_form`); the parity pipeline reads upstream's request form, ``over`` and all
(:func:`engine_question`, :func:`plan`). Both call :func:`read_state` and :func:`rows_of`. A question
that cannot be read raises :class:`QuestionInvalid`, which fails that question only.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_runtime.questions.base import PRESET, Question

ROLES: tuple[str, ...] = ("user", "context", "answer")
#: Well-known state keys (lower case) and the part they feed; any other key feeds context.
KEY_ROLES: dict[str, str] = {
    "request": "user", "user": "user", "prompt": "user",
    "source": "context", "context": "context", "document": "context", "tools": "context",
    "previous_answer": "context",
    "answer": "answer", "response": "answer",
}
PRESETS: tuple[str, ...] = ("pii", "halu", "relevance")
NOUL_NO = "No. The statement or question is not satisfied."
NOUL_YES = "Yes. The statement or question is satisfied."
MAX_OPTIONS = 255
MAX_LABELS = 255
INVALID_QUESTION = "invalid_question"


class QuestionInvalid(ValueError):
    """A question the model cannot read; ``reason`` is the fixed error word, the message says why."""

    def __init__(self, message: str, reason: str = INVALID_QUESTION) -> None:
        super().__init__(message)
        self.reason = reason


def canonical(value: Any) -> str:
    """Canonical JSON text (sorted keys, no spaces, non-ASCII kept, NaN refused), as upstream renders."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_text(value: Any) -> str:
    """A JSON value as model text: a string as it is, anything else as canonical JSON."""
    return value if isinstance(value, str) else canonical(value)


def option_text(name: str, description: str) -> str:
    """How an option or label is rendered: ``name``, or ``name: description``."""
    return f"{name}: {description}" if description else name


@dataclass(frozen=True)
class Part:
    """One part of the state: its role and its text."""

    role: str
    text: str


@dataclass(frozen=True)
class State:
    """Parts in user, context, answer order; ``fields`` maps each state key to (role, start, end)."""

    parts: tuple[Part, ...]
    fields: dict[str, tuple[str, int, int]]

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(p.role for p in self.parts)

    def text(self, role: str) -> str:
        return next(p.text for p in self.parts if p.role == role)


def read_state(state: Any, roles: Mapping[str, str | None] | None = None) -> State:
    """The parts of a decisions ``state``; ValueError when it is empty or not text/object/array.

    A string is the user part, unless, trimmed, it starts with ``{`` and parses as a JSON object,
    which is then read as that object. An array is its canonical JSON as the user part. An object's
    keys map to roles case-insensitively (upstream's rule), or, when the request gives ``roles``
    (state key -> role or None), as it says: a key without a role feeds context under its name. A
    role fed by exactly one key that names it takes the value verbatim, otherwise the part is
    ``"<key>:\\n<value>"`` blocks joined by a blank line.
    """
    if isinstance(state, str) and state.strip().startswith("{"):
        try:
            decoded = json.loads(state.strip())
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            state = decoded
    if isinstance(state, str):
        if not state.strip():
            raise ValueError("state must not be empty or whitespace")
        return State((Part("user", state),), {"request": ("user", 0, len(state))})
    if isinstance(state, list):
        text = canonical(state)
        return State((Part("user", text),), {"request": ("user", 0, len(text))})
    if not isinstance(state, dict) or not state:
        raise ValueError("state must be a non-empty string, JSON object or JSON array")
    by_role: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for key, value in state.items():
        named = KEY_ROLES.get(str(key).lower()) if roles is None else roles.get(str(key))
        by_role[named or "context"].append((str(key), content_text(value), named is not None))
    parts: list[Part] = []
    fields: dict[str, tuple[str, int, int]] = {}
    for role in ROLES:
        items = by_role.get(role)
        if not items:
            continue
        if len(items) == 1 and items[0][2]:
            key, text, _ = items[0]
            fields[key] = (role, 0, len(text))
        else:
            text = ""
            for key, value, _ in items:
                if text:
                    text += "\n\n"
                head = f"{key}:\n"
                fields[key] = (role, len(text) + len(head), len(text) + len(head) + len(value))
                text += head + value
        if not text.strip():
            raise ValueError(f"the {role} part of the state is empty")
        parts.append(Part(role, text))
    return State(tuple(parts), fields)


@dataclass(frozen=True)
class EngineQuestion:
    """One question in the engine's form.

    ``kind`` is the request type (choice, noul, score, set, span); ``type`` the engine type (Noul
    runs as a choice). ``options``: (name, description) pairs in order (Set and Span: labels).
    ``roles``: the parts it reads, in state order. ``key``: its calibration key (the preset name,
    else the question id). ``legend``: a Score's level texts. ``span_range``: the code-point range
    of the single state key a span was asked ``over`` (spans are clipped to it).
    """

    id: str
    kind: str
    type: str
    text: str
    roles: tuple[str, ...]
    options: tuple[tuple[str, str], ...]
    key: str
    abstain: bool = False
    threshold: float | None = None
    legend: tuple[str, ...] = ()
    span_range: tuple[int, int] | None = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.options]


def resolve_over(over: Any, state: State) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """``over`` as the roles it reads (in state order) and, for a single state key, its range."""
    items = over if isinstance(over, list) else [over]
    roles: list[str] = []
    span_range = None
    for item in items:
        if not isinstance(item, str):
            raise QuestionInvalid("over must be a state key, a part name or a list of them")
        if item in state.fields:
            role, start, end = state.fields[item]
            if not isinstance(over, list):
                span_range = (start, end)
        elif item in state.roles:
            role = item
        elif item in KEY_ROLES and KEY_ROLES[item] in state.roles:
            role = KEY_ROLES[item]
        else:
            raise QuestionInvalid(f"over: {item!r} is not a field of the state")
        if role not in roles:
            roles.append(role)
    if not roles:
        raise QuestionInvalid("over must not be empty")
    return tuple(r for r in state.roles if r in roles), span_range


def default_roles(kind: str, state: State) -> tuple[str, ...]:
    """Span: answer, else user, else the first part; other types: every part."""
    roles = state.roles
    if kind == "span":
        return ("answer",) if "answer" in roles else (("user",) if "user" in roles else roles[:1])
    return roles


def _named(criteria: Any, listed: Any, list_key: str, minimum: int, maximum: int, what: str
           ) -> tuple[tuple[str, str], ...]:
    """``{name: description}`` criteria, or a list of ``{key, description}`` / strings, as pairs."""
    if criteria is not None and listed is not None:
        raise QuestionInvalid(f"give criteria or {list_key}, not both")
    pairs: list[tuple[str, str]] = []
    if isinstance(criteria, dict):
        for name, desc in criteria.items():
            pairs.append((str(name), "" if desc is None else content_text(desc)))
    elif isinstance(listed, list):
        for item in listed:
            if isinstance(item, str):
                pairs.append((item, ""))
            elif isinstance(item, dict) and isinstance(item.get("key"), str):
                desc = item.get("description")
                pairs.append((item["key"], "" if desc is None else content_text(desc)))
            else:
                raise QuestionInvalid(f"{list_key} items must be strings or {{key, description}} objects")
    else:
        raise QuestionInvalid(f"{what} needs criteria as an object of names")
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names) or any(not n for n in names):
        raise QuestionInvalid(f"{what} names must be distinct and non-empty")
    if not minimum <= len(pairs) <= maximum:
        raise QuestionInvalid(f"{what} takes {minimum} to {maximum} names, got {len(pairs)}")
    return tuple(pairs)


def _threshold(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0.0 <= value <= 1.0:
        raise QuestionInvalid("threshold must be a number in [0, 1]")
    return float(value)


def expand_preset(raw: Mapping[str, Any], calibration: Mapping[str, Any]
                  ) -> tuple[dict[str, Any], list[str] | None]:
    """A preset question as the plain question it stands for, and a relevance Score's level names.

    A preset takes only ``preset``, ``type``, ``over`` and ``threshold``; ``pii`` and ``halu`` are
    span questions over the schema's labels, ``relevance`` a Score over its level descriptions.
    """
    name = raw.get("preset")
    schema = calibration.get(f"{name}_schema") if isinstance(name, str) else None
    if name not in PRESETS or not isinstance(schema, dict):
        known = [p for p in PRESETS if isinstance(calibration.get(f"{p}_schema"), dict)]
        raise QuestionInvalid(f"preset must be one of {known}")
    extra = set(raw) - {"preset", "type", "over", "threshold"}
    if extra:
        raise QuestionInvalid(f"a preset question takes only preset, type, over and threshold, not {sorted(extra)}")
    if name == "relevance":
        expanded: dict[str, Any] = {"type": "score", "instructions": schema["text"],
                                    "criteria": list(schema["levels"].values())}
        named: list[str] | None = list(schema["levels"])
    else:
        expanded = {"type": "span", "instructions": schema["text"], "criteria": dict(schema["labels"])}
        named = None
    if raw.get("type") not in (None, expanded["type"]):
        raise QuestionInvalid(f"preset {name} is a {expanded['type']} question")
    for k in ("over", "threshold"):
        if k in raw:
            expanded[k] = raw[k]
    return expanded, named


def engine_question(qid: str, raw: Any, state: State, calibration: Mapping[str, Any]) -> EngineQuestion:
    """One question in upstream's request form (``over``, ``preset``, options as names or ``{key,
    description}``) in engine form: what the parity pipeline reads, as upstream reads it. The server's
    questions come parsed by edge_runtime.questions (:func:`question_in_engine_form`)."""
    if not isinstance(raw, Mapping):
        raise QuestionInvalid("a question must be an object")
    preset = raw.get("preset")
    named: list[str] | None = None
    if preset is not None:
        raw, named = expand_preset(raw, calibration)
    kind = raw.get("type")
    instructions = raw.get("instructions")
    legend: tuple[str, ...] = ()
    if kind == "choice":
        options = _named(raw.get("criteria"), raw.get("choices"), "choices", 2, MAX_OPTIONS, "a choice")
    elif kind == "noul":
        crit = raw.get("criteria")
        crit = crit if isinstance(crit, dict) else {}
        unknown = set(crit) - {"false", "true"}
        if unknown:
            raise QuestionInvalid(f"noul criteria take only false and true, not {sorted(unknown)}")
        options = _noul_options(crit)
    elif kind == "score":
        levels = raw.get("criteria") if raw.get("criteria") is not None else raw.get("levels")
        if not isinstance(levels, list) or not 2 <= len(levels) <= 10:
            raise QuestionInvalid("a score takes 2 to 10 levels")
        legend = tuple(content_text(level) for level in levels)
        # upstream: option text is the level text itself; the relevance preset names its levels
        options = tuple(zip(named, legend)) if named else tuple((text, "") for text in legend)
    elif kind in ("set", "span"):
        options = _named(raw.get("criteria"), raw.get("labels"), "labels", 1, MAX_LABELS, f"a {kind}")
    else:
        raise QuestionInvalid(f"type {kind!r} is not answered by this model (choice, noul, score, set, span)")
    # The shared request parser lets choice, score and set omit instructions (a noul needs them or
    # described outcomes); an absent text renders as no tokens after its [Q] marker.
    return _engine(qid, kind, instructions, options, legend, raw.get("over"), state, preset or qid,
                   raw.get("threshold"))


def question_in_engine_form(q: Question, state: State, calibration: Mapping[str, Any],
                            preset: str | None = None) -> EngineQuestion:
    """A question as edge_runtime.questions parsed it, in engine form over the parts its type reads.

    ``preset``: the package's preset the question stands for (a bare preset, or one the card lists):
    the calibration's trained question is asked, the request's instructions and options are not read.
    """
    if preset is not None:  # the calibration defines the question, in upstream's form
        form: dict[str, Any] = {"preset": preset}
        if q.type != PRESET:
            form["type"] = q.type
        if q.threshold is not None:
            form["threshold"] = q.threshold
        return engine_question(q.id, form, state, calibration)
    legend: tuple[str, ...] = ()
    if q.type == "noul":
        options = _noul_options({o.key: o.description for o in q.options})
    elif q.type == "score":
        legend = tuple(content_text(o.description) for o in q.options)
        options = tuple((text, "") for text in legend)
    else:
        options = tuple((o.key, "" if o.description is None else content_text(o.description)) for o in q.options)
    return _engine(q.id, q.type, q.instructions, options, legend, None, state, q.id, q.threshold)


def _noul_options(criteria: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """A Noul's two options, no then yes: the described outcome, else upstream's default text."""
    defaults = {"false": NOUL_NO, "true": NOUL_YES}
    return tuple((name, defaults[key] if criteria.get(key) is None else content_text(criteria[key]))
                 for name, key in (("no", "false"), ("yes", "true")))


def _engine(qid: str, kind: str, instructions: Any, options: tuple[tuple[str, str], ...], legend: tuple[str, ...],
            over: Any, state: State, key: str, threshold: Any) -> EngineQuestion:
    """The engine question: the parts it reads (``over``, else its type's default) and its threshold."""
    if over is not None:
        roles, span_range = resolve_over(over, state)
    else:
        roles, span_range = default_roles(kind, state), None
    if kind != "span":
        span_range = None
    elif len(roles) != 1:
        raise QuestionInvalid("a span question reads exactly one part")
    return EngineQuestion(
        id=qid, kind=kind, type="choice" if kind == "noul" else kind,
        text="" if instructions is None else content_text(instructions),
        roles=roles, options=options, key=key, abstain=kind in ("choice", "noul"),
        threshold=_threshold(threshold), legend=legend, span_range=span_range,
    )


@dataclass
class Plan:
    """A request after reading: its state, the valid questions in order, and per-question errors."""

    state: State
    order: list[str]
    questions: list[EngineQuestion] = field(default_factory=list)
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)


def plan(state: Any, questions: Mapping[str, Any], calibration: Mapping[str, Any]) -> Plan:
    """Read the state and every question; apply the set naming rule.

    The set naming rule: a Set whose ``<id>.<label>`` equals another question's id would write
    two answers under one key, so that Set is ``invalid_question``.
    """
    p = Plan(read_state(state), list(questions))
    for qid, raw in questions.items():
        try:
            p.questions.append(engine_question(qid, raw, p.state, calibration))
        except QuestionInvalid as e:
            kind = raw.get("type") if isinstance(raw, Mapping) else None
            if isinstance(raw, Mapping) and raw.get("preset") in ("pii", "halu"):
                kind = "span"
            p.errors[qid] = {"type": kind, "error": e.reason, "message": str(e)}
    taken = set(questions)
    for q in list(p.questions):
        if q.kind == "set":
            clash = [n for n in q.names if f"{q.id}.{n}" in taken]
            if clash:
                p.questions.remove(q)
                p.errors[q.id] = {"type": "set", "error": INVALID_QUESTION,
                                  "message": f"answer key {q.id}.{clash[0]} is another question's id"}
    return p


@dataclass(frozen=True)
class Row:
    """The questions one sequence (or its windows) reads."""

    questions: tuple[EngineQuestion, ...]

    @property
    def span(self) -> EngineQuestion | None:
        return next((q for q in self.questions if q.type == "span"), None)

    def read_roles(self) -> set[str]:
        return {r for q in self.questions for r in q.roles}


def rows_of(questions: Sequence[EngineQuestion]) -> list[Row]:
    """Row 1: every non-span question in order plus the first span; each further span: a row."""
    spans = [q for q in questions if q.type == "span"]
    rest = [q for q in questions if q.type != "span"]
    groups = [rest + spans[:1]] + [[s] for s in spans[1:]]
    return [Row(tuple(g)) for g in groups if g]


def span_roles(questions: Sequence[EngineQuestion]) -> set[str]:
    """Parts a span question reads: only these are encoded with offsets and words."""
    return {q.roles[0] for q in questions if q.type == "span"}
