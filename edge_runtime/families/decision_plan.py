"""The planning scaffolding the decision families share: slots, entries, plans and the answer body.

A decisions request becomes one :class:`Entry` per state (one for a standard request), each a
:class:`Slot` per question in request order: either a row (and, state-once, a branch of it) for the
engine to run, or an answer decided in place while planning (an invalid or refused question, a
question too long, a refused batch entry). A Set owns one label slot per label instead of a row,
each a Noul under ``<id>.<label>`` with its own row (and branch), which runs like any question's.
:func:`assemble` turns the engine's outputs back into the answers: ``{answers}`` plus ``sets`` and
``thresholds`` when a Set was answered (and ``spans`` for a Span), or ``{states}`` for a batch, each
state answered as its own request is (with its ``model`` and ``usage``); the service adds the
request's ``model`` and ``usage`` (:attr:`DecisionPlan.usage`, counted while planning). A family
supplies only how one row's output becomes a question's answer (``read``), typically through
:func:`edge_runtime.questions.answer`; a Set's labels are read the same way, as Nouls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.base import Plan, token_budget
from edge_runtime.packages.card import Card
from edge_runtime.questions import InvalidQuestion, Question, failed_answer
from edge_runtime.questions.answers import DecisionAnswers
from edge_runtime.questions.sets import threshold_of
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState, NoValidQuestion


@dataclass
class Slot:
    """One question of one entry: a row (and branch) to read, or an answer decided in place.

    ``row`` indexes the engine rows' outputs (vela2: its row's first window, where the windows'
    combined output is read). ``branch`` is the question's branch of a state-once row, ``ids`` its
    question tokens while it is planned, ``reading`` what the family reads the answer with beside the
    output (decision2: the row's prompt; a track: where its trees and branches start; vela2: the
    engine question and its row); families that need none leave them None. ``labels`` are a Set's
    label slots, one Noul question each: a Set with labels has no row of its own, and is answered from
    theirs.
    """

    question: Question | InvalidQuestion
    row: int | None = None
    answer: dict[str, Any] | None = None
    branch: int | None = None
    ids: list[int] | None = None
    labels: list[Slot] = field(default_factory=list)
    reading: Any = None


@dataclass
class Entry:
    """One state of a request: its name in a batch (None otherwise), its questions, its tokens.

    ``temperature`` is the entry's readout temperature where the family chooses one per request;
    ``tokens_lower_bound`` is set when its state was read only in part (its tokens are a lower bound).
    """

    name: str | None
    slots: list[Slot]
    tokens: int = 0
    temperature: float = 1.0
    tokens_lower_bound: bool = False

    @property
    def usage(self) -> dict[str, Any]:
        """The tokens this state's questions read; ``tokens_lower_bound`` when it was read only in part."""
        return _usage(self.tokens, self.tokens_lower_bound)


@dataclass
class DecisionPlan:
    """A request as rows for the engine, and per entry its questions in request order."""

    request: DecisionsRequest
    rows: list[Any]
    entries: list[Entry] = field(default_factory=list)

    @property
    def input_tokens(self) -> int:
        """The tokens the request reads: every entry's, each state counted as its family runs it."""
        return sum(e.tokens for e in self.entries)

    @property
    def usage(self) -> dict[str, Any]:
        """The request's usage, the service's to add: every entry's tokens."""
        return _usage(self.input_tokens, any(e.tokens_lower_bound for e in self.entries))


def _usage(tokens: int, lower_bound: bool) -> dict[str, Any]:
    """``{input_tokens, output_tokens: 0}``, with ``tokens_lower_bound`` when a state was read in part."""
    out: dict[str, Any] = {"input_tokens": tokens, "output_tokens": 0}
    if lower_bound:
        out["tokens_lower_bound"] = True
    return out


#: How a family answers a question from its row's output: ``read(question, slot, entry, output)``.
Read = Callable[[Question, Slot, Entry, Any], dict[str, Any]]
#: How a family adds a question's answer: ``add(answers, question, slot, entry, outputs)``, outputs
#: every row's, in row order.
Add = Callable[[DecisionAnswers, Question, Slot, Entry, Sequence[Any]], None]
#: How a family plans one entry: ``plan_entry(name, entry, rows)`` appends the entry's rows to ``rows``
#: and returns its Entry, or raises the ApiError that refuses the entry as a whole (a medium it
#: cannot decode, a state-once request over its limit).
PlanEntry = Callable[[str | None, DecisionState, list[Any]], Entry]


