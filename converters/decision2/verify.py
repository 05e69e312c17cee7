"""Verification of a Decision 2.0 export: the package's candidate logits (ONNX graph and numpy head,
through the server's pipeline) against the PyTorch model, and a merged LoRA against the unmerged
forward."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from converters.decision2.source import (
    Decision2Source,
)
from converters.errors import ConversionError
from converters.lora import LoraFactor, unmerged
from edge_runtime.families.decision2.candidate import CandidateHead
from edge_runtime.families.decision2.pipeline import Decision2Assets, pad_rows
from edge_runtime.families.decision2.prompt import PromptRow

#: |onnx+numpy - torch| allowed on a candidate logit (the fixtures measure 3-4e-7)
LOGIT_TOLERANCE = 1e-5


#: merged LoRA vs the unmerged forward, on last_hidden_state
MERGE_TOLERANCE = 1e-4
GOLDEN_STATE = "Write a Python function that merges two sorted lists and explain its running time."
GOLDEN_QUESTIONS: list[tuple[str, str, list[tuple[str, Any]]]] = [
    ("choice", "Which domain does this request belong to?",
     [("code", "Programming"), ("math", "Mathematics"), ("other", "Anything else")]),
    ("noul", "Does answering this request need multi-step reasoning?", [("false", None), ("true", None)]),
    ("score", "How difficult is this request?", [("0", "Trivial"), ("1", "Moderate"), ("2", "Hard")]),
]


def unmerged_hidden(model: Any, factors: Mapping[str, LoraFactor], ids: Sequence[int]) -> Any:
    """last_hidden_state with LoRA applied as base(x) + B(A(x)) * scaling (hooks, no merge)."""
    import torch

    with unmerged(model, factors), torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)])).last_hidden_state[0]


def torch_head_logits(head: dict[str, np.ndarray], hidden: Any, row: PromptRow) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in head.items()}
    h = hidden.shape[-1]
    c = F.layer_norm(hidden[row.endpoints], (h,), t["candidate_norm.weight"], t["candidate_norm.bias"], eps=1e-5)
    q = F.layer_norm(hidden[row.query], (h,), t["query_norm.weight"], t["query_norm.bias"], eps=1e-5)
    d = t["key.weight"].shape[0]
    bil = (c @ t["key.weight"].T * (t["query.weight"] @ q)).sum(-1) / math.sqrt(d)
    mlp = F.gelu(c @ t["candidate_mlp.weight"].T + t["candidate_mlp.bias"] + t["query_mlp.weight"] @ q)
    return (bil + mlp @ t["scalar.weight"][0]).numpy()


def check_questions(n: int, seed: int) -> list[tuple[Any, str, Any, list[tuple[str, Any]]]]:
    """(state, kind, instructions, options): the golden three, then ``n`` generated ones."""
    rng = random.Random(seed)
    states = [GOLDEN_STATE, {"user": "Où est ma commande ?", "order": {"id": 1182}}, ["a", 1, None],
              "Summarise: " + "the quick brown fox jumps over the lazy dog. " * 20]
    out: list[tuple[Any, str, Any, list[tuple[str, Any]]]] = [(GOLDEN_STATE, k, i, o) for k, i, o in GOLDEN_QUESTIONS]
    for i in range(n):
        kind = ("choice", "noul", "score")[i % 3]
        state = rng.choice(states)
        if kind == "choice":
            opts = [(f"opt{j}", rng.choice([None, "Programming", {"x": [1, 2]}, "Anything else"]))
                    for j in range(rng.randint(2, 6))]
        elif kind == "noul":
            opts = [("false", rng.choice([None, "no"])), ("true", rng.choice([None, "yes, clearly"]))]
        else:
            opts = [(str(j), f"level {j}") for j in range(rng.choice([2, 3, 5, 7]))]
        out.append((state, kind, rng.choice(["Which fits?", {"task": "route"}, "How hard?"]), opts))
    return out


def graph_feeds(rows: Sequence[PromptRow], names: Sequence[str], pad: int) -> dict[str, np.ndarray]:
    """The server's right-padded feeds, limited to the graph's inputs ``names``."""
    feeds = pad_rows(list(rows), pad)
    return {n: feeds[n] for n in names}


@dataclass
class Decision2Parity:
    logits: float
    merge: float | None
    questions: int


def verify_parity(model: Any, session: Any, tok: Any, head_arrays: dict[str, np.ndarray], source: Decision2Source,
                  pad: int, n: int, seed: int) -> Decision2Parity:
    """The package's path (the server's Decision2Assets: rows, padding, head, §1.8 answers) against
    PyTorch (the source backbone and the head in torch), on the golden and ``n`` generated questions."""
    import torch

    limit = int(source.manifest["max_input_tokens"])
    assets = Decision2Assets(tok, CandidateHead.from_arrays(head_arrays), limit, pad, source.temperatures,
                             source.score_bias)
    qs = check_questions(n, seed)
    rows = [assets.render(s, k, i, o) for s, k, i, o in qs]
    names = [i.name for i in session.get_inputs()]
    hidden = session.run(["last_hidden_state"], graph_feeds(rows, names, pad))[0]
    worst = 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices on shared CPUs: one thread is much faster
    try:
        for r, row, (_, kind, _, opts) in zip(range(len(rows)), rows, qs):
            got = assets.logits(row, hidden[r])
            with torch.no_grad():
                ref_h = model(input_ids=torch.tensor([row.ids])).last_hidden_state[0]
            want = torch_head_logits(head_arrays, ref_h, row)
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
            a, b = assets.answer(kind, opts, got), assets.answer(kind, opts, want)
            if "error" in a or "error" in b:
                raise ConversionError(f"parity: question {r} has no answer: {a} vs {b}")
            if a.get("choice") != b.get("choice") or any(
                    abs(a["probabilities"][k] - b["probabilities"][k]) > 1e-4 for k in a.get("probabilities", {})):
                raise ConversionError(f"parity: question {r} answers differ: {a} vs {b}")
    finally:
        torch.set_num_threads(threads)
    if not worst <= LOGIT_TOLERANCE:
        raise ConversionError(f"parity check failed: max |package - torch| candidate logit {worst:.3g} exceeds "
                              f"{LOGIT_TOLERANCE:g}; no package written")
    return Decision2Parity(worst, None, len(qs))
