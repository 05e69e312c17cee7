"""decision-codes family: a causal LM backbone reads the options under single-token codes.

The prompt is codes-v1 (edge_runtime/families/codes_prompt.py): the state part, then each question's
part with its options under the package's single-token codes.

A Set over labels L1..Ln is n Noul rows, one per label, answered under ``<id>.<label>``: label i's
row is exactly the row of a Noul whose instructions are the Set's followed by a blank line (when it
has any), then ``"Label: " + Li + "\\nDoes this label apply?"`` (``Li`` shown as a Choice option
is), with the default false/true options, so each label's probability is P(true). Under
header-v1 every label row is titled with the Set's number. ``sets.<id>`` selects the labels at or
above the question's threshold, else :data:`edge_runtime.questions.sets.DEFAULT_THRESHOLD` (0.5),
which ``thresholds.<id>`` reports. A label too long fails the whole Set in place (under its ID), as does
a label whose output is unusable. A Set does not count towards ``temperature_by_questions`` (the
contract counts Choice, Noul and Score questions); its labels read at the request's temperature.
Span is refused (question_type_unsupported): codes cannot point into the state.

Readout (numpy): ``z = R[:K] @ h_last`` (R from head.npz, one row per code; codes past the option
count are not read, which is the masking), ``softmax(z / T)``; T is ``temperature``, or with
``temperature_by_questions`` the request's from its number of Choice, Noul and Score questions.

``attention_mode`` ``causal``: one row per question, ``state + question``, right-padded batches.
``prefix_causal`` (state-once): one row per state, the state run once and every question branched
from its key/value cache; ``usage`` counts the state once. Limits: each question (the state and that
question) at most ``validated_input_tokens`` (``max_input_tokens`` with ``options.long_context``),
else that question fails in place with ``max_length_exceeded`` (reason ``question_tokens``); a
state-once request at most ``max_request_tokens`` (the state once and every question), else 400
``invalid_request`` (reason ``request_tokens``, with the limit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_runtime.engine.causal import BranchRow, CausalForward, CausalRow, branch_row, causal_row
from edge_runtime.errors import ApiError
from edge_runtime.families.code_options import describe, keyed_text
from edge_runtime.families.codes_prompt import READOUT, READOUT_BIAS, CodesPrompt
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    input_limit,
    plan_entries,
)
from edge_runtime.heads.decisions import code_probabilities, select_temperature
from edge_runtime.packages import Package
from edge_runtime.questions import DecisionOption, InvalidQuestion, Question, answer, failed_answer, refusal
from edge_runtime.questions.noul import KEYS as NOUL_KEYS
from edge_runtime.questions.sets import label_id
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState

QUESTION_TYPES = ("choice", "noul", "score", "set")
#: The types whose count selects a request's temperature (temperature_by_questions).
COUNTED_TYPES = ("choice", "noul", "score")
LABEL_ASK = "Does this label apply?"


def label_instructions(q: Question, label: DecisionOption) -> str:
    """The instructions of one Set label's Noul: the Set's own, then the label and the ask."""
    lines = [] if q.instructions is None else [describe(q.instructions), ""]
    return "\n".join([*lines, f"Label: {keyed_text(label)}", LABEL_ASK])


def label_nouls(q: Question) -> list[Question]:
    """A Set's labels, each the Noul that answers it under ``<id>.<label>`` (default false/true)."""
    return [Question(label_id(q.id, o.key), "noul", label_instructions(q, o),
                     tuple(DecisionOption(k, None) for k in NOUL_KEYS)) for o in q.options]


