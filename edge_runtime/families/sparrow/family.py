"""Sparrow family: the sparrow-decider static tier (bag-of-words pooling + MLP) served on /v1/decisions.

Each Choice, Noul or Score question is one row: the state, the question's instructions and each
option (``"{name} {description}"``) are tokenized separately with the package's WordPiece, and the
graph pools, scores and applies the per-kind temperature. A state longer than the budget
(``max_input_tokens``, or ``options.max_tokens``) fails each of its questions in place with
``max_length_exceeded``, as in every decision family, unless the question asks ``overflow:
truncate``: it then reads the state's first tokens (``usage.tokens_lower_bound``). Instructions and
options are cut at the model's 512-token segments, as the model was trained. Rows are never padded
to one shape (ORT's reductions depend on the reduced length), so numerics are exact.

Questions repeat across requests (a Router asks the same ones), so packages that carry model.onnx
split in two (decision_config ``split_graphs``) run it in halves: the question half once per
distinct question (its tensors cached), and the answer half once per state for up to n of its
questions (the state pooled once, every option's feature rows and the MLP run once over all of
them). Each question's outputs are model.onnx's bit for bit (checked at conversion and by the
load-time probe); packages without the split, or with an earlier layout of it, run model.onnx per
question. A Noul is a two-option choice, false then true, whose descriptions default to the
package's ``noul_defaults`` (an absent or null description takes the default). An object or array
state is read as its indented JSON, whatever its roles: the model has no parts.
Set, Span, Box and track questions, and images or videos, are refused: the card lists only
choice, noul and score, and text.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.families.base import Graph, open_graphs
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    plan_entries,
)
from edge_runtime.packages import Package
from edge_runtime.questions import InvalidQuestion, Question, answer, failed_answer, refusal
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState
from edge_runtime.text.bounds import BudgetReader, encode_plain
from edge_runtime.text.tokenizer import analyze
from edge_runtime.text.types import MAX_LENGTH_EXCEEDED

log = logging.getLogger(__name__)

KINDS: dict[str, int] = {"noul": 0, "choice": 1, "score": 2}
INPUTS: tuple[str, ...] = ("state_ids", "question_ids", "option_ids", "option_mask", "kind")
QUESTION_INPUTS: tuple[str, ...] = INPUTS[1:]  # the question half's inputs
#: The question half's outputs: one row per option of each ROW_TENSORS ([1,K,D]), which the answer
#: half takes concatenated over its questions, and the kind's temperature [1].
ROW_TENSORS: tuple[str, ...] = ("q_rows", "o_unit", "om_rows", "f_qo", "f_o_om")
QUESTION_TENSORS: tuple[str, ...] = (*ROW_TENSORS, "kind_temperature")
#: decision_config split_graphs' layout this family runs; other split graphs are left unused.
SPLIT_LAYOUT = "rows"
#: Bytes of question tensors kept for questions that repeat (~6 KB for a 4-option question).
QUESTION_CACHE_BYTES = 16 * 1024 * 1024
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
    """One question's graph feeds (batch axis 1) and the tokens it reads.

    The questions of one state share its ``state_ids`` array: that is how the forward finds the
    rows it may answer in one run. ``question`` keys the question's texts and type when they may
    repeat across requests (its half of the graph is then cached), else None.
    """

    feeds: dict[str, np.ndarray]
    tokens: int
    question: Hashable | None = None


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
        # A question's feeds other than the state (ids, option arrays, kind) depend only on its texts
        # and type: built once per distinct question, read-only, shared by every row that asks it.
        self._question_feeds = lru_cache(maxsize=4096)(self._build_question_feeds)
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
            return self.reader.ids(text, budget)
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

    def row(self, state_ids: Sequence[int], question: Question, state: np.ndarray | None = None) -> SparrowRow:
        """The feeds of one question about a state already tokenized.

        ``state`` is the state's feed (state_feed(state_ids)); the questions of one state pass the
        same array so that they can run together.
        """
        if state is None:
            state = state_feed(state_ids)
        instructions = content(question.instructions)
        options = tuple(self.options(question))
        if len(instructions) > 256 or any(len(o) > 256 for o in options):
            # long texts are read within the budget each time, as segment_ids does
            q_ids = self.segment_ids(instructions)
            opt_ids = [self.segment_ids(text) for text in options]
            alone = self.feeds(state_ids, q_ids, opt_ids, KINDS[question.type])
            return SparrowRow({**alone.feeds, "state_ids": state}, alone.tokens)
        key = (instructions, options, KINDS[question.type])
        shared, tokens = self._question_feeds(*key)
        return SparrowRow({"state_ids": state, **shared}, tokens + len(state_ids), key)

    def _build_question_feeds(self, instructions: str, options: tuple[str, ...],
                              kind: int) -> tuple[dict[str, np.ndarray], int]:
        """The question's feeds without the state, made read-only, and the tokens they read."""
        row = self.feeds((), self.segment_ids(instructions), [self.segment_ids(t) for t in options], kind)
        shared = {name: value for name, value in row.feeds.items() if name != "state_ids"}
        for value in shared.values():
            value.flags.writeable = False  # shared between requests: nothing may write into them
        return shared, row.tokens

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
            "state_ids": state_feed(state_ids),
            "question_ids": np.asarray([list(question_ids) or [EMPTY_ID]], dtype=np.int64),
            "option_ids": ids,
            "option_mask": mask,
            "kind": np.asarray([kind], dtype=np.int64),
        }
        return SparrowRow(feeds, tokens)


