"""The Vela 2.0 encoder's token layout: markers by id, truncation, windows, readout indices.

docs/reference/upstream-formats.md §2.4-§2.6 and §2.8 (combining windows). One row of questions
becomes one sequence:

    <bos> ([Q] text ([O] option)* [ABS]?)* ([E] label)* [SEP_SCHEMA] ([SEG_role] part)* <eos>

Markers are inserted by id from the package config; the package tokenizer has them removed from
its added tokens (:func:`strip_markers`), so user text that spells ``[Q]`` stays ordinary text.
A row that does not fit ``max_length`` shrinks the part no question reads first (to 64 tokens,
then to 1), then the read parts in order; when a read part had to be cut and the row reads one
part, the row is read in token windows of the kept length instead (``windows=False``: the
truncated single sequence, the ``overflow: truncate`` path). Right padding only: a row's outputs
are then the same alone or in any batch.

Pure numpy and tokenizers; the family calls :func:`encode_parts`, :func:`sequences`,
:func:`pad_batch`, :func:`batch_indices`, :func:`split_outputs` and
:func:`combine`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.families.vela2.state import EngineQuestion, Row, State, option_text, span_roles
from edge_runtime.families.vela2.words import Words, window_words, words_of
from edge_runtime.text.bounds import BudgetReader
from edge_runtime.text.tokenizer import analyze

MARKERS: tuple[str, ...] = ("[Q]", "[O]", "[ABS]", "[SEP_SCHEMA]", "[SEG_user]", "[SEG_answer]", "[E]",
                            "[SEG_context]")
#: The logit a word gets when no window read it.
UNCOVERED_LOGIT = -30.0
#: The part no question reads keeps at least this many tokens before read parts are cut.
PROMPT_FLOOR = 64


class SchemaTooLong(ValueError):
    """The questions of a row alone do not fit: every question of the row is max_length_exceeded."""


class ScanBudgetExceeded(ValueError):
    """The part a row would read in windows has more tokens than the scan budget: none of it is read,
    every question of the row is scan_budget_exceeded."""


def strip_markers(tokenizer_json: Mapping[str, Any]) -> dict[str, Any]:
    """A tokenizer.json object without the 8 marker added tokens, padding and truncation off.

    Upstream strips them at load so that no user text can produce a marker id; our converter
    strips them once and the package carries the stripped tokenizer.
    """
    out = copy.deepcopy(dict(tokenizer_json))
    out["added_tokens"] = [t for t in out.get("added_tokens") or [] if t.get("content") not in MARKERS]
    out["padding"] = None
    out["truncation"] = None
    return out


@dataclass(frozen=True)
class LayoutConfig:
    """What the layout needs from a package: marker ids, specials and limits."""

    marker_ids: dict[str, int]
    bos: int
    eos: int
    pad: int
    max_length: int
    window_overlap: int

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> LayoutConfig:
        """From a Vela 2.0 config.json (or our decision_config.json ``config`` block)."""
        markers = {str(k): int(v) for k, v in dict(config["marker_ids"]).items()}
        if set(markers) != set(MARKERS):
            raise ValueError(f"marker_ids must name exactly the 8 markers {list(MARKERS)}")
        if len(set(markers.values())) != len(MARKERS):
            raise ValueError("marker_ids must be distinct")
        cfg = LayoutConfig(markers, int(config["bos_token_id"]), int(config["eos_token_id"]),
                           int(config["pad_token_id"]), int(config["max_length"]), int(config["window_overlap"]))
        if cfg.max_length < 8 or cfg.window_overlap < 0:
            raise ValueError("max_length must be at least 8 and window_overlap non-negative")
        return cfg


@dataclass(frozen=True)
class EncodedPart:
    """A part's token ids; offsets and words only when a span question reads it."""

    role: str
    ids: np.ndarray
    offsets: np.ndarray | None = None
    words: Words | None = None
    complete: bool = True  # False: the text has more tokens than ``ids`` (read up to a budget)

    def window(self, start: int, end: int, words: Words | None) -> EncodedPart:
        offsets = None if self.offsets is None else self.offsets[start:end]
        return EncodedPart(self.role, self.ids[start:end], offsets, words)


