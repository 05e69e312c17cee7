"""Sparrow family: the sparrow-decider static tier (bag-of-words pooling + MLP) served on /v1/decisions.

Each Choice, Noul or Score question is one row and one forward: the state, the question's
instructions and each option (``"{name} {description}"``) are tokenized separately with the
package's WordPiece, every segment cut at the model's 512 tokens as the model was trained, and the
graph pools, scores and applies the per-kind temperature. Rows are never batched (their shapes
differ), so numerics are exact. A Noul is a two-option choice, false then true, whose descriptions
default to the package's ``noul_defaults`` (an absent or null description takes the default). An
object or array state is read as its indented JSON, whatever its roles: the model has no parts.
Set, Span, Box and track questions, and images or videos, are refused: the card lists only
choice, noul and score, and text.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.errors import ApiError, ItemError, invalid_request
from edge_runtime.families.base import Plan
from edge_runtime.families.decision_plan import (
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    assemble,
    media_refusal,
    refused_entry,
)
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, answer, refusal
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState, NoValidQuestion
from edge_runtime.text.bounds import BudgetReader, encode_plain
from edge_runtime.text.tokenizer import analyze

SURFACE = "decisions"
KINDS: dict[str, int] = {"noul": 0, "choice": 1, "score": 2}
INPUTS: tuple[str, ...] = ("state_ids", "question_ids", "option_ids", "option_mask", "kind")
OUTPUTS: tuple[str, ...] = ("logits", "probs")
EMPTY_ID = 0  # an empty segment is read as this one id, as the model was trained

_FIRST_CUT_CHARS_PER_TOKEN = 8
_SIGMA_CONTEXT = 4096  # characters read past a prefix so that its sigmas see their context
_CAPITAL_SIGMA = "\u03a3"


def _final_sigmas(text: str) -> str:
    """Write each capital sigma that Python's str.lower() would make final (ς) as ς.

    The package's own tokenizer lowercases with str.lower(), which applies Unicode's Final_Sigma
    context rule; the tokenizers library lowercases characters alone (always σ). The context is
    read on the text as the normaliser cleans it (control and unassigned characters removed).
    """
    kept = [ch for ch in text if ch in "\t\n\r"
            or not (ord(ch) in (0, 0xFFFD) or unicodedata.category(ch).startswith("C"))]
    lowered = "".join(kept).lower()
    out, shift = [], 0
    for i, ch in enumerate(kept):
        out.append("\u03c2" if ch == _CAPITAL_SIGMA and lowered[i + shift] == "\u03c2" else ch)
        if ch == "\u0130":  # the one character whose lowercase is two characters long
            shift += 1
    return "".join(out)


def content(value: Any) -> str:
    """A segment's text as the model reads it: strings stripped, structures as indented JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, indent=2, ensure_ascii=False)


@dataclass(frozen=True)
class SparrowRow:
    """One question's graph feeds (batch axis 1) and the tokens it reads."""

    feeds: dict[str, np.ndarray]
    tokens: int