def state_feed(state_ids: Sequence[int]) -> np.ndarray:
    """The ``state_ids`` feed [1,S]; an empty state is one EMPTY_ID, as in training."""
    return np.asarray([list(state_ids) or [EMPTY_ID]], dtype=np.int64)


@dataclass(frozen=True)
class SplitGraphs:
    """model.onnx in two halves: the question half, and the answer half for 1 .. n questions."""

    question: Any
    answers: dict[int, Any]


@dataclass(frozen=True)
class QuestionTensors:
    """The question half's outputs for one question: ROW_TENSORS stacked [5,K,D], temperature [1]."""

    rows: np.ndarray
    temperature: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.temperature.nbytes)


class SparrowForward:
    """The engine's Forward; results are ``{output: [K]}`` per row. Rows are never padded
    (``pads = False``): questions of any lengths share an answer run at no extra cost.

    With split graphs, rows about one state (they share its state_ids array) run through the
    answer half in chunks of up to its largest question count, each question's tensors coming
    from the question half (cached by the row's question key). Without them every row runs alone
    through model.onnx. Forwards never run concurrently (the executor runs one at a time), so the
    cache needs no lock.
    """

    pads = False

    def __init__(self, session: Any, split: SplitGraphs | None = None,
                 cache_bytes: int = QUESTION_CACHE_BYTES) -> None:
        self.session = session
        self.split = split
        if split is not None and sorted(split.answers) != list(range(1, len(split.answers) + 1)):
            raise ValueError(f"answer graphs for 1 .. n questions expected, not for {sorted(split.answers)}")
        self.max_questions = len(split.answers) if split is not None else 1
        self._cache: OrderedDict[Hashable, QuestionTensors] = OrderedDict()
        self._cache_bytes = cache_bytes
        self._cached = 0

    def __call__(self, rows: Sequence[SparrowRow]) -> list[dict[str, np.ndarray]]:
        if self.split is None:
            return [self._alone(row) for row in rows]
        by_state: dict[int, list[int]] = {}
        for i, row in enumerate(rows):
            by_state.setdefault(id(row.feeds["state_ids"]), []).append(i)
        out: list[dict[str, np.ndarray]] = [{} for _ in rows]
        for members in by_state.values():
            for start in range(0, len(members), self.max_questions):
                chunk = members[start:start + self.max_questions]
                for i, result in zip(chunk, self._answer([rows[i] for i in chunk])):
                    out[i] = result
        return out

    def _alone(self, row: SparrowRow) -> dict[str, np.ndarray]:
        result = self.session.run(row.feeds)
        return {name: np.asarray(result[name])[0] for name in OUTPUTS}

    def _answer(self, rows: list[SparrowRow]) -> list[dict[str, np.ndarray]]:
        assert self.split is not None
        tensors = [self._question(row) for row in rows]
        feeds = {"state_ids": rows[0].feeds["state_ids"]}
        if len(rows) == 1:
            stacked, feeds["kind_temperature"] = tensors[0].rows, tensors[0].temperature
        else:  # every question's option rows in one tensor each, and where each question's rows end
            stacked = np.concatenate([t.rows for t in tensors], axis=1)
            feeds["kind_temperature"] = np.concatenate([t.temperature for t in tensors])
            feeds["rows"] = np.array([t.rows.shape[1] for t in tensors], dtype=np.int64)
        feeds.update((name, stacked[i:i + 1]) for i, name in enumerate(ROW_TENSORS))  # contiguous views
        result = self.split.answers[len(rows)].run(feeds)
        return [{name: np.asarray(result[f"{name}_{i}"])[0] for name in OUTPUTS} for i in range(len(rows))]

    def _question(self, row: SparrowRow) -> QuestionTensors:
        """The question half's tensors for a row: from the cache when its question was seen."""
        assert self.split is not None
        key = row.question
        if key is not None and key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        out = self.split.question.run({name: row.feeds[name] for name in QUESTION_INPUTS})
        # One [5,K,D] array: a chunk of questions joins its rows in one concatenate, not five.
        tensors = QuestionTensors(np.concatenate([out[name] for name in ROW_TENSORS]), out["kind_temperature"])
        if key is not None:
            tensors.rows.flags.writeable = tensors.temperature.flags.writeable = False  # shared from now on
            self._cache[key] = tensors
            self._cached += tensors.nbytes
            while self._cached > self._cache_bytes and len(self._cache) > 1:
                _, dropped = self._cache.popitem(last=False)
                self._cached -= dropped.nbytes
        return tensors

    def length(self, row: SparrowRow) -> int:
        return row.tokens