class Tokens:
    """The package tokenizer as the layout uses it: no specials, short strings cached, long parts
    read only as far as a budget needs (edge_runtime.text.bounds)."""

    def __init__(self, tokenizer: Tokenizer, cache: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.ids = lru_cache(maxsize=cache)(self._ids)
        self._reader: BudgetReader | None = None

    def _ids(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    @property
    def reader(self) -> BudgetReader:
        """The budget cut for this tokenizer, built (and probed) on first use."""
        if self._reader is None:
            self._reader = BudgetReader(self.tokenizer, analyze(self.tokenizer))
        return self._reader

    def part(self, role: str, text: str, with_words: bool, need: int | None = None) -> EncodedPart:
        """The part's tokens: all of them, or with ``need`` at least that many exact first tokens
        (``complete`` False when the text has more)."""
        read = self.reader.read(text, need) if need is not None else self.reader.whole(text)
        ids = np.asarray(read.ids, dtype=np.int32)
        if not with_words:
            return EncodedPart(role, ids, complete=read.complete)
        offsets = np.asarray(read.offsets, dtype=np.int32).reshape(-1, 2)
        seen = text if read.complete or not len(offsets) else text[: int(offsets[-1, 1])]
        return EncodedPart(role, ids, offsets, words_of(seen, offsets), complete=read.complete)


def encode_parts(state: State, questions: Sequence[EngineQuestion], tokens: Tokens,
                 need: int | None = None) -> list[EncodedPart]:
    """Every part tokenized once, up to ``need`` tokens when given; parts a span reads also get
    offsets and words. A part cut short can only be read truncated: a row that would read it in
    windows has more than ``need`` tokens to scan, so ``need`` is the scan budget plus one."""
    spans = span_roles(questions)
    return [tokens.part(p.role, p.text, p.role in spans, need) for p in state.parts]


@dataclass(frozen=True)
class Budget:
    """Kept tokens per part, and how many were cut from the unread part and from read parts."""

    lengths: dict[str, int]
    shrink_cut: int = 0
    protected_cut: int = 0


def fit(question_costs: Sequence[int], label_costs: Sequence[int], parts: Sequence[tuple[str, int]],
        max_length: int, read: set[str]) -> Budget:
    """The truncation steps of §2.4 on token counts; SchemaTooLong when the schema alone is too long."""
    schema = sum(question_costs) + sum(label_costs)
    lengths = dict(parts)
    fixed = 3 + len(parts)  # bos, eos, SEP_SCHEMA and one SEG marker per part
    shrink_cut = protected_cut = 0

    def over() -> int:
        return fixed + schema + sum(lengths.values()) - max_length

    unread = next((role for role, _ in parts if role not in read), None)
    if unread is not None:
        if over() > 0:
            keep = max(min(lengths[unread], PROMPT_FLOOR), lengths[unread] - over())
            shrink_cut += lengths[unread] - keep
            lengths[unread] = keep
        if over() > 0:
            keep = max(1, lengths[unread] - over())
            shrink_cut += lengths[unread] - keep
            lengths[unread] = keep
    for role, _ in parts:
        if role in read and over() > 0:
            keep = max(1, lengths[role] - over())
            protected_cut += lengths[role] - keep
            lengths[role] = keep
    if over() > 0:
        raise SchemaTooLong(f"the questions alone exceed the {max_length}-token input by {over()} tokens")
    return Budget(lengths, shrink_cut, protected_cut)


@dataclass
class PlacedQuestion:
    """Where a non-span question sits: its [Q], its [O] (then [ABS]) markers, its pool [start, end)."""

    question: EngineQuestion
    query: int
    options: list[int]
    pool: tuple[int, int]


@dataclass
class EncoderSequence:
    """One model input. ``words``: positions of the span part's word starts; ``word_offsets`` their
    code-point offsets; ``word_index`` (windows only) their indices among the part's words."""

    ids: list[int]
    questions: list[PlacedQuestion]
    labels: list[int] = field(default_factory=list)
    words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    word_offsets: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int32))
    word_index: np.ndarray | None = None
    budget: Budget | None = None

    def __len__(self) -> int:
        return len(self.ids)


def _question_cost(text: Sequence[int], options: Sequence[Sequence[int]], abstain: bool) -> int:
    return 1 + len(text) + sum(1 + len(o) for o in options) + (1 if abstain else 0)


