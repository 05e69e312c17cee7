"""Decision 2.0 questions from state to answers: the one code path of the server and the converter.

Each question renders to its own row (edge_runtime.families.decision2.prompt), rows are right-padded
into batches by :func:`pad_rows`, the numpy candidate head reads each row's option endpoints and
query, and answers follow §1.8 (:meth:`Decision2Assets.read`). The decision2 family
(edge_runtime.families.decision2.family) serves exactly this over HTTP; the converter's parity check feeds
its graph through :func:`pad_rows` and answers through :meth:`Decision2Assets.answer`; and
:func:`run_questions` runs raw questions in process with the backbone forward injected. One
question's row never depends on another's (right padding, per-row head), so answers are the same
alone or batched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_runtime.engine.batching import GREEDY_ROWS, GREEDY_TOKENS_CPU, greedy_batches, padded_width
from edge_runtime.families.decision2.candidate import CandidateHead, answer
from edge_runtime.families.decision2.prompt import PromptRow, PromptTooLong, render
from edge_runtime.heads.decisions import INVALID_MODEL_OUTPUT
from edge_runtime.questions import QUESTION_MALFORMED, failed_answer
from edge_runtime.text.bounds import BudgetReader

CONFIG_FORMAT = "decision2-package/1"
#: The question types a Decision 2.0 head answers.
QUESTION_TYPES = ("choice", "noul", "score")
#: feeds {input_ids, attention_mask, position_ids} [B, T] -> last_hidden_state [B, T, H]
RunHidden = Callable[[dict[str, np.ndarray]], np.ndarray]
#: A question's options in request order: (key, description); noul's are false then true.
Options = Sequence[tuple[str, Any]]


class HasIds(Protocol):
    """A row of token ids: a PromptRow, or the engine's CausalRow."""

    @property
    def ids(self) -> Sequence[int] | np.ndarray: ...


@dataclass(frozen=True)
class Decision2Assets:
    """A decision2 package's tokenizer, head, limits, temperatures and score bias."""

    tokenizer: Any
    head: CandidateHead
    max_input_tokens: int
    pad: int
    temperatures: dict[str, float]
    score_bias: dict[int, list[float]] | None
    reader: BudgetReader | None = None  # None: the state is tokenized whole (the converter)

    @staticmethod
    def from_package(package: Any) -> Decision2Assets:
        """The assets of a converted package (decision_config.json, tokenizer.json, head.npz)."""
        from edge_runtime.text.tokenizer import analyze, load_tokenizer

        cfg = package.decision_config() or {}
        if cfg.get("format") != CONFIG_FORMAT:
            raise ValueError(f"decision_config.json: format must be {CONFIG_FORMAT!r}")
        bias = cfg.get("score_bias") or None
        tokenizer = load_tokenizer(package.file("tokenizer.json"))
        return Decision2Assets(
            tokenizer, CandidateHead.from_arrays(package.head_weights()),
            int(cfg["max_input_tokens"]), int(cfg["pad_token_id"]),
            {k: float(v) for k, v in cfg["temperature_by_type"].items()},
            {int(k): [float(x) for x in v] for k, v in bias.items()} if bias else None,
            BudgetReader(tokenizer, analyze(tokenizer)))

    def render(self, state: Any, kind: str, instructions: Any, options: Options,
               limit: int | None = None) -> PromptRow:
        """The question's row; PromptTooLong past ``limit`` tokens (max_input_tokens by default)."""
        return render(self.tokenizer, state, kind, instructions, options,
                      self.max_input_tokens if limit is None else limit, self.reader)

    def logits(self, row: PromptRow, hidden: np.ndarray) -> np.ndarray:
        """Candidate logits [K] from the row's hidden states (``[T, H]``, T at least the row's length)."""
        return self.head.logits(hidden[row.endpoints], hidden[row.query])

    def answer(self, kind: str, options: Options, logits: Sequence[float] | np.ndarray) -> dict[str, Any]:
        """The §1.8 answer at the type's temperature; invalid model output fails in place."""
        try:
            return answer(kind, [k for k, _ in options], [float(v) for v in logits], self.temperatures[kind],
                          self.score_bias, [d for _, d in options])
        except ValueError as e:
            return failed_answer(kind, INVALID_MODEL_OUTPUT, "model_output_invalid", str(e))

    def read(self, kind: str, options: Options, row: PromptRow, hidden: np.ndarray) -> dict[str, Any]:
        """A question's answer from its row's hidden states."""
        return self.answer(kind, options, self.logits(row, hidden))


