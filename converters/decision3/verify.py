"""Decision 3.0 conversion checks: generated requests, the graph against our torch forward and against
Transformers 5 (through .venv-ref), the BF16 agreement, state-once against whole rows, and the goldens."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.decision3 import source as src
from converters.errors import ConversionError
from edge_runtime.engine.causal import causal_row
from edge_runtime.families.decision3.family import QUESTION_TYPES
from edge_runtime.families.decision3.prompt import D3Prompt, PromptTokens, common_prefix
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.questions import Question, parse_question

CHECK_BATCH = 8
_WORDS = ("route", "the", "request", "to", "a", "model", "that", "answers", "it", "best", "code", "math", "State",
          "option", "Question", "data", "not", "instructions", "Yes", "No", "écrire", "函数", "🙂", "{\"k\": 1}", "42",
          "merge", "sorted", "lists", "and", "explain", "running", "time.")


# ---- requests for the checks ------------------------------------------------------------------


def sample_requests(count: int, seed: int = 0) -> list[tuple[Any, dict[str, Any]]]:
    """``count`` deterministic (state, questions) pairs: empty, short, JSON and long states (hundreds of
    tokens, across the GDN chunk boundary), choice / noul / score questions with string and JSON texts."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    out: list[tuple[Any, dict[str, Any]]] = []
    for i in range(count):
        shape = i % 5
        state: Any = ("" if shape == 0 else words(rng.randint(2, 12)) if shape in (1, 2)
                      else {"turns": [words(4), words(6)], "n": i} if shape == 3 else words(rng.randint(120, 260)))
        questions: dict[str, Any] = {}
        for j in range(rng.randint(1, 3)):
            kind = QUESTION_TYPES[(i + j) % 3]
            if kind == "choice":
                keys = [f"k{m}" for m in range(rng.randint(2, 6))]
                criteria = {k: (None if rng.random() < 0.2 else words(rng.randint(1, 4)) if rng.random() < 0.8
                                else {"label": words(2)}) for k in keys}
                questions[f"q{j}"] = {"type": "choice", "instructions": words(rng.randint(3, 9)), "criteria": criteria}
            elif kind == "noul":
                q: dict[str, Any] = {"type": "noul", "instructions": words(rng.randint(3, 9))}
                if rng.random() < 0.4:
                    q["criteria"] = {"true": words(3), "false": words(2)}
                questions[f"q{j}"] = q
            else:
                levels = [f"{words(2)} {m}" for m in range(rng.randint(2, 5))]
                questions[f"q{j}"] = {"type": "score", "instructions": words(rng.randint(3, 9)), "criteria": levels}
        out.append((state, questions))
    return out


@dataclass
class Row:
    request: int
    question: Question
    ids: tuple[int, ...]


def check_rows(prompt: D3Prompt, requests: Sequence[tuple[Any, dict[str, Any]]], limit: int) -> list[Row]:
    rows = []
    for r, (state, questions) in enumerate(requests):
        for qid, raw in questions.items():
            q = parse_question(qid, raw)
            if not isinstance(q, Question):
                raise ConversionError(f"check request {r}: question {qid} is invalid ({q.message})")
            got = prompt.tokens(state, q, limit)
            if not isinstance(got, PromptTokens):
                raise ConversionError(f"check request {r}: question {qid} does not fit {limit} tokens")
            rows.append(Row(r, q, got.ids))
    return rows


# ---- checks -------------------------------------------------------------------------------------


@dataclass
class Verified:
    reference: str
    probabilities: float
    hidden: float
    cases: int
    lengths: list[int]
    transformers: bool
    bf16: dict[str, Any] = field(default_factory=dict)
    torch_core: float = 0.0
    #: state-once against whole rows: max |dp| of the code probabilities (the bound), and of the hidden
    #: states (recorded: at d3-edge's width fp32 rounding alone moves them by ~6e-5 while dp stays ~6e-6)
    state_once: float | None = None
    state_once_hidden: float | None = None


def _ours(graph: Path, embeddings: np.ndarray, attention_mode: str, rows: Sequence[Row]) -> np.ndarray:
    """Last-token hidden states of the rows from the ONNX graph through the server's Forward."""
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    forward = RecurrentForward(create_session(graph, "cpu", 2), embeddings, attention_mode=attention_mode)
    out: list[np.ndarray] = []
    for start in range(0, len(rows), CHECK_BATCH):
        out += forward([causal_row(r.ids) for r in rows[start:start + CHECK_BATCH]])
    return np.stack(out)


def _state_once(graph: Path, embeddings: np.ndarray, rows: Sequence[Row], whole: np.ndarray,
                readout: np.ndarray, temperature: float) -> tuple[float, float]:
    """(max |dp|, max |h_branch - h_whole|) over the requests with two or more questions (prefix
    run once, each question continued from its states) against their whole rows."""
    from edge_runtime.engine.causal import branch_row
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    forward = RecurrentForward(create_session(graph, "cpu", 2), embeddings, attention_mode="causal")
    dp = dh = 0.0
    for r in sorted({row.request for row in rows}):
        index = [i for i, row in enumerate(rows) if row.request == r]
        if len(index) < 2:
            continue
        ids = [rows[i].ids for i in index]
        k = common_prefix(ids)
        got = forward([branch_row(ids[0][:k], [s[k:] for s in ids])])[0]
        dh = max(dh, float(np.abs(got - whole[index]).max()))
        mine = [rows[i] for i in index]
        dp = max(dp, _max_diff(_probabilities(got, mine, readout, temperature),
                               _probabilities(whole[index], mine, readout, temperature)))
    return dp, dh