def _assemble(row: Row, parts: Sequence[EncodedPart], tokens: Tokens, cfg: LayoutConfig) -> EncoderSequence:
    compiled = [(q, tokens.ids(q.text), [tokens.ids(option_text(n, d)) for n, d in q.options])
                for q in row.questions if q.type != "span"]
    span = row.span
    labels = [tokens.ids(option_text(n, d)) for n, d in span.options] if span is not None else []
    budget = fit([_question_cost(t, o, q.abstain) for q, t, o in compiled], [1 + len(lab) for lab in labels],
                 [(p.role, len(p.ids)) for p in parts], cfg.max_length, row.read_roles())
    m = cfg.marker_ids
    ids = [cfg.bos]
    placed: list[PlacedQuestion] = []
    for q, text, options in compiled:
        query = len(ids)
        ids.append(m["[Q]"])
        ids.extend(text)
        positions = []
        for opt in options:
            positions.append(len(ids))
            ids.append(m["[O]"])
            ids.extend(opt)
        if q.abstain:
            positions.append(len(ids))
            ids.append(m["[ABS]"])
        placed.append(PlacedQuestion(q, query, positions, (0, 0)))
    label_positions = []
    for lab in labels:
        label_positions.append(len(ids))
        ids.append(m["[E]"])
        ids.extend(lab)
    ids.append(m["[SEP_SCHEMA]"])
    ranges: dict[str, tuple[int, int]] = {}
    for p in parts:
        start = len(ids)
        ids.append(m[f"[SEG_{p.role}]"])
        ids.extend(int(t) for t in p.ids[: budget.lengths[p.role]])
        ranges[p.role] = (start, len(ids))
    ids.append(cfg.eos)
    for pq in placed:
        roles = pq.question.roles
        pq.pool = (ranges[roles[0]][0], ranges[roles[-1]][1])
    seq = EncoderSequence(ids, placed, budget=budget)
    if span is not None:
        role = span.roles[0]
        part = next(p for p in parts if p.role == role)
        words = part.words if part.words is not None else Words.empty()
        keep = words.first < budget.lengths[role]
        seq.labels = label_positions
        seq.words = (ranges[role][0] + 1 + words.first[keep]).astype(np.int64)
        seq.word_offsets = words.offsets[keep]
    return seq


def window_role(row: Row) -> str | None:
    """The part a row is windowed over: the span's, or the one part every question reads."""
    if row.span is not None:
        return row.span.roles[0]
    first = row.questions[0].roles
    if len(first) == 1 and all(q.roles == first for q in row.questions):
        return first[0]
    return None


