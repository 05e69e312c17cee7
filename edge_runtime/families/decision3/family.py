"""decision3 family: Decision 3.0 code-readout packages on a hybrid recurrent/attention text core.

A question is one prompt (prompt.py, the released d3 format) whose options are listed under single-token
answer codes; the text core (model.onnx: Qwen3.5's Gated DeltaNet and attention layers, fp32 on the BF16
weights) reads it, and the readout scores the question's codes at its last real token:
``p = softmax(h R[:K]^T / T)`` (heads/decisions.code_probabilities; float64 softmax), renormalised and
answered through the shared question registry (Choice, Noul, Score; the contract's confidence).

Rows: one per question, right-padded in batches (engine/recurrent.py: padded positions neither decay nor
write the recurrent state, so a row's answer does not depend on its batch; the load-time probe proves it).
``attention_mode`` ``causal``: state-once, the longest common token prefix of a request's question prompts
runs once and each question continues from its GDN and attention states (``usage`` counts the prefix once).
``noncausal_full_attention``: every question runs its whole prompt: a full-attention layer lets the prefix's
positions attend to the question's tokens, so no prefix state can be shared. Nothing is truncated: a prompt
over ``max_input_tokens`` fails its question with ``max_length_exceeded``. Text only for now: the packages
hold no vision core yet, so images and videos are refused (image_unsupported / video_unsupported).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edge_runtime.engine.causal import BranchRow, CausalRow, branch_row, causal_row
from edge_runtime.engine.recurrent import CAUSAL, NONCAUSAL, RecurrentForward
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.decision3.prompt import D3Prompt, PromptTokens, common_prefix, refusal
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    assemble,
    plan_entries,
)
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, answer
from edge_runtime.questions import refusal as type_refusal
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState

CONFIG_FORMAT = "decision3-config/1"
QUESTION_TYPES = ("choice", "noul", "score")
READOUT = "readout"  # head.npz: float32 [255, hidden]
EMBEDDINGS = "embeddings.npy"


def check_config(config: dict[str, Any]) -> None:
    """Raise ValueError when decision_config.json is not one this family reads."""
    if config.get("format") != CONFIG_FORMAT or config.get("prompt") != "d3":
        raise ValueError(f"decision_config.json must have format {CONFIG_FORMAT!r} and prompt 'd3'")
    codes, ids = config.get("codes"), config.get("token_ids")
    if (not isinstance(codes, list) or not isinstance(ids, list) or len(codes) != len(ids) or len(codes) < 2
            or len(set(codes)) != len(codes) or not all(isinstance(c, str) and c for c in codes)):
        raise ValueError("decision_config codes must be 2 or more distinct strings, one token id each")
    if config.get("attention_mode") not in (CAUSAL, NONCAUSAL):
        raise ValueError(f"attention_mode must be {CAUSAL} or {NONCAUSAL}")
    t = config.get("temperature")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        raise ValueError("temperature must be a finite number > 0")
    if not isinstance(config.get("pad_id"), int):
        raise ValueError("decision_config pad_id must be an integer")


class Decision3Family(DecisionFamily[RecurrentForward]):
    """A loaded decision3 package: plans decisions requests into rows, answers from last hidden states."""

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_input_tokens: int | None = None) -> None:
        card = package.card
        config = package.require_decision_config()
        check_config(config)
        self.name = name or card.name
        self.config = config
        self.prompt = D3Prompt.from_file(package.file("tokenizer.json"), config["codes"])
        self.prompt.check_codes(config["token_ids"])
        readout = package.head_weights().get(READOUT)
        if readout is None or readout.ndim != 2 or readout.shape[0] != len(self.prompt.codes):
            raise ValueError(f"package {card.name}: head.npz needs {READOUT!r} [{len(self.prompt.codes)}, hidden]")
        self.readout = np.ascontiguousarray(readout, dtype=np.float32)
        self.embeddings = np.load(package.file(EMBEDDINGS), mmap_mode="r", allow_pickle=False)
        if self.embeddings.ndim != 2 or self.embeddings.shape[1] != self.readout.shape[1]:
            raise ValueError(f"{EMBEDDINGS} is {list(self.embeddings.shape)}; the readout's hidden size is "
                             f"{self.readout.shape[1]}")
        self.attention_mode = str(config["attention_mode"])
        self.state_once = self.attention_mode == CAUSAL
        self.batchable = not self.state_once  # a state-once row already batches its own questions
        self.temperature = float(config["temperature"])
        self.max_input_tokens = int(card.limits["max_input_tokens"])
        if max_input_tokens is not None:
            self.max_input_tokens = min(self.max_input_tokens, int(max_input_tokens))
        self.question_types = answered_types(card, QUESTION_TYPES)
        self.modalities = frozenset(card.modalities)
        self._vocab = self.prompt.tokenizer.get_vocab_size()
        if self._vocab > self.embeddings.shape[0]:
            raise ValueError(f"the tokenizer has {self._vocab} ids; {EMBEDDINGS} has {self.embeddings.shape[0]} rows")
        if session is not None:
            self._forward = RecurrentForward(session, self.embeddings, attention_mode=self.attention_mode)
            if self._forward.hidden != self.readout.shape[1]:
                raise ValueError(f"the graph's hidden size {self._forward.hidden} differs from the readout's "
                                 f"{self.readout.shape[1]}")
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> CausalRow:
        """A fresh random row of ``length`` tokens on every call (the probe needs distinct rows)."""
        return causal_row(self._probe_rng.integers(0, self._vocab, size=max(1, length)))

    def probabilities(self, hidden: np.ndarray, count: int) -> np.ndarray:
        """The first ``count`` codes' probabilities for one last-token hidden state."""
        return code_probabilities(hidden, self.readout, count, self.temperature)

    def describe(self) -> dict[str, Any]:
        return {"question_types": list(self.question_types)}

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Render and tokenize every answerable question; decide the others' answers now."""
        cap = self.budget(request)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, cap, rows))

    def _plan_entry(self, name: str | None, entry: DecisionState, cap: int,
                    rows: list[CausalRow | BranchRow]) -> tuple[Entry, ApiError | None]:
        planned = Entry(name, [], temperature=self.temperature)
        run: list[Slot] = []
        for q in entry.questions:
            refused: InvalidQuestion | None = None
            if isinstance(q, Question):
                refused = type_refusal(q, self.name, self.question_types) or refusal(q, len(self.prompt.codes))
            slot = Slot(refused or q)
            planned.slots.append(slot)
            if not isinstance(slot.question, Question):
                continue
            got = self.prompt.tokens(entry.state, slot.question, cap)
            if isinstance(got, PromptTokens):
                slot.ids = list(got.ids)
                run.append(slot)
            else:
                slot.answer = got
        if not run:
            return planned, None
        ids = [s.ids or [] for s in run]
        if self.state_once and len(run) > 1:
            shared = common_prefix(ids)
            for j, slot in enumerate(run):
                slot.row, slot.branch = len(rows), j
            rows.append(branch_row(ids[0][:shared], [r[shared:] for r in ids]))
            planned.tokens = shared + sum(len(r) - shared for r in ids)
        else:
            for slot, r in zip(run, ids):
                slot.row = len(rows)
                rows.append(causal_row(r))
            planned.tokens = sum(len(r) for r in ids)
        return planned, None

    # -- answers ------------------------------------------------------------------------------

    def finish(self, plan: DecisionPlan, outputs: list[Any] | ItemError) -> dict[str, Any]:
        """The body: ``{model, answers, usage}``, or ``{model, states, usage}`` for a batch."""
        return assemble(plan, outputs, self.name, self._read)

    def _read(self, q: Question, slot: Slot, entry: Entry, output: np.ndarray) -> dict[str, Any]:
        hidden = output if slot.branch is None else output[slot.branch]
        return answer(q, self.probabilities(hidden, len(q.options)))


__all__ = ["CONFIG_FORMAT", "Decision3Family", "QUESTION_TYPES", "check_config"]