class SparrowText:
    """Tokenizes and renders questions into graph feeds, exactly as the sparrow package reads them."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = int(config["max_segment_tokens"])
        self.noul_defaults: dict[str, str] = dict(config["noul_defaults"])
        self.kinds: dict[str, int] = dict(config["kinds"])
        if self.kinds != KINDS:
            raise ValueError(f"decision_config kinds {self.kinds} differ from the graph's {KINDS}")
        # Question texts and options repeat across requests (the Router asks the same questions).
        self._short = lru_cache(maxsize=8192)(self._encode_short)
        self.reader = BudgetReader(tokenizer, analyze(tokenizer))

    @classmethod
    def from_files(cls, tokenizer_path: Path, config: dict[str, Any]) -> SparrowText:
        return cls(Tokenizer.from_file(str(tokenizer_path)), config)

    def _encode(self, text: str) -> list[int]:
        if _CAPITAL_SIGMA in text:
            text = _final_sigmas(text)
        return encode_plain(self.tokenizer, text).ids

    def _encode_short(self, text: str) -> tuple[int, ...]:
        return tuple(self._encode(text)[: self.max_tokens])

    def segment_ids(self, text: str) -> list[int]:
        """The ids of an instructions or option text, at most the model's segment length."""
        if len(text) <= 256:
            return list(self._short(text))
        return self.ids(text, self.max_tokens)

    def ids(self, text: str, budget: int) -> list[int]:
        """The first ``budget`` WordPiece ids of ``text`` (no specials)."""
        return self.read(text, budget)[0]

    def read(self, text: str, budget: int) -> tuple[list[int], bool]:
        """The first ``budget`` WordPiece ids of ``text``, and whether the text has more tokens
        than those (or may have: it was read only in part).

        A long text is tokenized only as far as the budget needs (edge_runtime.text.bounds cuts it
        where the tokenizer's probe proved a prefix keeps the whole text's first tokens), so its
        cost follows the budget for every shape: words, punctuation or whitespace runs, one long
        word, CJK. Capital sigmas are resolved on a growing prefix with context to spare.
        """
        if _CAPITAL_SIGMA not in text:
            read = self.reader.read(text, budget)
            return read.ids[:budget].tolist(), not read.complete or len(read) > budget
        reach = budget * _FIRST_CUT_CHARS_PER_TOKEN + _SIGMA_CONTEXT
        while reach < len(text):
            # the prefix's last _SIGMA_CONTEXT characters only give context to the sigmas before them
            read = self.reader.read(_final_sigmas(text[:reach]), budget)
            if len(read) >= budget:
                return read.ids[:budget].tolist(), True
            reach *= 4
        ids = self._encode(text)
        return ids[:budget], len(ids) > budget

    def options(self, question: Question) -> list[str]:
        """Each option as the model reads it: ``"{name} {description}"``."""
        if question.type == "noul":
            return [f"{o.key} {content(o.description if o.description is not None else self.noul_defaults[o.key])}"
                    for o in question.options]
        return [f"{o.key} {content(o.description)}" for o in question.options]

    def row(self, state_ids: Sequence[int], question: Question) -> SparrowRow:
        """The feeds of one question about a state already tokenized."""
        q_ids = self.segment_ids(content(question.instructions))
        opt_ids = [self.segment_ids(text) for text in self.options(question)]
        return self.feeds(state_ids, q_ids, opt_ids, KINDS[question.type])

    @staticmethod
    def feeds(state_ids: Sequence[int], question_ids: Sequence[int], option_ids: Sequence[Sequence[int]],
              kind: int) -> SparrowRow:
        """Graph feeds from token ids; an empty segment is one EMPTY_ID (weight 1), as in training."""
        tokens = len(state_ids) + len(question_ids) + sum(len(o) for o in option_ids)
        width = max(1, max(len(o) for o in option_ids))
        ids = np.zeros((1, len(option_ids), width), dtype=np.int64)
        mask = np.zeros((1, len(option_ids), width), dtype=np.float32)
        for k, o in enumerate(option_ids):
            n = max(1, len(o))
            ids[0, k, : len(o)] = o
            mask[0, k, :n] = 1.0
        feeds: dict[str, np.ndarray] = {
            "state_ids": np.asarray([list(state_ids) or [EMPTY_ID]], dtype=np.int64),
            "question_ids": np.asarray([list(question_ids) or [EMPTY_ID]], dtype=np.int64),
            "option_ids": ids,
            "option_mask": mask,
            "kind": np.asarray([kind], dtype=np.int64),
        }
        return SparrowRow(feeds, tokens)


