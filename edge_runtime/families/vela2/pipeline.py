"""One Vela 2.0 request from state and questions to the response body, with the forward injected.

The upstream path, as the converter's parity check runs it: plan (§2.3), rows, sequences and
windows (§2.4), sorted greedy batches with right padding (§2.5), the readout of each batch (a
callable: ONNX Runtime plus the numpy marker head, or PyTorch), combine (§2.8) and upstream's own
answers. The server's vela2 family (edge_runtime.families.vela2.family) plans and combines with the same
functions, lets the executor batch the sequences, and answers in the contract's shapes. Because
batches are right-padded and every readout index is per row, a request's answers are the same
alone or batched with others.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.engine.batching import GREEDY_ROWS, GREEDY_TOKENS_CPU, greedy_batches
from edge_runtime.families.vela2.answers import MAX_LENGTH_EXCEEDED, Calibration, answer_question, response_body
from edge_runtime.families.vela2.layout import (
    EncoderSequence,
    LayoutConfig,
    RawRow,
    ScanBudgetExceeded,
    SchemaTooLong,
    SequenceOutput,
    Tokens,
    batch_indices,
    combine,
    encode_parts,
    pad_batch,
    sequences,
    split_outputs,
)
from edge_runtime.families.vela2.marker import MarkerHead
from edge_runtime.families.vela2.state import Plan, Row, plan, rows_of

SCAN_BUDGET_EXCEEDED = "scan_budget_exceeded"
#: The default scan budget on CPU: four model inputs (32,768 tokens for the 0.3B's 8,192).
SCAN_INPUTS_CPU = 4

#: (padded feeds {input_ids, attention_mask}, index tensors) -> (option logits [No], span logits [Nw, Ne])
Readout = Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]]


def graph_readout(run_hidden: Callable[[dict[str, np.ndarray]], np.ndarray], head: MarkerHead) -> Readout:
    """A readout from a backbone forward (feeds -> last_hidden_state [B, T, H]) and the numpy head."""
    def readout(feeds: dict[str, np.ndarray], idx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        hidden = run_hidden(feeds)
        return (head.option_logits(hidden, idx["q_index"], idx["opt_index"]),
                head.span_logits(hidden, idx["unit_index"], idx["ent_index"]))
    return readout


@dataclass
class RequestResult:
    """What one request produced: the plan, rows, their raw logits (None: row failed) and the body."""

    plan: Plan
    rows: list[Row]
    raws: list[RawRow | None]
    body: dict[str, Any]
    sequences: list[list[EncoderSequence]] = field(default_factory=list)


def run_sequences(seqs: Sequence[EncoderSequence], readout: Readout, pad_id: int,
                  max_batch_tokens: int = GREEDY_TOKENS_CPU, max_rows: int = GREEDY_ROWS) -> list[SequenceOutput]:
    """Every sequence's outputs, read in sorted greedy right-padded batches."""
    outputs: list[SequenceOutput | None] = [None] * len(seqs)
    for batch in greedy_batches([len(s) for s in seqs], max_batch_tokens, max_rows):
        chosen = [seqs[i] for i in batch]
        opt, span = readout(pad_batch(chosen, pad_id), batch_indices(chosen))
        for i, out in zip(batch, split_outputs(chosen, np.asarray(opt), np.asarray(span))):
            outputs[i] = out
    return [o for o in outputs if o is not None]


def run_request(state: Any, questions: Mapping[str, Any], *, tokens: Tokens, layout: LayoutConfig,
                calibration: Calibration, readout: Readout, windows: bool = True,
                max_scan_tokens: int | None = None, max_batch_tokens: int = GREEDY_TOKENS_CPU) -> RequestResult:
    """Answer one request. ``windows=False`` reads a cut row once, truncated (overflow truncate);
    ``max_scan_tokens`` (default: four inputs, ``SCAN_INPUTS_CPU * max_length``) bounds a windowed part."""
    if max_scan_tokens is None:
        max_scan_tokens = SCAN_INPUTS_CPU * layout.max_length
    p = plan(state, questions, calibration.raw)
    rows = rows_of(p.questions)
    parts = encode_parts(p.state, p.questions, tokens)
    per_row: list[list[EncoderSequence]] = []
    failed: dict[str, dict[str, Any]] = {}
    for row in rows:
        try:
            per_row.append(sequences(row, parts, tokens, layout, windows=windows, max_scan_tokens=max_scan_tokens))
        except (SchemaTooLong, ScanBudgetExceeded) as e:
            per_row.append([])
            code = MAX_LENGTH_EXCEEDED if isinstance(e, SchemaTooLong) else SCAN_BUDGET_EXCEEDED
            for q in row.questions:
                failed[q.id] = {"type": q.kind, "error": code, "message": str(e)}
    flat = [s for seqs in per_row for s in seqs]
    outputs = run_sequences(flat, readout, layout.pad, max_batch_tokens) if flat else []
    raws: list[RawRow | None] = []
    response: dict[str, Any] = {"answers": {}}
    at = 0
    for row, seqs in zip(rows, per_row):
        if not seqs:
            raws.append(None)
            continue
        raw = combine(row, parts, seqs, outputs[at: at + len(seqs)])
        at += len(seqs)
        raws.append(raw)
        for q in row.questions:
            answer_question(q, raw, p.state, calibration, response)
    answers = dict(response["answers"])
    answers.update(failed)
    answers.update(p.errors)
    extras = {k: v for k, v in response.items() if k != "answers"}
    body = response_body(p.order, answers, extras, sum(len(s) for s in flat))
    return RequestResult(p, rows, raws, body, per_row)


CONFIG_FORMAT = "vela2-package/1"


@dataclass(frozen=True)
class Vela2Assets:
    """What a vela2 package gives the pipeline: tokenizer, layout, calibration and numpy head."""

    tokens: Tokens
    layout: LayoutConfig
    calibration: Calibration
    head: MarkerHead

    @staticmethod
    def from_package(package: Any) -> Vela2Assets:
        """From a verified package (``edge_runtime.packages.read_package``); ValueError when malformed.

        Refuses a tokenizer that still turns a marker string into a marker id: markers must only
        ever be inserted by id.
        """
        from edge_runtime.families.vela2.answers import check_calibration
        from edge_runtime.text.tokenizer import load_tokenizer

        cfg = package.decision_config() or {}
        if cfg.get("format") != CONFIG_FORMAT:
            raise ValueError(f"decision_config.json: format must be {CONFIG_FORMAT!r}")
        layout = LayoutConfig.from_config(cfg["layout"])
        check_calibration(cfg["calibration"])
        head = MarkerHead.from_arrays(package.head_weights(), cfg["readout"])
        tokens = Tokens(load_tokenizer(package.file("tokenizer.json")))
        markers = set(layout.marker_ids.values())
        leaked = [m for m in layout.marker_ids if set(tokens.ids(m)) & markers]
        if leaked:
            raise ValueError(f"tokenizer.json turns {leaked} into marker ids; markers must be stripped")
        return Vela2Assets(tokens, layout, Calibration(cfg["calibration"]), head)