def plan_entries(request: DecisionsRequest, model: str, modalities: frozenset[str],
                 plan_entry: PlanEntry, last_check: Callable[[], None] | None = None) -> DecisionPlan:
    """Plan every entry of a request through ``plan_entry``, refusing media the model does not read.

    A refused entry raises its ApiError in a standard request and fails in place in a batch (the
    first refusal is raised when every entry is refused); ``last_check`` then runs (a request-level
    rule such as "every asset used"); NoValidQuestion when no question at all is one the model
    answers.
    """
    plan = DecisionPlan(request, rows=[])
    refusals: list[ApiError] = []
    for name, entry in request.entries():
        refusal = media_refusal(model, modalities, entry, request)
        if refusal is None:
            try:
                plan.entries.append(plan_entry(name, entry, plan.rows))
                continue
            except ApiError as e:
                refusal = e
        if not request.is_batch:
            raise refusal
        refusals.append(refusal)
        plan.entries.append(refused_entry(name, entry, refusal))
    if refusals and len(refusals) == len(plan.entries):
        raise refusals[0]
    if last_check is not None:
        last_check()
    if not any(isinstance(s.question, Question) for e in plan.entries for s in e.slots):
        raise NoValidQuestion([(e.name, s.question) for e in plan.entries for s in e.slots
                               if isinstance(s.question, InvalidQuestion)])
    return plan


def refused_entry(name: str | None, entry: DecisionState, refusal: ApiError) -> Entry:
    """A batch entry refused as a whole: every question fails in place with invalid_input."""
    return Entry(name, [Slot(q, answer=failed_answer(q.type, "invalid_input", "input_malformed", refusal.message))
                        for q in entry.questions])


def media_refusal(model: str, modalities: frozenset[str], entry: DecisionState,
                  request: DecisionsRequest) -> ApiError | None:
    """The 400 for images or videos (or request assets) that a model of these modalities cannot read."""
    if (entry.images or request.assets) and "image" not in modalities:
        return ApiError("invalid_request", f"model {model!r} reads text only, not images",
                        reason="image_unsupported")
    if entry.videos and "video" not in modalities:
        return ApiError("invalid_request", f"model {model!r} reads text only, not videos",
                        reason="video_unsupported")
    return None


def input_limit(card: Card, setting: int | None) -> int:
    """The tokens one row may read: the card's ``limits.max_input_tokens``, at most the models.yaml
    entry's own ``max_input_tokens`` (``setting``)."""
    limit = int(card.limits["max_input_tokens"])
    return limit if setting is None else min(limit, int(setting))


def answered_types(card: Card, family_types: Sequence[str]) -> tuple[str, ...]:
    """The question types a model answers: its card's ``question_types`` (all, when it lists none)
    that its family can answer."""
    return tuple(t for t in card.question_types or family_types if t in family_types)


def assemble(plan: DecisionPlan, outputs: Sequence[Any] | ItemError, model: str, add: Add,
             read: Read) -> dict[str, Any]:
    """The answers: ``{answers}`` (with ``sets`` and ``thresholds`` when a Set was answered, ``spans``
    for a Span), or ``{states}`` for a batch, each state as its own request is answered (its
    ``model``, answers and ``usage``). The request's ``model`` and ``usage`` are the service's.

    ``outputs`` holds one output per row, in row order, or one ItemError for the whole job (a
    deadline), which every question still to be read then carries. Invalid questions and answers
    decided while planning are added as they are; a Set with label slots is answered from their
    rows, each label ``read`` as a Noul; every other question is ``add``-ed from the outputs.
    """
    bodies = []
    for entry in plan.entries:
        answers = DecisionAnswers()
        for slot in entry.slots:
            q = slot.question
            if isinstance(q, InvalidQuestion):
                answers.add(q.id, q.answer())
            elif slot.answer is not None:
                answers.add(q.id, slot.answer)
            elif isinstance(outputs, ItemError):
                answers.add(q.id, failed_answer(q.type, outputs.code, outputs.code, outputs.message))
            elif slot.labels:
                _add_set(answers, q, slot, entry, outputs, read)
            else:
                assert slot.row is not None  # planning gives every unanswered question a row
                add(answers, q, slot, entry, outputs)
        bodies.append(answers.body())
    if not plan.request.is_batch:
        return bodies[0]
    return {"states": {e.name: {"model": model, **b, "usage": e.usage} for e, b in zip(plan.entries, bodies)}}


