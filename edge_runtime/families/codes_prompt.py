"""The codes-v1 prompt and its decision_config.json (``decision-codes-config/1``): the options of a
question listed under single-token codes, read by the decision-codes and decision-vision families.

Each question row is four token segments, concatenated:

1. ``chat.before``: the source model's chat markup up to the user turn (system text included),
   rendered by the converter from the model's own chat template; special tokens match in it;
2. the state part: ``"State:\\n" + describe(state) + "\\n\\n"`` (``(empty)`` for an empty state);
   with ``prompt_layout: header-v1`` it is preceded by ``"Questions:\\n"`` and the request's
   questions numbered in request order, Choice and Score questions with their options and Set
   questions with their labels (``"   - " + label``), so every question sees what else is asked;
3. the question part: ``"Question:\\n" + instructions + "\\n\\nOptions:\\n" + "<code>: <text>"``
   lines ``+ "\\n\\nReply with only the code of the best option."`` (``Question <n>:`` under header-v1);
4. ``chat.after``: the markup that closes the user turn and opens the assistant's reply.

Segments 2 and 3 hold request text and are tokenized with special tokens read as plain text, so a
state cannot forge chat markup. Option texts: Choice ``key`` or ``key: description``; Noul the
false then the true description (``No / false``, ``Yes / true`` by default), a two-option choice;
Score each level. ``describe`` is the string itself, or ``json.dumps(value, ensure_ascii=False)``.

The texts are code_options.py's (d3's words); the readout's rows live in head.npz under :data:`READOUT`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from edge_runtime.families.code_options import (
    DEFAULT_INSTRUCTIONS,
    EMPTY_STATE,
    REPLY,
    check_codes,
    describe,
    keyed_text,
    option_texts,
)
from edge_runtime.questions import Question
from edge_runtime.text.bounds import encode_plain

CONFIG_FORMAT = "decision-codes-config/1"
PROMPT = "codes-v1"
ATTENTION_MODES = ("causal", "prefix_causal")
PROMPT_LAYOUTS = (None, "header-v1")
READOUT = "readout"        # head.npz: float32 [codes, hidden]
READOUT_BIAS = "bias"      # head.npz, optional: float32 [codes]

DEFAULT_SET_INSTRUCTIONS = "Which labels apply?"
#: Question parts up to this many characters are cached by text (the Router repeats its questions).
_CACHE_CHARS = 4096


def check_config(config: dict[str, Any]) -> None:
    """Raise ValueError when decision_config.json is not one this family reads."""
    if config.get("format") != CONFIG_FORMAT or config.get("prompt") != PROMPT:
        raise ValueError(f"decision_config.json must have format {CONFIG_FORMAT!r} and prompt {PROMPT!r}")
    check_codes(config)
    if config.get("attention_mode") not in ATTENTION_MODES:
        raise ValueError(f"attention_mode must be one of {list(ATTENTION_MODES)}")
    if config.get("prompt_layout") not in PROMPT_LAYOUTS:
        raise ValueError(f"prompt_layout must be null or 'header-v1', not {config.get('prompt_layout')!r}")
    chat = config.get("chat")
    if not isinstance(chat, dict) or not all(isinstance(chat.get(k), str) for k in ("before", "after")):
        raise ValueError("decision_config chat needs the strings before and after")
    temperature = config.get("temperature", 1.0)
    if not _positive(temperature):
        raise ValueError("temperature must be a finite number > 0")
    table = config.get("temperature_by_questions")
    if table is not None:
        n = table.get("max_questions") if isinstance(table, dict) else None
        t = table.get("temperature") if isinstance(table, dict) else None
        if (not isinstance(n, list) or not isinstance(t, list) or not n or len(t) != len(n) + 1
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in n)
                or any(a >= b for a, b in zip(n, n[1:])) or not all(_positive(x) for x in t)):
            raise ValueError("temperature_by_questions must be {max_questions: [increasing ints >= 1], "
                             "temperature: [one more temperature > 0]}")
    softcap = config.get("logit_softcap")
    if softcap is not None and not _positive(softcap):
        raise ValueError("logit_softcap must be null or a number > 0")


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


class CodesPrompt:
    """Renders and tokenizes the codes-v1 prompt of a package (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, config: dict[str, Any]) -> None:
        check_config(config)
        self.codes: list[str] = list(config["codes"])
        self.header = config.get("prompt_layout") == "header-v1"
        self.markup = Tokenizer.from_str(tokenizer.to_str())
        self.markup.no_padding()
        self.markup.no_truncation()
        self.text = Tokenizer.from_str(self.markup.to_str())
        self.text.encode_special_tokens = True  # request text never becomes chat markup
        self.before = self._markup(config["chat"]["before"])
        self.after = self._markup(config["chat"]["after"])
        self._normalizer = self.text.normalizer
        # The most UTF-8 bytes a token's string holds: no text longer than budget * this (normalised)
        # fits a budget, so such a text is refused without being tokenized.
        self.max_token_bytes = max(len(t.encode("utf-8")) for t in self.text.get_vocab())
        self._cached = lru_cache(maxsize=8192)(self._encode_text)

    @classmethod
    def from_files(cls, tokenizer_path: Path, config: dict[str, Any]) -> CodesPrompt:
        return cls(Tokenizer.from_file(str(tokenizer_path)), config)

    def _markup(self, text: str) -> tuple[int, ...]:
        return tuple(self.markup.encode(text, add_special_tokens=False).ids) if text else ()

    def _encode_text(self, text: str) -> tuple[int, ...]:
        return tuple(encode_plain(self.text, text).ids)

    def check_codes(self, token_ids: Sequence[int]) -> None:
        """Raise ValueError unless every code reads as exactly its one token."""
        for code, tid in zip(self.codes, token_ids):
            got = self.text.encode(code, add_special_tokens=False).ids
            if got != [tid]:
                raise ValueError(f"code {code!r} tokenizes to {got}, not the single token [{tid}]")

    # ---- text --------------------------------------------------------------------------------

    def option_lines(self, q: Question, indent: str = "") -> list[str]:
        return [f"{indent}{code}: {text}" for code, text in zip(self.codes, option_texts(q))]

    def state_text(self, state: Any, listed: Sequence[Question] | None = None) -> str:
        """The state part; ``listed`` (header-v1) are the questions numbered in front of the state."""
        shown = EMPTY_STATE if state is None or state == "" else describe(state)
        head = ""
        if listed is not None:
            lines = ["Questions:"]
            for n, q in enumerate(listed, 1):
                default = DEFAULT_SET_INSTRUCTIONS if q.type == "set" else DEFAULT_INSTRUCTIONS
                lines.append(f"{n}. {describe(q.instructions) if q.instructions is not None else default}")
                if q.type in ("choice", "score"):
                    lines.extend(self.option_lines(q, "   "))
                elif q.type == "set":  # labels are not under codes: each label is a row of its own
                    lines.extend(f"   - {keyed_text(o)}" for o in q.options)
            head = "\n".join(lines) + "\n\n"
        return f"{head}State:\n{shown}\n\n"

    def question_text(self, q: Question, number: int | None = None) -> str:
        """The question part: instructions, the options under their codes, the reply line."""
        title = "Question:" if number is None else f"Question {number}:"
        instructions = describe(q.instructions) if q.instructions is not None else DEFAULT_INSTRUCTIONS
        options = "\n".join(self.option_lines(q))
        return f"{title}\n{instructions}\n\nOptions:\n{options}\n\n{REPLY}"

    # ---- tokens ------------------------------------------------------------------------------

    def bounded(self, text: str, budget: int, cache: bool = False) -> tuple[int, ...] | None:
        """The text's ids, or None when it cannot fit ``budget`` tokens (a long text is not tokenized)."""
        if len(text) > budget:  # a shorter text is cheap to tokenize whatever its tokens
            normal = self._normalizer.normalize_str(text) if self._normalizer is not None else text
            if len(normal.encode("utf-8")) > budget * self.max_token_bytes:
                return None
        ids = self._cached(text) if cache and len(text) <= _CACHE_CHARS else self._encode_text(text)
        return ids if len(ids) <= budget else None

    def state_ids(self, state: Any, listed: Sequence[Question] | None, budget: int) -> list[int] | None:
        """Chat markup and the state part, or None when they exceed ``budget`` tokens."""
        ids = self.bounded(self.state_text(state, listed), budget - len(self.before))
        return None if ids is None else [*self.before, *ids]

    def question_ids(self, q: Question, number: int | None, budget: int) -> list[int] | None:
        """The question part and the closing markup, or None when they exceed ``budget`` tokens."""
        ids = self.bounded(self.question_text(q, number), budget - len(self.after), cache=True)
        return None if ids is None else [*ids, *self.after]


__all__ = ["ATTENTION_MODES", "CONFIG_FORMAT", "PROMPT", "PROMPT_LAYOUTS", "READOUT", "READOUT_BIAS", "CodesPrompt",
           "check_config"]