class DecisionCodesFamily(DecisionFamily[CausalForward]):
    """A loaded decision-codes package: plans decisions requests into rows, answers from hidden states."""

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_input_tokens: int | None = None) -> None:
        card = package.card
        config = package.require_decision_config()
        self.name = name or card.name
        self.config = config
        self.prompt = CodesPrompt.from_files(package.file("tokenizer.json"), config)
        self.prompt.check_codes(config["token_ids"])
        weights = package.head_weights()
        if READOUT not in weights:
            raise ValueError(f"package {card.name}: head.npz has no {READOUT!r} array")
        self.readout = np.ascontiguousarray(weights[READOUT], dtype=np.float32)
        if self.readout.ndim != 2 or self.readout.shape[0] != len(self.prompt.codes):
            raise ValueError(f"head.npz readout has shape {self.readout.shape}, expected "
                             f"[{len(self.prompt.codes)}, hidden]")
        bias = weights.get(READOUT_BIAS)
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float32).reshape(-1)
        self.softcap = config.get("logit_softcap")
        self.state_once = config["attention_mode"] == "prefix_causal"
        self.batchable = not self.state_once  # a state-once row already batches its own questions
        limits = card.limits
        self.max_input_tokens = input_limit(card, max_input_tokens)
        validated = limits.get("validated_input_tokens")
        self.validated_input_tokens = None if validated is None else min(int(validated), self.max_input_tokens)
        request_cap = limits.get("max_request_tokens")
        self.max_request_tokens = int(request_cap) if request_cap is not None else self.max_input_tokens
        self.question_types = answered_types(card, QUESTION_TYPES)
        self.modalities = frozenset(card.modalities)
        self.pad_id = int(config.get("pad_token_id", 0))
        if session is not None:
            self._forward = CausalForward(session, pad_id=self.pad_id)
            hidden = session.outputs["last_hidden_state"].shape[-1]
            if isinstance(hidden, int) and hidden != self.readout.shape[1]:
                raise ValueError(f"the graph's hidden size {hidden} differs from the readout's {self.readout.shape[1]}")
            if self.state_once and not self.forward.has_past:
                raise ValueError("attention_mode prefix_causal needs a graph with past key/value inputs")
        self._vocab = self.prompt.text.get_vocab_size()
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> CausalRow:
        """A fresh random row of ``length`` tokens on every call (the probe needs distinct rows)."""
        return causal_row(self._probe_rng.integers(0, self._vocab, size=max(1, length)))

    def probabilities(self, hidden: np.ndarray, count: int, temperature: float) -> np.ndarray:
        """The first ``count`` codes' probabilities for one last-token hidden state."""
        return code_probabilities(hidden, self.readout, count, temperature, self.bias, self.softcap)

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Render and tokenize every answerable question; decide the others' answers now.

        Raises ApiError for a standard request with images or videos, or over max_request_tokens
        (state-once), for a batch all of whose entries are refused, and NoValidQuestion when no
        question is one this model answers.
        """
        cap = self.budget(request)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, cap, rows))

    def _unsupported(self, q: Question) -> InvalidQuestion | None:
        refused = refusal(q, self.name, self.question_types)
        # a Set's labels are Noul rows of two options each, which every package's codes hold
        if refused is None and q.type != "set" and len(q.options) > len(self.prompt.codes):
            return InvalidQuestion(q.id, q.type, "too_many_options",
                                   f"model {self.name!r} lists at most {len(self.prompt.codes)} options under its "
                                   f"codes; this question has {len(q.options)}")
        return refused

    def _too_long(self, q: Question, cap: int) -> dict[str, Any]:
        hint = ""
        if self.validated_input_tokens is not None and cap == self.validated_input_tokens < self.max_input_tokens:
            hint = f"; options.long_context reads up to {self.max_input_tokens}"
        return failed_answer(q.type, "max_length_exceeded", "question_tokens",
                       f"the state and this question take more than the {cap} tokens "
                       f"this model reads per question{hint}")

    def _plan_entry(self, name: str | None, entry: DecisionState, cap: int,
                    rows: list[CausalRow | BranchRow]) -> Entry:
        planned = Entry(name, [])
        answerable: list[Slot] = []
        for q in entry.questions:
            refused = None if isinstance(q, InvalidQuestion) else self._unsupported(q)
            slot = Slot(refused or q)
            planned.slots.append(slot)
            if isinstance(slot.question, Question):
                answerable.append(slot)
        planned.temperature = select_temperature(
            self.config, sum(1 for q in entry.valid if q.type in COUNTED_TYPES))
        if not answerable:
            return planned
        # header-v1 holds for text-only requests without Box or track questions (the contract)
        header = self.prompt.header and not any(q.type in ("box", "track") for q in entry.valid)
        listed = [s.question for s in answerable] if header else None
        state_ids = self.prompt.state_ids(entry.state, listed, cap)  # type: ignore[arg-type]
        run: list[Slot] = []  # every row to read: a question's own, or each of a Set's labels
        for n, slot in enumerate(answerable, 1):
            q = slot.question
            assert isinstance(q, Question)
            if q.type == "set":
                slot.labels = [Slot(noul) for noul in label_nouls(q)]
            reads = slot.labels or [slot]
            for part in reads:
                assert isinstance(part.question, Question)
                part.ids = (None if state_ids is None else
                            self.prompt.question_ids(part.question, n if header else None, cap - len(state_ids)))
            if any(part.ids is None for part in reads):
                slot.answer, slot.labels = self._too_long(q, cap), []
            else:
                run.extend(reads)
        if not run:
            return planned
        assert state_ids is not None
        if self.state_once:
            total = len(state_ids) + sum(len(s.ids or ()) for s in run)
            if total > self.max_request_tokens:
                raise ApiError(
                    "invalid_request",
                    f"the state once and every question take {total} tokens, more than the model's "
                    f"max_request_tokens {self.max_request_tokens}",
                    reason="request_tokens", limit=self.max_request_tokens)
            for j, slot in enumerate(run):
                slot.row, slot.branch = len(rows), j
            rows.append(branch_row(state_ids, [s.ids for s in run]))  # type: ignore[misc]
            planned.tokens = total
        else:
            for slot in run:
                slot.row = len(rows)
                rows.append(causal_row([*state_ids, *slot.ids]))  # type: ignore[misc]
                planned.tokens += len(state_ids) + len(slot.ids or ())
        return planned

    # -- answers ------------------------------------------------------------------------------

    def read(self, q: Question, slot: Slot, entry: Entry, output: np.ndarray) -> dict[str, Any]:
        """A question's answer from its row's hidden state (its branch's, state-once); a Set label's Noul too."""
        hidden = output if slot.branch is None else output[slot.branch]
        return answer(q, self.probabilities(hidden, len(q.options), entry.temperature))


__all__ = ["DecisionCodesFamily", "label_instructions", "label_nouls"]
