"""Decision 2.0 questions from state to answers, with the backbone forward injected.

The core the decision2 family will run (not wired to the server yet): each question renders to
its own row (edge_runtime.text.decision2_prompt), rows are read in sorted, right-padded greedy
batches by a ``run_hidden`` callable (ONNX Runtime on the causal engine in the server), the
numpy candidate head reads each row's option endpoints and query, and answers follow §1.8. One
question's row never depends on another's (right padding, per-row head), so answers are the same
alone or batched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_runtime.heads.candidate import CandidateHead, answer
from edge_runtime.text.decision2_prompt import PromptRow, PromptTooLong, render
from edge_runtime.text.vela2_layout import BATCH_ROWS, BATCH_TOKENS_CPU, greedy_batches

CONFIG_FORMAT = "decision2-package/1"
#: feeds {input_ids, attention_mask, position_ids} [B, T] -> last_hidden_state [B, T, H]
RunHidden = Callable[[dict[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Decision2Assets:
    """A decision2 package's tokenizer, head, limits, temperatures and score bias."""

    tokenizer: Any
    head: CandidateHead
    max_input_tokens: int
    pad: int
    temperatures: dict[str, float]
    score_bias: dict[int, list[float]] | None

    @staticmethod
    def from_package(package: Any) -> Decision2Assets:
        from edge_runtime.text.tokenizer import load_tokenizer

        cfg = package.decision_config() or {}
        if cfg.get("format") != CONFIG_FORMAT:
            raise ValueError(f"decision_config.json: format must be {CONFIG_FORMAT!r}")
        bias = cfg.get("score_bias") or None
        return Decision2Assets(
            load_tokenizer(package.file("tokenizer.json")), CandidateHead.from_arrays(package.head_weights()),
            int(cfg["max_input_tokens"]), int(cfg["pad_token_id"]),
            {k: float(v) for k, v in cfg["temperature_by_type"].items()},
            {int(k): [float(x) for x in v] for k, v in bias.items()} if bias else None)


def question_options(raw: Mapping[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """(kind, [(key, description)]) of a choice, noul or score question (§0 question -> options)."""
    kind = raw.get("type")
    if kind == "choice":
        if isinstance(raw.get("choices"), list):
            return kind, [(c["key"], c.get("description")) for c in raw["choices"]]
        return kind, list(dict(raw.get("criteria") or {}).items())
    if kind == "noul":
        given = raw.get("criteria")
        crit: dict[str, Any] = given if isinstance(given, dict) else {}
        return kind, [("false", crit.get("false")), ("true", crit.get("true"))]
    if kind == "score":
        levels = raw.get("criteria") if raw.get("criteria") is not None else raw.get("levels")
        return kind, [(str(i), level) for i, level in enumerate(levels or [])]
    raise ValueError(f"type {kind!r} is not answered by Decision 2.0 models (choice, noul, score)")


def pad_rows(rows: list[PromptRow], pad: int) -> dict[str, np.ndarray]:
    width = max(len(r.ids) for r in rows)
    ids = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = r.ids
        mask[i, : len(r.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": np.tile(np.arange(width, dtype=np.int64), (len(rows), 1))}


def run_questions(state: Any, questions: Mapping[str, Any], assets: Decision2Assets, run_hidden: RunHidden,
                  max_batch_tokens: int = BATCH_TOKENS_CPU) -> dict[str, Any]:
    """``{"answers": {...}, "usage": {"input_tokens", "output_tokens": 0}}`` in question order; a
    question that cannot be rendered, or that exceeds max_input_tokens, fails alone."""
    rows: dict[str, PromptRow] = {}
    kinds: dict[str, tuple[str, list[tuple[str, Any]]]] = {}
    answers: dict[str, Any] = {}
    for qid, raw in questions.items():
        try:
            kind, opts = question_options(raw)
            kinds[qid] = (kind, opts)
            rows[qid] = render(assets.tokenizer, state, kind, raw.get("instructions"), opts, assets.max_input_tokens)
        except PromptTooLong as e:
            answers[qid] = {"type": raw.get("type"), "error": "max_length_exceeded", "message": str(e)}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            answers[qid] = {"type": raw.get("type") if isinstance(raw, Mapping) else None,
                            "error": "invalid_question", "message": str(e)}
    ids = list(rows)
    for batch in greedy_batches([len(rows[q].ids) for q in ids], max_batch_tokens, BATCH_ROWS):
        chosen = [rows[ids[i]] for i in batch]
        hidden = run_hidden(pad_rows(chosen, assets.pad))
        for r, i in enumerate(batch):
            qid, row = ids[i], chosen[r]
            kind, opts = kinds[qid]
            logits = assets.head.logits(hidden[r, row.endpoints], hidden[r, row.query])
            try:
                answers[qid] = answer(kind, [k for k, _ in opts], logits.tolist(), assets.temperatures[kind],
                                      assets.score_bias, [d for _, d in opts])
            except ValueError as e:
                answers[qid] = {"type": kind, "error": "invalid_model_output", "message": str(e)}
    return {"answers": {q: answers[q] for q in questions},
            "usage": {"input_tokens": sum(len(r.ids) for r in rows.values()), "output_tokens": 0}}