class SparrowForward:
    """The engine's Forward: every row alone, one graph run each; results are ``{output: [K]}``."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def __call__(self, rows: Sequence[SparrowRow]) -> list[dict[str, np.ndarray]]:
        out = []
        for row in rows:
            result = self.session.run(row.feeds)
            out.append({name: np.asarray(result[name])[0] for name in OUTPUTS})
        return out

    def length(self, row: SparrowRow) -> int:
        return row.tokens


class SparrowFamily:
    """A loaded sparrow package: plans decisions requests into rows and answers from their outputs."""

    batchable = False  # every question has its own shapes; rows always run alone
    surfaces = frozenset({SURFACE})

    def __init__(self, package: Package, session: Any = None, name: str | None = None) -> None:
        card = package.card
        config = package.decision_config()
        if config is None:
            raise ValueError(f"package {card.name} has no decision_config.json")
        self.name = name or card.name
        self.max_input_tokens = int(card.limits["max_input_tokens"])
        self.question_types = answered_types(card, tuple(KINDS))
        self.text = SparrowText.from_files(package.file("tokenizer.json"), config)
        self.modalities = frozenset(card.modalities)
        self._forward = SparrowForward(session) if session is not None else None
        self._vocab_size = self.text.tokenizer.get_vocab_size()

    # -- engine hooks -----------------------------------------------------------------------

    @property
    def forward(self) -> SparrowForward:
        """The graph's forward; a family built without a session (converters, benches) only plans."""
        if self._forward is None:
            raise RuntimeError(f"{self.name} was built without a session: it plans requests, it runs none")
        return self._forward

    def probe_row(self, length: int) -> SparrowRow:
        """A question about ``length`` random state tokens (seeded by the length)."""
        rng = np.random.default_rng(length)
        state = rng.integers(5, self._vocab_size, size=length).tolist()
        return self.text.feeds(state, rng.integers(5, self._vocab_size, size=4).tolist(),
                               [[7, 8], [9]], KINDS["choice"])

    def warm(self) -> None:
        """Nothing to prepare: the tokenizer holds no per-class caches to fill."""

    def describe(self) -> dict[str, Any]:
        return {}

    # -- planning ---------------------------------------------------------------------------

    def plan(self, surface: str, request: DecisionsRequest) -> Plan:
        """The runtime's entry point: the rows and a finish step (see plan_request and finish)."""
        if surface != SURFACE:
            raise ValueError(surface)
        return self.plan_request(request).engine_plan(self.finish)

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Tokenize every answerable question into a row; decide the others' errors now.

        Raises ApiError: a standard request with images or videos (text only), a batch all of whose
        entries are refused, or a request none of whose questions this model can answer.
        """
        budget = self._budget(request)
        plan = DecisionPlan(request, rows=[])
        refusals: list[ApiError] = []
        for name, entry in request.entries():
            refusal = media_refusal(self.name, self.modalities, entry, request)
            if refusal is not None:
                if not request.is_batch:
                    raise refusal
                refusals.append(refusal)
                plan.entries.append(refused_entry(name, entry, refusal))
                continue
            plan.entries.append(self._plan_entry(name, entry, budget, plan.rows))
        if refusals and len(refusals) == len(plan.entries):
            raise refusals[0]
        if not plan.rows:
            failed = [(e.name, s.question) for e in plan.entries for s in e.slots
                      if isinstance(s.question, InvalidQuestion)]
            raise NoValidQuestion(failed)
        return plan

    def _budget(self, request: DecisionsRequest) -> int:
        max_tokens = request.options.max_tokens
        if max_tokens is None:
            return self.max_input_tokens
        if max_tokens > self.max_input_tokens:
            raise invalid_request(f"options.max_tokens {max_tokens} exceeds the model's max_input_tokens "
                                  f"{self.max_input_tokens}")
        return max_tokens

    def _plan_entry(self, name: str | None, entry: DecisionState, budget: int, rows: list[SparrowRow]) -> Entry:
        planned = Entry(name, [])
        state_ids: list[int] | None = None  # tokenized once per entry, only if a question needs it
        for q in entry.questions:
            if isinstance(q, InvalidQuestion):
                planned.slots.append(Slot(q))
                continue
            refused = refusal(q, self.name, self.question_types)
            if refused is not None:
                planned.slots.append(Slot(refused))
                continue
            if state_ids is None:
                state_ids, planned.tokens_lower_bound = self.text.read(content(entry.state), budget)
            row = self.text.row(state_ids, q)
            planned.slots.append(Slot(q, row=len(rows)))
            planned.tokens += row.tokens
            rows.append(row)
        return planned

    # -- answers ------------------------------------------------------------------------------

    def finish(self, plan: DecisionPlan, outputs: list[Any] | ItemError) -> dict[str, Any]:
        """The response body: ``{model, answers, usage}``, or ``{model, states, usage}`` for a batch.

        ``outputs`` holds one ``{"probs": [K], ...}`` per row in row order, or one ItemError for the
        whole job (a deadline), which every planned question then carries.
        """
        return assemble(plan, outputs, self.name, lambda q, slot, entry, output: answer(q, output["probs"]))


__all__ = ["SparrowFamily", "SparrowForward", "SparrowRow", "SparrowText", "content"]