def _padded_ids(rows: Sequence[Row], pad_id: int) -> dict[str, np.ndarray]:
    width = max(len(r.ids) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, :len(r.ids)] = r.ids
        mask[b, :len(r.ids)] = 1
    positions = np.broadcast_to(np.arange(width, dtype=np.int64), (len(rows), 3, width)).copy()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def _torch_core(weights: dict[str, Any], text_config: dict[str, Any], attention_mode: str, embeddings: np.ndarray,
                rows: Sequence[Row]) -> np.ndarray:
    """Our torch forward (the module the graph was exported from), right-padded, last real tokens."""
    import torch

    from converters.decision3.backbone import build_text_core

    core = build_text_core(weights, text_config, attention_mode)
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), CHECK_BATCH):
            chunk = rows[start:start + CHECK_BATCH]
            feeds = _padded_ids(chunk, 0)
            embeds = torch.from_numpy(embeddings[feeds["input_ids"]] * feeds["attention_mask"][..., None])
            result = core(embeds.float(), torch.from_numpy(feeds["attention_mask"]),
                          torch.from_numpy(feeds["position_ids"]), *core.empty_pasts(len(chunk)))
            hidden = result[0].numpy()
            out.append(hidden[np.arange(len(chunk)), [len(r.ids) - 1 for r in chunk]])
    return np.concatenate(out)


def _probabilities(hidden: np.ndarray, rows: Sequence[Row], readout: np.ndarray, temperature: float
                   ) -> list[np.ndarray]:
    return [code_probabilities(h, readout, len(r.question.options), temperature) for h, r in zip(hidden, rows)]


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def verify(source: src.Decision3Source, weights: dict[str, Any], graph: Path, embeddings: np.ndarray,
            readout: np.ndarray, rows: list[Row], pad_id: int, reference: bool) -> Verified:
    mode, temperature = source.attention_mode, source.temperature
    ours = _ours(graph, embeddings, mode, rows)
    p_ours = _probabilities(ours, rows, readout, temperature)
    core = _torch_core(weights, source.text_config, mode, embeddings, rows)
    core_diff = _max_diff(p_ours, _probabilities(core, rows, readout, temperature))
    lengths = sorted(len(r.ids) for r in rows)
    verified = Verified(reference="", probabilities=core_diff, hidden=float(np.abs(ours - core).max()),
                         cases=len(rows), lengths=[lengths[0], lengths[len(lengths) // 2], lengths[-1]],
                         transformers=False, torch_core=core_diff)
    if reference:
        from converters.decision3.export import reference_hidden

        files = [source.root / w for w in source.weights if w.endswith(".safetensors")]
        feeds = _padded_ids(rows, pad_id)
        ref = reference_hidden(files, source.config, feeds, mode, ("float32", "bfloat16"))
        last = np.array([len(r.ids) - 1 for r in rows])
        h32 = ref["float32"][np.arange(len(rows)), last]
        h16 = ref["bfloat16"][np.arange(len(rows)), last]
        p32 = _probabilities(h32, rows, readout, temperature)
        p16 = _probabilities(h16, rows, readout, temperature)
        agree = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(p_ours, p16))
        verified.probabilities = _max_diff(p_ours, p32)
        verified.hidden = float(np.abs(ours - h32).max())
        verified.transformers = True
        verified.bf16 = {"argmax_agreement": round(agree / len(rows), 4), "cases": len(rows),
                         "max_abs_diff_probabilities": float(f"{_max_diff(p_ours, p16):.3g}")}
    if mode == "causal":
        verified.state_once, verified.state_once_hidden = _state_once(graph, embeddings, rows, ours, readout,
                                                                      temperature)
    return verified


def goldens(graph: Path, embeddings: np.ndarray, rows: Sequence[Row]
             ) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Batch-1 golden cases (the shortest, a middle and the longest check row) over empty states."""
    from edge_runtime.engine.recurrent import RecurrentForward, text_positions
    from edge_runtime.engine.session import create_session

    session = create_session(graph, "cpu", 1)
    forward = RecurrentForward(session, embeddings)
    ordered = sorted(rows, key=lambda r: len(r.ids))
    cases = []
    for row in (ordered[0], ordered[len(ordered) // 2], ordered[-1]):
        n = len(row.ids)
        feeds: dict[str, np.ndarray] = {"inputs_embeds": np.asarray(embeddings[list(row.ids)], dtype=np.float32)[None],
                 "attention_mask": np.ones((1, n), dtype=np.int64), "position_ids": text_positions(0, n)[None],
                 **forward.empty_states(1)}
        cases.append((feeds, session.run(feeds, ["last_hidden_state"])))
    return cases
