"""vela2 family: Vela 2.0 encoder packages answering Choice, Noul, Score, Set and Span questions.

A decisions request is read as upstream reads it (docs/reference/upstream-formats.md §2.3-§2.8), on
the decision families' frame (decision_plan.DecisionFamily: entries, slots, refusals, usage, the
answers' assembly): the state becomes parts with roles, the questions (parsed by edge_runtime.questions)
engine questions (a preset the card lists replaces the question as written), the questions rows,
each row one model input or, when its one read part is too long, windows over that part up to the
scan budget. Every window is one engine row; the executor batches them right-padded and the forward
applies the numpy marker head to each row alone, so a row's logits do not depend on what it was
batched with. Where the frame differs: ``row_outputs`` combines a row's windows, ``add_answer``
answers in the contract's shapes: Choice and Noul from the option softmax (with the abstain
marker's share as ``abstain_probability``), Score, Set as one Noul per label plus ``sets`` and
``thresholds`` (the question's threshold, else the calibration's ``set:<key>``, else ``set:*``;
labels at or above it are selected), Span as ``spans`` with code-point offsets and a Noul.
Confidence is the contract's statistic, not upstream's margin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.engine.encoder import EncoderForward
from edge_runtime.families.base import token_budget
from edge_runtime.families.decision_plan import DecisionFamily, DecisionPlan, Entry, Slot, answered_types, plan_entries
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
    RawRow,
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
    question_in_engine_form,
    read_state,
    rows_of,
)
from edge_runtime.heads.decisions import INVALID_MODEL_OUTPUT, InvalidModelOutput
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, failed_answer, refusal
from edge_runtime.questions.answers import DecisionAnswers
from edge_runtime.questions.base import PRESET, QUESTION_MALFORMED
from edge_runtime.questions.choice import choice_answer
from edge_runtime.questions.noul import noul_answer
from edge_runtime.questions.score import score_answer
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState

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


@dataclass(frozen=True)
class _Item:
    """One row of questions of one entry: the state and parts it reads, its engine rows (one per window)."""

    row: Row
    parts: list[EncodedPart]
    seqs: list[EncoderSequence]
    first: int
    state: State


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

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Rows for every window of every entry's rows of questions.

        Raises ApiError for options.max_tokens over the model's scan budget, media (a vela2 model
        reads text), a batch all of whose entries are refused, and NoValidQuestion when no question
        is one this model can read.
        """
        scan = token_budget(request.options.max_tokens, self.max_scan_tokens, "scan budget (limits.max_scan_tokens)")
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, scan, rows))

    def _plan_entry(self, name: str | None, decision: DecisionState, scan: int,
                    rows: list[EncoderSequence]) -> Entry:
        planned = Entry(name, [])
        slots: dict[str, Slot] = {}
        for q in decision.questions:
            if isinstance(q, InvalidQuestion):
                refused: InvalidQuestion | None = q
            elif q.type == PRESET and q.preset in self.presets:
                refused = None  # a bare preset: the card's trained question
            else:
                refused = refusal(q, self.name, self.question_types, truncates=True)
            planned.slots.append(Slot(refused or q))
            if refused is None:
                slots[q.id] = planned.slots[-1]
        if not slots:
            return planned
        try:
            state = read_state(decision.state, decision.roles if decision.roles_given else None)
        except ValueError as e:
            for slot in slots.values():
                slot.question = _invalid(slot.question, f"the state cannot be read: {e}")
            return planned
        engine: list[EngineQuestion] = []  # in request order
        for slot in slots.values():
            q = slot.question
            assert isinstance(q, Question)
            preset = q.preset if q.type == PRESET or q.preset in self.presets else None
            try:
                eq = question_in_engine_form(q, state, self.assets.calibration.raw, preset)
            except QuestionInvalid as e:
                slot.question = _invalid(q, str(e))
                continue
            if q.type == PRESET:  # answered (and failed) as the type the preset stands for
                slot.question = dataclasses.replace(q, type=eq.kind)
            engine.append(eq)
        if not engine:
            return planned
        # a part is tokenized only as far as the scan budget needs: a longer one fails in windows and
        # is cut anyway when truncated, so its length costs nothing past the budget
        parts = encode_parts(state, engine, self.assets.tokens, need=scan + 1)
        planned.tokens_lower_bound = not all(p.complete for p in parts)
        truncating = {q.id for q in decision.valid if q.overflow == "truncate"}
        for row, windows in self._reads(rows_of(engine), truncating, parts, scan):
            try:
                seqs = sequences(row, parts, self.assets.tokens, self.assets.layout, windows=windows,
                                 max_scan_tokens=scan)
            except (SchemaTooLong, ScanBudgetExceeded) as e:
                error, reason = ((MAX_LENGTH_EXCEEDED, "question_tokens") if isinstance(e, SchemaTooLong)
                                 else (SCAN_BUDGET_EXCEEDED, "scan_budget"))
                for eq in row.questions:
                    slots[eq.id].answer = failed_answer(eq.kind, error, reason, str(e))
                continue
            item = _Item(row, parts, seqs, len(rows), state)
            for eq in row.questions:
                slots[eq.id].row, slots[eq.id].reading = len(rows), (eq, item)
            rows.extend(seqs)
            planned.tokens += sum(len(s) for s in seqs)
        return planned

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

    # -- answers ------------------------------------------------------------------------------

    def row_outputs(self, plan: DecisionPlan, outputs: Sequence[SequenceOutput]) -> list[RawRow | None]:
        """A row of questions is read in windows, one engine row each: its windows' outputs are
        combined (layout.combine), the result at its first window's place, where its slots read it."""
        combined: list[RawRow | None] = [None] * len(outputs)
        for entry in plan.entries:
            for slot in entry.slots:
                if slot.reading is not None and slot.row is not None and combined[slot.row] is None:
                    item: _Item = slot.reading[1]
                    combined[slot.row] = combine(item.row, item.parts, item.seqs,
                                                 outputs[item.first: item.first + len(item.seqs)])
        return combined

    def add_answer(self, answers: DecisionAnswers, q: Question, slot: Slot, entry: Entry,
                   outputs: Sequence[Any]) -> None:
        """A question from its row's combined logits, at the calibration's temperatures and thresholds
        (a Set's and a Span's extras too); an unusable output fails the question in place."""
        eq, item = slot.reading
        assert slot.row is not None
        try:
            self._answer(eq, outputs[slot.row], item.state, answers)
        except (InvalidOutput, InvalidModelOutput) as e:
            answers.add(q.id, failed_answer(eq.kind, INVALID_MODEL_OUTPUT, "model_output_invalid", str(e)))

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


def _invalid(q: Question | InvalidQuestion, message: str) -> InvalidQuestion:
    """A question the model cannot read as asked (question_malformed); a bare preset has no type of its own."""
    return InvalidQuestion(q.id, None if q.type == PRESET else q.type, QUESTION_MALFORMED, message)
