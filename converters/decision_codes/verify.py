"""Verification of a decision-codes export: sample requests rendered by the server's own prompt code, their
code probabilities compared with Transformers', state-once with each question alone, and int8 agreement
with fp32."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from edge_runtime.families.codes_prompt import (
    CodesPrompt,
)
from edge_runtime.heads.decisions import code_probabilities, select_temperature

#: The largest |onnx - torch| a code probability may show; the fixture measures far below it.
PROBABILITY_TOLERANCE = 1e-4
#: State-once against each question alone (measured bit-identical on ORT CPU fp32).
STATE_ONCE_TOLERANCE = 1e-5

# Requests the verification renders (the shared golden request, and more shapes and lengths).
SAMPLES: list[dict[str, Any]] = [
    {"state": "Write a Python function that merges two sorted lists and explain its running time.",
     "questions": {
         "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
                    "criteria": {"code": "Programming", "math": "Mathematics", "other": "Anything else"}},
         "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
         "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                        "criteria": ["Trivial", "Moderate", "Hard"]}}},
    {"state": "My card was charged twice and the parcel never arrived.",
     "questions": {
         "team": {"type": "choice", "choices": [{"key": "billing", "description": "payments and refunds"},
                                                {"key": "shipping", "description": "parcels and delivery"},
                                                {"key": "tech"}, {"key": "sales"}, {"key": "other"}]},
         "urgent": {"type": "noul", "instructions": "Is this urgent?",
                    "criteria": {"true": "the customer needs help today"}}}},
    {"state": {"user": "Où est ma commande ? Ça fait déjà 10 jours.", "order": {"id": 1182, "status": "shipped"}},
     "questions": {
         "mood": {"type": "score", "instructions": "How upset is the customer?",
                  "levels": ["calm", "a little", "upset", "angry", "furious"]}}},
    {"state": "", "questions": {"empty": {"type": "noul", "instructions": "Is the state empty?"}}},
    {"state": "Our servers in Frankfurt were unreachable for twelve minutes last night. "
              "The invoice was sent twice. The meeting has been moved to Thursday at 3 pm in room 4B. "
              "Please cancel my subscription before the next billing cycle.",
     "questions": {
         "topics": {"type": "choice", "instructions": "What is the main topic?",
                    "criteria": {"outage": None, "billing": "invoices", "meetings": None}},
         "action": {"type": "noul", "instructions": "Does the author ask for an action?"}}},
]


@dataclass
class Case:
    state_ids: list[int]
    question_ids: list[int]
    count: int
    temperature: float

    @property
    def ids(self) -> list[int]:
        return [*self.state_ids, *self.question_ids]


def sample_cases(prompt: CodesPrompt, config: dict[str, Any], cap: int) -> list[list[Case]]:
    """Each sample request as its questions' token ids, grouped by request (one state each)."""
    from edge_runtime.requests.decisions import parse_decisions_request

    groups = []
    for body in SAMPLES:
        entry = parse_decisions_request(body).single
        assert entry is not None
        questions = list(entry.valid)
        listed = questions if prompt.header else None
        temperature = select_temperature(config, len(questions))
        state = prompt.state_ids(entry.state, listed, cap)
        if state is None:
            continue
        cases = []
        for n, q in enumerate(questions, 1):
            ids = prompt.question_ids(q, n if prompt.header else None, cap - len(state))
            if ids is not None:
                cases.append(Case(state, ids, len(q.options), temperature))
        if cases:
            groups.append(cases)
    if not groups:
        raise ConversionError(f"no sample request fits the model's {cap} tokens per question")
    return groups


def _torch_probabilities(lm: Any, case: Case, token_ids: Sequence[int], trained: np.ndarray | None,
                         softcap: float | None) -> tuple[np.ndarray, np.ndarray]:
    """Transformers' code probabilities and last hidden state for one prompt (batch 1, no padding)."""
    import torch

    ids = torch.tensor([case.ids], dtype=torch.long)
    with torch.no_grad():
        hidden = lm.base_model(input_ids=ids).last_hidden_state[0, -1].float().numpy()
        if trained is None:
            logits = lm(input_ids=ids).logits[0, -1].float().numpy().astype(np.float64)
            z = logits[list(token_ids[: case.count])]  # the LM's own logits, soft-capping included
        else:
            z = (trained[: case.count] @ hidden).astype(np.float64)
            if softcap:
                z = softcap * np.tanh(z / softcap)
    z = z / case.temperature
    e = np.exp(z - z.max())
    return e / e.sum(), hidden