def _add_set(answers: DecisionAnswers, q: Question, slot: Slot, entry: Entry, outputs: Sequence[Any],
             read: Read) -> None:
    """A Set from its label slots: each label's Noul, ``sets.<id>`` and ``thresholds.<id>``.

    A label whose output is unusable fails the whole Set in place under its own ID, as any failed
    question is answered: ``selected`` over some of the labels would read as the others not applying.
    """
    probabilities = []
    for label in slot.labels:
        assert label.row is not None and isinstance(label.question, Question)
        got = read(label.question, label, entry, outputs[label.row])
        if "error" in got:
            answers.add(q.id, {**got, "type": q.type})
            return
        probabilities.append(got["noul"])
    answers.add_set(q.id, [o.key for o in q.options], probabilities, threshold_of(q))


#: The decisions surface, the one every decision family serves.
SURFACE = "decisions"
ForwardT = TypeVar("ForwardT")


class DecisionFamily(Generic[ForwardT]):
    """What every decision family shares: the surface, the guard of a family built without a
    session (converters and benches plan with it), the card's question types, the token budget of a
    request, the plan of a request as its entries' rows, and its answers assembled from their outputs.

    A family sets ``name``, ``question_types``, ``max_input_tokens`` and ``_forward`` and supplies
    ``plan_request``, ``read``, ``probe_row`` and, if it has one, ``warm``. vela2, whose rows are read
    in windows and whose Sets and Spans carry calibrated extras, overrides ``row_outputs`` and
    ``add_answer`` too.
    """

    surfaces = frozenset({SURFACE})
    batchable = True
    name: str
    question_types: tuple[str, ...]
    max_input_tokens: int
    validated_input_tokens: int | None = None
    _forward: ForwardT | None = None

    @property
    def forward(self) -> ForwardT:
        """The family's forward; a family built without a session only plans."""
        if self._forward is None:
            raise RuntimeError(f"{self.name} was built without a session: it plans requests, it runs none")
        return self._forward

    def warm(self) -> None:
        """Nothing to prepare unless the family says otherwise."""

    def describe(self) -> dict[str, Any]:
        """The question types this model answers, for its card."""
        return {"question_types": list(self.question_types)}

    def budget(self, request: DecisionsRequest) -> int:
        """The tokens one question (the state and that question) may read: ``validated_input_tokens``
        where the card has it (``max_input_tokens`` with ``options.long_context``), at most the
        request's ``options.max_tokens`` (itself at most ``max_input_tokens``)."""
        cap = self.max_input_tokens
        if self.validated_input_tokens is not None and not request.options.long_context:
            cap = self.validated_input_tokens
        return min(cap, token_budget(request.options.max_tokens, self.max_input_tokens))

    def plan(self, surface: str, request: DecisionsRequest) -> Plan:
        """The runtime's entry point: the request's rows, finished into its answers; the service adds
        the request's ``model`` and its ``usage``, counted here."""
        if surface != SURFACE:
            raise ValueError(surface)
        planned = self.plan_request(request)
        return Plan(planned.rows, lambda outputs: self.answers(planned, outputs), planned.input_tokens,
                    usage=planned.usage)

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Every entry's rows, and the answers decided while planning."""
        raise NotImplementedError

    def answers(self, plan: DecisionPlan, outputs: Sequence[Any] | ItemError) -> dict[str, Any]:
        """The answers from the rows' outputs (or one error for the whole job), without the request's
        ``model`` and ``usage``."""
        if not isinstance(outputs, ItemError):
            outputs = self.row_outputs(plan, outputs)
        return assemble(plan, outputs, self.name, self.add_answer, self.read)

    def finish(self, plan: DecisionPlan, outputs: Sequence[Any] | ItemError) -> dict[str, Any]:
        """The whole body, as the service answers it: for callers that run a family without the
        runtime (converters, benches, tests)."""
        return {"model": self.name, **self.answers(plan, outputs), "usage": plan.usage}

    def row_outputs(self, plan: DecisionPlan, outputs: Sequence[Any]) -> Sequence[Any]:
        """The outputs the slots' rows index: the engine's own, one per row, unless the family reads
        a row through several engine rows (vela2's windows)."""
        return outputs

    def add_answer(self, answers: DecisionAnswers, q: Question, slot: Slot, entry: Entry,
                   outputs: Sequence[Any]) -> None:
        """A question's answer from its row's output, through ``read``."""
        assert slot.row is not None
        answers.add(q.id, self.read(q, slot, entry, outputs[slot.row]))

    def read(self, q: Question, slot: Slot, entry: Entry, output: Any) -> dict[str, Any]:
        """A question's (or a Set label's Noul's) answer from its row's output."""
        raise NotImplementedError


__all__ = ["SURFACE", "Add", "DecisionFamily", "DecisionPlan", "Entry", "PlanEntry", "Read", "Slot", "answered_types",
           "assemble", "input_limit", "media_refusal", "plan_entries", "refused_entry"]
