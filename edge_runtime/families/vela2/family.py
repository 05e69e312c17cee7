"""vela2 family: Vela 2.0 encoder packages answering Choice, Noul, Score, Set and Span questions.

A decisions request is read as upstream reads it (docs/reference/upstream-formats.md §2.3-§2.8): the
state becomes parts with roles, the questions engine questions (a preset the card lists replaces
the question as written), the questions rows, each row one model input or, when its one read part
is too long, windows over that part up to the scan budget. Every window is one engine row; the
executor batches them right-padded and the forward applies the numpy marker head to each row
alone, so a row's logits do not depend on what it was batched with. ``finish`` combines windows,
then answers in the contract's shapes: Choice and Noul from the option softmax (with the abstain
marker's share as ``abstain_probability``), Score, Set as one Noul per label plus ``sets`` and
``thresholds`` (the question's threshold, else the calibration's ``set:<key>``, else ``set:*``;
labels at or above it are selected), Span as ``spans`` with code-point offsets and a Noul.
Confidence is the contract's statistic, not upstream's margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.engine.encoder import EncoderForward
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.base import Plan, token_budget
from edge_runtime.families.decision_plan import SURFACE, DecisionFamily, answered_types, media_refusal
from edge_runtime.families.vela2.answers import (
    MAX_LENGTH_EXCEEDED,
    InvalidOutput,
    option_probabilities,
    read_spans,
    set_probabilities,
)
from edge_runtime.families.vela2.layout import (
    EncodedPart,
    EncoderSequence,
    PlacedQuestion,
    ScanBudgetExceeded,
    SchemaTooLong,
    SequenceOutput,
    batch_indices,
    combine,
    encode_parts,
    sequences,
    split_outputs,
)
from edge_runtime.families.vela2.marker import MarkerHead
from edge_runtime.families.vela2.pipeline import SCAN_BUDGET_EXCEEDED, SCAN_INPUTS_CPU, Vela2Assets
from edge_runtime.families.vela2.state import (
    EngineQuestion,
    QuestionInvalid,
    Row,
    State,
    engine_question,
    read_state,
    rows_of,
)
from edge_runtime.heads.decisions import INVALID_MODEL_OUTPUT, InvalidModelOutput
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, failed_answer, refusal
from edge_runtime.questions.answers import DecisionAnswers
from edge_runtime.questions.base import PRESET
from edge_runtime.questions.choice import choice_answer
from edge_runtime.questions.noul import noul_answer
from edge_runtime.questions.score import score_answer
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState, NoValidQuestion


def _given_type(q: Question) -> str | None:
    """The type a failed answer reports: the question's, none for a bare preset (its card defines it)."""
    return None if q.type == PRESET else q.type
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")
OUTPUT = "last_hidden_state"


class Vela2Forward:
    """The backbone over right-padded rows, then the marker head on each row's hidden states alone.

    A row is an :class:`EncoderSequence`; its result is its :data:`SequenceOutput` (each placed
    question's option logits, and its word x label span block or None).
    """

    def __init__(self, encoder: EncoderForward, head: MarkerHead) -> None:
        self.encoder = encoder
        self.head = head

    def length(self, row: EncoderSequence) -> int:
        """Tokens in the row, markers and specials included."""
        return len(row.ids)

    def __call__(self, rows: Sequence[EncoderSequence]) -> list[SequenceOutput]:
        hidden = self.encoder(rows)
        return [self.read(row, out[OUTPUT]) for row, out in zip(rows, hidden)]

    def read(self, row: EncoderSequence, hidden: np.ndarray) -> SequenceOutput:
        """One row's head outputs from its hidden states [len, H]."""
        batch = hidden[None]
        idx = batch_indices([row])
        options = self.head.option_logits(batch, idx["q_index"], idx["opt_index"])
        spans = self.head.span_logits(batch, idx["unit_index"], idx["ent_index"])
        return split_outputs([row], options, spans)[0]


@dataclass
class _Item:
    """One row of one entry: its questions, the parts it reads, its engine rows (one per window)."""

    row: Row
    parts: list[EncodedPart]
    seqs: list[EncoderSequence]
    first: int