@dataclass
class Verified:
    probabilities: float
    hidden: float
    state_once: float | None
    cases: int
    lengths: list[int]
    spread: float


def verify_graph(lm: Any, graph: Path, groups: list[list[Case]], token_ids: Sequence[int], readout: np.ndarray,
            bias: np.ndarray | None, trained: bool, softcap: float | None, pad_id: int, state_once: bool) -> Verified:
    from edge_runtime.engine.causal import CausalForward, branch_row, causal_row
    from edge_runtime.engine.session import create_session

    forward = CausalForward(create_session(graph, "cpu", 1), pad_id=pad_id)
    worst_p = worst_h = spread = 0.0
    worst_branch: float | None = 0.0 if state_once else None
    cases = [c for g in groups for c in g]
    alone = []
    for case in cases:
        (h,) = forward([causal_row(case.ids)])
        alone.append(h)
        p = code_probabilities(h, readout, case.count, case.temperature, bias, softcap)
        ref, ref_h = _torch_probabilities(lm, case, token_ids, readout if trained else None, softcap)
        if not np.all(np.isfinite(p)):
            raise ConversionError("verification: the graph's code probabilities are not finite")
        worst_p = max(worst_p, float(np.max(np.abs(p - ref))))
        worst_h = max(worst_h, float(np.max(np.abs(h - ref_h))))
        spread = max(spread, float(p.max() - p.min()))
    if worst_p > PROBABILITY_TOLERANCE or math.isnan(worst_p):
        raise ConversionError(f"verification failed: code probabilities differ from Transformers' by {worst_p:.3g}, "
                              f"above {PROBABILITY_TOLERANCE:g}; no package written")
    if state_once:
        i = 0
        for group in groups:
            (branched,) = forward([branch_row(group[0].state_ids, [c.question_ids for c in group])])
            for j, case in enumerate(group):
                p_b = code_probabilities(branched[j], readout, case.count, case.temperature, bias, softcap)
                p_a = code_probabilities(alone[i], readout, case.count, case.temperature, bias, softcap)
                worst_branch = max(worst_branch or 0.0, float(np.max(np.abs(p_b - p_a))))
                i += 1
        if worst_branch is not None and worst_branch > STATE_ONCE_TOLERANCE:
            raise ConversionError(f"verification failed: state-once differs from each question alone by "
                                  f"{worst_branch:.3g}, above {STATE_ONCE_TOLERANCE:g}; no package written")
    return Verified(worst_p, worst_h, worst_branch, len(cases), sorted({len(c.ids) for c in cases}), spread)


def int8_agreement(fp32: Path, int8: Path, groups: list[list[Case]], readout: np.ndarray, bias: np.ndarray | None,
               softcap: float | None, pad_id: int) -> dict[str, Any]:
    """Code probabilities of the int8 backbone against fp32, every sample question alone:
    max and mean |dp|, and how often the top code agrees."""
    from edge_runtime.engine.causal import CausalForward, causal_row
    from edge_runtime.engine.session import create_session

    a = CausalForward(create_session(fp32, "cpu", 1), pad_id=pad_id)
    b = CausalForward(create_session(int8, "cpu", 1), pad_id=pad_id)
    dps, tops = [], []
    for case in (c for g in groups for c in g):
        (ha,) = a([causal_row(case.ids)])
        (hb,) = b([causal_row(case.ids)])
        pa = code_probabilities(ha, readout, case.count, case.temperature, bias, softcap)
        pb = code_probabilities(hb, readout, case.count, case.temperature, bias, softcap)
        if not np.all(np.isfinite(pb)):
            raise ConversionError("int8: the quantized graph's code probabilities are not finite")
        dps.append(float(np.max(np.abs(pa - pb))))
        tops.append(int(np.argmax(pa)) == int(np.argmax(pb)))
    return {"metric": "code_probability", "max_abs_dp": round(max(dps), 6),
            "mean_abs_dp": round(float(np.mean(dps)), 6), "top_label_agreement": round(float(np.mean(tops)), 6),
            "cases": len(dps)}
