"""decision2 family: Decision 2.0 packages (a Qwen3 backbone and the candidate head) on /v1/decisions.

Every Choice, Noul or Score question becomes one row, rendered by the Decision 2.0 prompt
(edge_runtime.families.decision2.prompt: the state, the question, one segment per option, the suffix).
Rows run right-padded through the backbone by :class:`Decision2Forward`, which returns each row's
hidden states, because the candidate head reads several positions of a row (every option's last
token and the row's last token), not only the last. Answers follow §1.8 through
:class:`~edge_runtime.families.decision2.pipeline.Decision2Assets`, the code path the converter's
parity check and ``run_questions`` share. Other types are refused in place with their type's fixed
reason (set, span: ``question_type_unsupported``); a question longer than the limit (the card's
``max_input_tokens``, or ``options.max_tokens``) fails in place with ``max_length_exceeded``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_runtime.engine.causal import ATTENTION_MASK, HIDDEN, INPUT_IDS, POSITION_IDS, CausalRow, causal_row
from edge_runtime.families.decision2.pipeline import QUESTION_TYPES, Decision2Assets, pad_rows, too_long
from edge_runtime.families.decision2.prompt import PromptTooLong
from edge_runtime.families.decision_plan import (
    DecisionFamily,
    DecisionPlan,
    Entry,
    Slot,
    answered_types,
    input_limit,
    plan_entries,
)
from edge_runtime.packages import Package
from edge_runtime.questions import QUESTION_MALFORMED, Question, failed_answer, refusal
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState

if TYPE_CHECKING:  # keeps this module importable without onnxruntime
    from edge_runtime.engine.session import GraphSession



def option_pairs(q: Question) -> list[tuple[str, Any]]:
    """A parsed question's options as the prompt and the head take them: (key, description)."""
    return [(o.key, o.description) for o in q.options]


class Decision2Forward:
    """Runs CausalRows right-padded through a backbone graph; each row's hidden states ``[len, H]``.

    Feeds come from :func:`pad_rows` (position_ids only when the graph takes them), so a row's
    states are bit-identical alone or batched. Arrays are float32 copies, cut to the row's length.
    """

    def __init__(self, session: GraphSession, pad_id: int) -> None:
        names = list(session.input_names)
        missing = [n for n in (INPUT_IDS, ATTENTION_MASK) if n not in session.inputs]
        unknown = [n for n in names if n not in (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)]
        if missing or unknown or HIDDEN not in session.outputs:
            raise ValueError(f"{session.path.name} is not a backbone graph this forward can feed: inputs {names}, "
                             f"outputs {session.output_names}; needs {INPUT_IDS}, {ATTENTION_MASK} and output "
                             f"{HIDDEN}, may have {POSITION_IDS}")
        self.session = session
        self.pad_id = int(pad_id)
        self._inputs = names

    def length(self, row: CausalRow) -> int:
        """Tokens in the row."""
        return len(row.ids)

    def __call__(self, rows: Sequence[CausalRow]) -> list[np.ndarray]:
        """One ``float32 [len, H]`` array per row, in order."""
        if not rows:
            return []
        feeds = pad_rows(rows, self.pad_id, self.session.row_multiple)
        hidden = self.session.run({n: feeds[n] for n in self._inputs}, [HIDDEN])[HIDDEN]
        return [np.array(hidden[b, : len(row.ids)], dtype=np.float32, copy=True) for b, row in enumerate(rows)]


class Decision2Family(DecisionFamily[Decision2Forward]):
    """A loaded decision2 package: plans decisions requests into one row per question, answers by §1.8."""

    batchable = True  # right-padded rows never see each other; the load-time probe proves it

    def __init__(self, package: Package, session: Any = None, name: str | None = None,
                 max_input_tokens: int | None = None) -> None:
        card = package.card
        self.name = name or card.name
        self.assets = Decision2Assets.from_package(package)
        self.max_input_tokens = input_limit(card, max_input_tokens)
        self.question_types = answered_types(card, QUESTION_TYPES)
        self.modalities = frozenset(card.modalities)
        if session is not None:
            self._forward = Decision2Forward(session, self.assets.pad)
            hidden = session.outputs[HIDDEN].shape[-1]
            width = self.assets.head.t["key.weight"].shape[1]
            if isinstance(hidden, int) and hidden != width:
                raise ValueError(f"the graph's hidden size {hidden} differs from the candidate head's {width}")
        self._vocab = self.assets.tokenizer.get_vocab_size()
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -----------------------------------------------------------------------

    def probe_row(self, length: int) -> CausalRow:
        """A fresh random row of ``length`` tokens on every call (the probe needs distinct rows)."""
        return causal_row(self._probe_rng.integers(0, self._vocab, size=max(1, length)))

    def warm(self) -> None:
        """Probe the tokenizer's budget cuts now (about a second), not on the first long state."""
        if self.assets.reader is not None:
            self.assets.reader.report()

    # -- planning ---------------------------------------------------------------------------

    def plan_request(self, request: DecisionsRequest) -> DecisionPlan:
        """Render and tokenize every answerable question into a row that knows its prompt; decide the
        others' answers now.

        Raises ApiError for images or videos (in a standard request, or in every batch entry),
        invalid_request for options.max_tokens above the model's limit, and NoValidQuestion when no
        question is one this model answers.
        """
        cap = self.budget(request)
        return plan_entries(request, self.name, self.modalities,
                            lambda name, entry, rows: self._plan_entry(name, entry, cap, rows))

    def _plan_entry(self, name: str | None, entry: DecisionState, cap: int,
                    rows: list[CausalRow]) -> Entry:
        planned = Entry(name, [])
        for given in entry.questions:
            refused = refusal(given, self.name, self.question_types) if isinstance(given, Question) else None
            slot = Slot(refused or given)
            planned.slots.append(slot)
            q = slot.question
            if not isinstance(q, Question):  # invalid, or of a type this model does not answer
                continue
            try:
                prompt = self.assets.render(entry.state, q.type, q.instructions, option_pairs(q), cap)
            except PromptTooLong as e:
                slot.answer = too_long(q.type, e)
                continue
            except ValueError as e:  # an option that encodes to no tokens: the head has no position to read
                slot.answer = failed_answer(q.type, "invalid_question", QUESTION_MALFORMED, str(e))
                continue
            slot.row, slot.reading = len(rows), prompt
            rows.append(causal_row(prompt.ids))
            planned.tokens += len(prompt.ids)
        return planned

    # -- answers ------------------------------------------------------------------------------

    def read(self, q: Question, slot: Slot, entry: Entry, hidden: np.ndarray) -> dict[str, Any]:
        """A question's answer from its row's hidden states ``[len, H]``, read at its prompt's head positions."""
        return self.assets.read(q.type, option_pairs(q), slot.reading, hidden)


__all__ = ["Decision2Family", "Decision2Forward"]
