"""Decision 2.0 prompt segments (docs/reference/upstream-formats.md §1.6).

One row per question: the prefix, one segment per option and the suffix are tokenized separately
with the package tokenizer (no special tokens) and concatenated; tokenizing the joined string
could merge tokens across segment boundaries and move the positions the head reads. Positions:
``endpoints[j]`` = the last token of option segment j, ``query`` = the last token of the row.
Nothing is ever truncated: a row longer than ``max_input_tokens`` is max_length_exceeded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from edge_runtime.text.bounds import BudgetReader

SUFFIX = "\n\nSelect the single option best supported by the context and instructions.\nDecision:"
NOUL_DEFAULTS = {"false": "No", "true": "Yes"}


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload(value: Any) -> str:
    """A string as it is; anything else as canonical JSON."""
    return value if isinstance(value, str) else canonical(value)


def prefix_text(state: Any, kind: str, instructions: Any) -> str:
    return f"Context:\n{payload(state)}\n\nTask type: {kind}\nQuestion:\n{payload(instructions)}\nOptions:"


def option_text(key: str, description: Any) -> str:
    """``\\n<option>\\n{"description":...,"key":...}\\n</option>`` (canonical JSON: description first)."""
    return f"\n<option>\n{canonical({'key': key, 'description': description})}\n</option>"


@dataclass(frozen=True)
class PromptRow:
    """One question's token ids and the positions the head reads."""

    ids: list[int]
    endpoints: list[int]
    query: int


class PromptTooLong(ValueError):
    """The question's row exceeds max_input_tokens (never truncated)."""


def options_of(kind: str, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Noul's options are false then true, with the Decision 2.0 defaults "No" / "Yes" for null."""
    if kind == "noul":
        given = dict(options)
        return [(k, NOUL_DEFAULTS[k] if given.get(k) is None else given[k]) for k in ("false", "true")]
    return list(options)


def render(tokenizer: Tokenizer, state: Any, kind: str, instructions: Any, options: Sequence[tuple[str, Any]],
           max_input_tokens: int, reader: BudgetReader | None = None) -> PromptRow:
    """Tokenize the segments separately and concatenate; ValueError for an empty option or suffix.

    With ``reader`` the prefix (which holds the state) is tokenized only as far as the limit needs:
    a longer one is PromptTooLong at the cost of the limit, not of its length.
    """
    def enc(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    prefix = prefix_text(state, kind, instructions)
    if reader is None:
        ids = enc(prefix)
    else:
        read = reader.read(prefix, max_input_tokens + 1)
        if not read.complete:
            raise PromptTooLong(f"the question needs more than {max_input_tokens} tokens, the limit")
        ids = [int(t) for t in read.ids]
    endpoints = []
    for key, desc in options_of(kind, options):
        seg = enc(option_text(key, desc))
        if not seg:
            raise ValueError(f"option {key!r} encodes to no tokens")
        ids.extend(seg)
        endpoints.append(len(ids) - 1)
    suffix = enc(SUFFIX)
    if not suffix:
        raise ValueError("the suffix encodes to no tokens")
    ids.extend(suffix)
    if len(ids) > max_input_tokens:
        raise PromptTooLong(f"the question needs {len(ids)} tokens, the limit is {max_input_tokens}")
    return PromptRow(ids, endpoints, len(ids) - 1)