def too_long(kind: str | None, error: PromptTooLong) -> dict[str, Any]:
    """The in-place failure of a question whose row exceeds the model's token limit."""
    return failed_answer(kind, "max_length_exceeded", "question_tokens", str(error))


def question_options(raw: Mapping[str, Any]) -> tuple[str, list[tuple[str, Any]]]:
    """(kind, [(key, description)]) of a raw choice, noul or score question (§0 question -> options).

    The server parses requests through edge_runtime.questions instead; this reads the raw objects
    :func:`run_questions` takes.
    """
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
    raise ValueError(f"type {kind!r} is not answered by Decision 2.0 models ({', '.join(QUESTION_TYPES)})")


def pad_rows(rows: Sequence[HasIds], pad: int, multiple: int = 1) -> dict[str, np.ndarray]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``position_ids`` (arange) for ``rows``, the
    width rounded up to ``multiple`` (the session's row multiple, engine/cpu.py).

    Right padding keeps every row's hidden states bit-identical to running it alone (ORT CPU fp32);
    the server's forward, the converter's parity check and :func:`run_questions` all feed through here.
    """
    width = padded_width(max(len(r.ids) for r in rows), multiple)
    ids = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r.ids)] = r.ids
        mask[i, : len(r.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": np.tile(np.arange(width, dtype=np.int64), (len(rows), 1))}


def run_questions(state: Any, questions: Mapping[str, Any], assets: Decision2Assets, run_hidden: RunHidden,
                  max_batch_tokens: int = GREEDY_TOKENS_CPU) -> dict[str, Any]:
    """``{"answers": {...}, "usage": {"input_tokens", "output_tokens": 0}}`` in question order; a
    question that cannot be rendered, or that exceeds max_input_tokens, fails alone."""
    rows: dict[str, PromptRow] = {}
    kinds: dict[str, tuple[str, list[tuple[str, Any]]]] = {}
    answers: dict[str, Any] = {}
    for qid, raw in questions.items():
        given = raw.get("type") if isinstance(raw, Mapping) else None
        try:
            kind, opts = question_options(raw)
            kinds[qid] = (kind, opts)
            rows[qid] = assets.render(state, kind, raw.get("instructions"), opts)
        except PromptTooLong as e:
            answers[qid] = too_long(given, e)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            answers[qid] = failed_answer(given, "invalid_question", QUESTION_MALFORMED, str(e))
    ids = list(rows)
    for batch in greedy_batches([len(rows[q].ids) for q in ids], max_batch_tokens, GREEDY_ROWS):
        chosen = [rows[ids[i]] for i in batch]
        hidden = run_hidden(pad_rows(chosen, assets.pad))
        for r, i in enumerate(batch):
            kind, opts = kinds[ids[i]]
            answers[ids[i]] = assets.read(kind, opts, chosen[r], hidden[r])
    return {"answers": {q: answers[q] for q in questions},
            "usage": {"input_tokens": sum(len(r.ids) for r in rows.values()), "output_tokens": 0}}


__all__ = ["CONFIG_FORMAT", "QUESTION_TYPES", "Decision2Assets", "HasIds", "Options", "RunHidden", "pad_rows",
           "question_options", "run_questions", "too_long"]