def sequences(row: Row, parts: Sequence[EncodedPart], tokens: Tokens, cfg: LayoutConfig,
              windows: bool = True, max_scan_tokens: int | None = None) -> list[EncoderSequence]:
    """The row as one sequence, or as token windows over its one read part when that part was cut.

    Windows have the kept length and overlap ``min(window_overlap, kept // 4)``; each re-assembles
    the whole sequence with every question. SchemaTooLong when the questions alone do not fit;
    ScanBudgetExceeded when the windowed part has more than ``max_scan_tokens`` tokens.
    ``windows=False`` is overflow truncate: the one sequence with its parts cut.
    """
    first = _assemble(row, parts, tokens, cfg)
    assert first.budget is not None
    if not windows or not first.budget.protected_cut:
        return [first]
    role = window_role(row)
    if role is None:
        return [first]
    part = next(p for p in parts if p.role == role)
    total, kept = len(part.ids), first.budget.lengths[role]
    if kept >= total:
        return [first]
    if max_scan_tokens is not None and total > max_scan_tokens:
        raise ScanBudgetExceeded(f"the {role} part has {total} tokens, over the scan budget of {max_scan_tokens}")
    overlap = min(cfg.window_overlap, kept // 4)
    stride = max(1, kept - overlap)
    out = []
    for start in range(0, max(1, total - overlap), stride):
        end = min(total, start + kept)
        words = index = None
        if part.words is not None:
            words, index = window_words(part.words, start, end)
        window = part.window(start, end, words)
        seq = _assemble(row, [window if p.role == role else p for p in parts], tokens, cfg)
        seq.word_index = index
        out.append(seq)
        if end >= total:
            break
    return out


def pad_batch(seqs: Sequence[EncoderSequence], pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids`` and ``attention_mask`` int64 [B, T], right-padded with ``pad_id``."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for r, s in enumerate(seqs):
        ids[r, : len(s)] = s.ids
        mask[r, : len(s)] = 1
    return {"input_ids": ids, "attention_mask": mask}


def batch_indices(seqs: Sequence[EncoderSequence]) -> dict[str, np.ndarray]:
    """The readout index tensors of a batch (§2.6): q_index [Nq,4], opt_index [No,3],
    unit_index [Nw,2], ent_index [Ne,2]; an empty one holds one dummy row whose outputs are dropped."""
    queries: list[tuple[int, int, int, int]] = []
    options: list[tuple[int, int, int]] = []
    units: list[tuple[int, int]] = []
    labels: list[tuple[int, int]] = []
    for r, s in enumerate(seqs):
        for pq in s.questions:
            owner = len(queries)
            queries.append((r, pq.query, pq.pool[0], pq.pool[1]))
            options.extend((r, pos, owner) for pos in pq.options)
        units.extend((r, int(pos)) for pos in s.words)
        labels.extend((r, pos) for pos in s.labels)
    return {
        "q_index": np.asarray(queries or [(0, 0, 0, 1)], np.int64).reshape(-1, 4),
        "opt_index": np.asarray(options or [(0, 0, 0)], np.int64).reshape(-1, 3),
        "unit_index": np.asarray(units or [(0, 0)], np.int64).reshape(-1, 2),
        "ent_index": np.asarray(labels or [(0, 0)], np.int64).reshape(-1, 2),
    }


SequenceOutput = tuple[list[np.ndarray], "np.ndarray | None"]


def split_outputs(seqs: Sequence[EncoderSequence], option_logits: np.ndarray, span_logits: np.ndarray
                  ) -> list[SequenceOutput]:
    """Per sequence: its questions' option logits, and its own word x label block (None: no span)."""
    out: list[SequenceOutput] = []
    o = u = e = 0
    for s in seqs:
        per_q = []
        for pq in s.questions:
            per_q.append(option_logits[o: o + len(pq.options)])
            o += len(pq.options)
        block = span_logits[u: u + len(s.words), e: e + len(s.labels)] if s.labels else None
        u += len(s.words)
        e += len(s.labels)
        out.append((per_q, block))
    return out


@dataclass
class RawSpan:
    """A span question's word logits (float64 [W, L]) with the words' code-point offsets."""

    names: list[str]
    offsets: np.ndarray
    logits: np.ndarray


@dataclass
class RawRow:
    """One row's logits per question id (float32 vectors), its span block, and token counts."""

    logits: dict[str, np.ndarray] = field(default_factory=dict)
    span: RawSpan | None = None
    part_tokens: dict[str, int] = field(default_factory=dict)
    input_tokens: int = 0
    windows: int = 0


def combine(row: Row, parts: Sequence[EncodedPart], seqs: Sequence[EncoderSequence],
            outputs: Sequence[SequenceOutput]) -> RawRow:
    """Windows back to one row: choice/noul/score logits are the mean over windows, set logits the
    max; a word's span logits are the mean over the windows holding its first token (-30: none)."""
    first = seqs[0]
    raw = RawRow(part_tokens={p.role: len(p.ids) for p in parts},
                 input_tokens=sum(len(s) for s in seqs), windows=len(seqs) if len(seqs) > 1 else 0)
    for i, pq in enumerate(first.questions):
        stacked = np.stack([out[0][i] for out in outputs])
        raw.logits[pq.question.id] = stacked.max(0) if pq.question.type == "set" else stacked.mean(0)
    span = row.span
    if span is None:
        return raw
    if len(seqs) == 1:
        block = outputs[0][1]
        assert block is not None
        raw.span = RawSpan(span.names, np.asarray(first.word_offsets), block.astype(np.float64))
        return raw
    part = next(p for p in parts if p.role == span.roles[0])
    words = part.words if part.words is not None else Words.empty()
    total = len(words)
    acc = np.zeros((total, len(span.names)), np.float64)
    counts = np.zeros(total, np.float64)
    for s, (_, block) in zip(seqs, outputs):
        assert s.word_index is not None and block is not None
        covered = s.word_index[: len(block)]
        acc[covered] += block
        counts[covered] += 1
    seen = counts > 0
    logits = np.where(seen[:, None], acc / np.maximum(counts, 1)[:, None], UNCOVERED_LOGIT)
    raw.span = RawSpan(span.names, np.asarray(words.offsets), logits)
    return raw