def _split(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A decision_config's split graphs (``split_graphs``) when of the current layout."""
    split = config.get("split_graphs")
    return split if split is not None and split.get("layout") == SPLIT_LAYOUT else None


def graphs(package: Package) -> list[Graph]:
    """The split graphs beside model.onnx: the question half and the answer half per question count
    (proved equal to model.onnx by the converter; the load-time probe runs them)."""
    split = _split(package.decision_config() or {})
    if split is None:
        return []
    return [Graph("question", split["question"]),
            *(Graph(f"answers:{n}", rel) for n, rel in split["answers"].items())]


class SparrowFamily(DecisionFamily[SparrowForward]):
    """A loaded sparrow package: plans decisions requests into rows and answers from their outputs."""

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 opened: Mapping[str, Any] | None = None) -> None:
        card = package.card
        config = package.require_decision_config()
        self.name = name or card.name
        self.max_input_tokens = int(card.limits["max_input_tokens"])
        self.question_types = answered_types(card, tuple(KINDS))
        self.text = SparrowText.from_files(package.file("tokenizer.json"), config)
        self.modalities = frozenset(card.modalities)
        split = _split(config)
        if split is None and config.get("split_graphs") is not None:
            log.warning("%s: its split graphs are of an earlier layout; model.onnx answers every question "
                        "alone (the same answers, slower): rebuild the package to use them", self.name)
        # Rows share forwards only through the split graphs; without them every row runs alone.
        self.batchable = split is not None
        if session is not None:
            if opened is None:  # built outside the loader (converters, benches): open them the same way
                opened, _ = open_graphs(package, graphs(package), session)
            self._forward = SparrowForward(session, None if split is None else SplitGraphs(
                opened["question"], {int(n): opened[f"answers:{n}"] for n in split["answers"]}))
        self._vocab_size = self.text.tokenizer.get_vocab_size()
        # The probe's rows share one state, so that batched probes run the n-question graphs.
        self._probe_rng = np.random.default_rng(0)
        self._probe_state = state_feed(self._probe_rng.integers(5, self._vocab_size, size=24).tolist())

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> SparrowRow:
        """A new random question of ``length`` tokens about the probe's state (24 tokens); no
        question key, so the probe runs the question half every time."""
        rng = self._probe_rng
        question = rng.integers(5, self._vocab_size, size=max(1, length)).tolist()
        options = [rng.integers(5, self._vocab_size, size=int(n)).tolist() for n in rng.integers(1, 9, size=3)]
        row = self.text.feeds((), question, options, int(rng.integers(0, len(KINDS))))
        return SparrowRow({**row.feeds, "state_ids": self._probe_state}, row.tokens + self._probe_state.shape[1])

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Tokenize every answerable question into a row; decide the others' errors now.

        Raises ApiError: a standard request with images or videos (text only), a batch all of whose
        entries are refused, or a request none of whose questions this model can answer.
        """
        budget = self.budget(request)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, budget, rows))

    def _plan_entry(self, name: str | None, entry: DecisionState, budget: int, rows: list[SparrowRow]) -> Entry:
        planned = Entry(name, [])
        state_ids: list[int] | None = None  # tokenized once per entry, only if a question needs it
        feeds: dict[bool, np.ndarray] = {}  # the state's feed, whole and cut, shared by its questions' rows
        for q in entry.questions:
            if isinstance(q, InvalidQuestion):
                planned.slots.append(Slot(q))
                continue
            refused = refusal(q, self.name, self.question_types, truncates=True)
            if refused is not None:
                planned.slots.append(Slot(refused))
                continue
            if state_ids is None:
                # One token past the budget tells a state that fits from one that does not.
                state_ids, _ = self.text.read(content(entry.state), budget + 1)
            cut = len(state_ids) > budget
            if cut and q.overflow != "truncate":
                planned.slots.append(Slot(q, answer=failed_answer(
                    q.type, MAX_LENGTH_EXCEEDED, "question_tokens",
                    f"the state takes more than the {budget} tokens this model reads; "
                    "overflow truncate reads its first ones")))
                continue
            # overflow truncate: the state's first budget tokens, as the model was trained to read
            ids = state_ids[:budget]
            if cut not in feeds:
                feeds[cut] = state_feed(ids)
            planned.tokens_lower_bound = planned.tokens_lower_bound or cut
            row = self.text.row(ids, q, feeds[cut])
            planned.slots.append(Slot(q, row=len(rows)))
            planned.tokens += row.tokens
            rows.append(row)
        return planned

    # -- answers ------------------------------------------------------------------------------

    def read(self, q: Question, slot: Slot, entry: Entry, output: dict[str, Any]) -> dict[str, Any]:
        """A question's answer from its row's ``{"probs": [K], ...}``."""
        return answer(q, output["probs"])


__all__ = ["SparrowFamily", "SparrowForward", "SparrowRow", "SparrowText", "SplitGraphs", "content", "state_feed"]