@dataclass
class _Entry:
    """One state of the request, with its questions in request order and what planning decided."""

    name: str | None
    state: State | None
    order: list[str]
    questions: dict[str, EngineQuestion] = field(default_factory=dict)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)
    items: list[_Item] = field(default_factory=list)
    tokens: int = 0
    readable: bool = False  # some question was one the model reads (it may still fail on length)
    lower_bound: bool = False  # a part of the state was read only in part


class Vela2Family(DecisionFamily[Vela2Forward]):
    """A loaded vela2 package: plans decisions requests into windows, answers from head outputs."""

    batchable = True

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_scan_tokens: int | None = None) -> None:
        card = package.card
        self.name = name or card.name
        self.assets = Vela2Assets.from_package(package)
        layout = self.assets.layout
        self.max_input_tokens = layout.max_length
        limits = card.limits
        self.max_scan_tokens = int(max_scan_tokens or limits.get("max_scan_tokens")
                                   or SCAN_INPUTS_CPU * layout.max_length)
        self.question_types = answered_types(card, QUESTION_TYPES)
        self.presets = frozenset(card.raw.get("presets") or ())
        self.modalities = frozenset(card.modalities)
        if session is not None:
            self._forward = Vela2Forward(EncoderForward(session, outputs=[OUTPUT], pad_id=layout.pad),
                                         self.assets.head)
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> EncoderSequence:
        """A random row of ``length`` tokens whose head reads a question, two options and a span block,
        so the probe proves the head batch-invariant too."""
        n = max(4, length)
        ids = self._probe_rng.integers(5, len(self.assets.tokens.tokenizer.get_vocab()), size=n).tolist()
        question = EngineQuestion("probe", "choice", "choice", "", ("user",), (("a", ""), ("b", "")), "probe")
        placed = PlacedQuestion(question, query=1, options=[2, 3], pool=(1, n))
        return EncoderSequence(ids, [placed], labels=[1], words=np.arange(2, n, dtype=np.int64),
                               word_offsets=np.zeros((n - 2, 2), np.int32))

    def warm(self) -> None:
        """Probe the tokenizer's budget cuts now (about a second), not on the first long state."""
        self.assets.tokens.reader.report()

    def describe(self) -> dict[str, Any]:
        """The question types and the presets this model answers."""
        return {**super().describe(), "presets": sorted(self.presets)}

    # -- planning ---------------------------------------------------------------------------

    def plan(self, surface: str, request: DecisionsRequest) -> Plan:
        """Rows for every window of every entry's rows; the finish step answers in request order.

        Raises ApiError for media (a vela2 model reads text), options.max_tokens over the model's
        scan budget, a batch all of whose entries are refused, and NoValidQuestion when no question
        is one this model can read.
        """
        if surface != SURFACE:
            raise ValueError(surface)
        scan = token_budget(request.options.max_tokens, self.max_scan_tokens, "scan budget (limits.max_scan_tokens)")
        rows: list[EncoderSequence] = []
        entries: list[_Entry] = []
        refusals: list[ApiError] = []
        for name, decision in request.entries():
            refused = media_refusal(self.name, self.modalities, decision, request)
            if refused is not None:
                if not request.is_batch:
                    raise refused
                refusals.append(refused)
                entries.append(self._refused(name, decision, refused))
                continue
            entries.append(self._plan_entry(name, decision, scan, rows))
        if refusals and len(refusals) == len(entries):
            raise refusals[0]
        if not any(e.readable for e in entries):
            raise NoValidQuestion(self._invalid(entries))
        return Plan(rows, lambda outputs: self.answer_entries(request, entries, outputs),
                    sum(e.tokens for e in entries))

    @staticmethod
    def _refused(name: str | None, decision: DecisionState, refused: ApiError) -> _Entry:
        entry = _Entry(name, None, [q.id for q in decision.questions])
        for q in decision.questions:
            entry.failed[q.id] = failed_answer(q.type, "invalid_input", "input_malformed", refused.message)
        return entry

    @staticmethod
    def _invalid(entries: list[_Entry]) -> list[tuple[str | None, InvalidQuestion]]:
        """Every failed question as an InvalidQuestion, for the no-valid-question refusal."""
        out: list[tuple[str | None, InvalidQuestion]] = []
        for entry in entries:
            for qid in entry.order:
                a = entry.failed[qid]
                out.append((entry.name, InvalidQuestion(qid, a["type"], a["reason"], a["message"], a["error"])))
        return out

    def _plan_entry(self, name: str | None, decision: DecisionState, scan: int,
                    rows: list[EncoderSequence]) -> _Entry:
        entry = _Entry(name, None, [q.id for q in decision.questions])
        answerable: list[Question] = []
        for q in decision.questions:
            if isinstance(q, InvalidQuestion):
                refused: InvalidQuestion | None = q
            elif q.type == PRESET and q.preset in self.presets:
                refused = None  # a bare preset: the card's trained question
            else:
                refused = refusal(q, self.name, self.question_types, truncates=True)
            if refused is not None:
                entry.failed[q.id] = refused.answer()
            else:
                answerable.append(q)  # type: ignore[arg-type]
        if not answerable:
            return entry
        try:
            entry.state = read_state(decision.state, decision.roles if decision.roles_given else None)
        except ValueError as e:
            for q in answerable:
                entry.failed[q.id] = failed_answer(_given_type(q), "invalid_question", "question_malformed",
                                                   f"the state cannot be read: {e}")
            return entry
        for q in answerable:
            try:
                entry.questions[q.id] = engine_question(q.id, self._engine_form(q), entry.state,
                                                        self.assets.calibration.raw)
            except QuestionInvalid as e:
                entry.failed[q.id] = failed_answer(_given_type(q), "invalid_question", "question_malformed", str(e))
        engine = [entry.questions[qid] for qid in entry.order if qid in entry.questions]
        if not engine:
            return entry
        entry.readable = True
        # a part is tokenized only as far as the scan budget needs: a longer one fails in windows and
        # is cut anyway when truncated, so its length costs nothing past the budget
        parts = encode_parts(entry.state, engine, self.assets.tokens, need=scan + 1)
        entry.lower_bound = not all(p.complete for p in parts)
        truncating = {q.id for q in answerable if q.overflow == "truncate"}
        for row, windows in self._reads(rows_of(engine), truncating, parts, scan):
            try:
                seqs = sequences(row, parts, self.assets.tokens, self.assets.layout, windows=windows,
                                 max_scan_tokens=scan)
            except (SchemaTooLong, ScanBudgetExceeded) as e:
                error, reason = ((MAX_LENGTH_EXCEEDED, "question_tokens") if isinstance(e, SchemaTooLong)
                                 else (SCAN_BUDGET_EXCEEDED, "scan_budget"))
                for eq in row.questions:
                    entry.failed[eq.id] = failed_answer(eq.kind, error, reason, str(e))
                    del entry.questions[eq.id]
                continue
            entry.items.append(_Item(row, parts, seqs, len(rows)))
            rows.extend(seqs)
            entry.tokens += sum(len(s) for s in seqs)
        return entry

    def _reads(self, rows: list[Row], truncating: set[str], parts: Sequence[Any], scan: int
               ) -> list[tuple[Row, bool]]:
        """Each row and whether it is read in windows. Questions that ask ``overflow: truncate``
        share their row as they would without it, unless a part has to be read in windows: they
        then read the row once, its parts cut, in a row of their own."""
        out: list[tuple[Row, bool]] = []
        for row in rows:
            cut = tuple(q for q in row.questions if q.id in truncating)
            if cut and self._windowed(row, parts, scan):
                rest = tuple(q for q in row.questions if q.id not in truncating)
                out.extend([(Row(rest), True)] if rest else [])
                out.append((Row(cut), False))
            else:
                out.append((row, not cut))
        return out

    def _windowed(self, row: Row, parts: Sequence[Any], scan: int) -> bool:
        """True when the row's parts do not fit one sequence (it would be read in windows)."""
        try:
            return len(sequences(row, parts, self.assets.tokens, self.assets.layout, max_scan_tokens=scan)) > 1
        except ScanBudgetExceeded:
            return True
        except SchemaTooLong:
            return False  # the questions alone do not fit: the row fails whichever way it is read

    def _engine_form(self, q: Question) -> dict[str, Any]:
        """The question as the engine reads it: a preset the card lists stands for the trained
        question (its own instructions and criteria are then not read); otherwise as written."""
        if q.type == PRESET:  # bare: the preset alone says what it asks
            form: dict[str, Any] = {"preset": q.preset}
        elif q.preset is not None and q.preset in self.presets:
            form = {"type": q.type, "preset": q.preset}
        else:
            options = [{"key": o.key, "description": o.description} for o in q.options]
            form = {"type": q.type, "instructions": q.instructions}
            if q.type == "noul":
                form["criteria"] = {o.key: o.description for o in q.options}
            elif q.type == "score":
                form["levels"] = [o.description for o in q.options]
            else:
                form["choices" if q.type == "choice" else "labels"] = options
        if q.threshold is not None:
            form["threshold"] = q.threshold
        return form

    # -- answers ------------------------------------------------------------------------------

    def answer_entries(self, request: DecisionsRequest, entries: list[_Entry],
               outputs: list[SequenceOutput] | ItemError) -> dict[str, Any]:
        """``{model, answers, spans?, sets?, thresholds?, usage}``, or ``{model, states, usage}``."""
        bodies = [self._entry_body(e, outputs) for e in entries]
        if not request.is_batch:
            return bodies[0]
        return {"model": self.name, "states": {e.name: b for e, b in zip(entries, bodies)},
                "usage": _usage(sum(e.tokens for e in entries), any(e.lower_bound for e in entries))}

    def _entry_body(self, entry: _Entry, outputs: list[SequenceOutput] | ItemError) -> dict[str, Any]:
        found = DecisionAnswers()
        for item in entry.items:
            if isinstance(outputs, ItemError):
                for q in item.row.questions:
                    found.add(q.id, failed_answer(q.kind, outputs.code, outputs.code, outputs.message))
                continue
            raw = combine(item.row, item.parts, item.seqs, outputs[item.first: item.first + len(item.seqs)])
            assert entry.state is not None
            for q in item.row.questions:
                try:
                    self._answer(q, raw, entry.state, found)
                except (InvalidOutput, InvalidModelOutput) as e:
                    found.add(q.id, failed_answer(q.kind, INVALID_MODEL_OUTPUT, "model_output_invalid", str(e)))
        answers: dict[str, Any] = {}
        for qid in entry.order:  # request order; a Set's label answers take its place
            if qid in entry.failed:
                answers[qid] = entry.failed[qid]
            elif qid in found.answers:
                answers[qid] = found.answers[qid]
            else:
                for label in entry.questions[qid].names:
                    answers[f"{qid}.{label}"] = found.answers[f"{qid}.{label}"]
        found.answers = answers
        return {"model": self.name, **found.body(), "usage": _usage(entry.tokens, entry.lower_bound)}

    def _answer(self, q: EngineQuestion, raw: Any, state: State, answers: DecisionAnswers) -> None:
        cal = self.assets.calibration
        if q.kind == "set":
            probs, threshold = set_probabilities(q, raw.logits[q.id], cal)
            answers.add_set(q.id, q.names, probs, threshold)
        elif q.kind == "span":
            spans, noul, threshold = read_spans(q, raw, state, cal)
            answers.answers[q.id] = noul_answer(noul)
            answers.spans[q.id] = spans
            answers.thresholds[q.id] = threshold
        else:
            probs, abstain = option_probabilities(q, raw.logits[q.id], cal)
            if q.kind == "choice":
                answers.add(q.id, choice_answer(q.names, probs, abstain))
            elif q.kind == "noul":
                answers.add(q.id, {**noul_answer(cal.noul(float(probs[1]))), "abstain_probability": abstain})
            else:
                answers.add(q.id, score_answer(q.legend, probs))


def _usage(tokens: int, lower_bound: bool) -> dict[str, Any]:
    """The tokens the model read; ``tokens_lower_bound`` when a state part was read only in part."""
    usage: dict[str, Any] = {"input_tokens": tokens, "output_tokens": 0}
    if lower_bound:
        usage["tokens_lower_bound"] = True
    return usage
