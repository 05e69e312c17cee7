"""What every per-input surface (classify, embeddings, rerank) says about each input it answers.

Each result carries ``input``: how many tokens the input has, how many the model read, whether
some were left unread, and in how many windows it was read, so that a caller (the Router checks
full coverage before it trusts a semantic comparison) can tell what was read of each input. A
failed input is answered in place as ``{"index", "error": "<code>", "message"}``, the one item
error shape of the product (a failed question has the same ``error`` and ``message``), and never
fails the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import ItemError
from edge_runtime.text import Encoded


@dataclass(frozen=True)
class InputUsage:
    """One input's coverage: its tokens (a lower bound when read in part), the tokens read, windows."""

    tokens: int
    processed_tokens: int
    truncated: bool = False
    tokens_lower_bound: bool = False
    windows: int | None = None

    @classmethod
    def of(cls, encoded: Encoded) -> InputUsage:
        """The coverage of a tokenized text input."""
        return cls(encoded.tokens, encoded.processed, encoded.truncated, encoded.tokens_lower_bound,
                   None if encoded.windows is None else len(encoded.windows))

    @classmethod
    def whole(cls, tokens: int) -> InputUsage:
        """An input read whole (an image or a clip: its tower's tokens)."""
        return cls(tokens, tokens)

    def body(self) -> dict[str, Any]:
        """``{tokens, processed_tokens, truncated, tokens_lower_bound?, windows?}``."""
        out: dict[str, Any] = {"tokens": self.tokens, "processed_tokens": self.processed_tokens,
                               "truncated": self.truncated}
        if self.tokens_lower_bound:
            out["tokens_lower_bound"] = True
        if self.windows is not None:
            out["windows"] = self.windows
        return out


def failed_item(index: int, error: ItemError, **fields: Any) -> dict[str, Any]:
    """A failed input answered in place: its index, the error code as a string, the message."""
    return {"index": index, **fields, "error": error.code, "message": error.message}


def request_usage(usages: list[InputUsage], key: str) -> dict[str, Any]:
    """The request's usage: the sum of its answered inputs' tokens under ``key``
    (``prompt_tokens`` and ``total_tokens`` for embeddings, ``input_tokens`` otherwise)."""
    tokens = sum(u.tokens for u in usages)
    usage: dict[str, Any] = {key: tokens}
    if key == "prompt_tokens":
        usage["total_tokens"] = tokens
    if any(u.tokens_lower_bound for u in usages):
        usage["tokens_lower_bound"] = True
    return usage


def outcome(encoded: Encoded | ItemError, outputs: list[Any] | ItemError) -> Encoded | ItemError:
    """An item keeps its own error; otherwise a failure of the whole forward (a deadline) becomes its error."""
    return outputs if isinstance(outputs, ItemError) and not isinstance(encoded, ItemError) else encoded


def ran(outputs: list[Any] | ItemError) -> list[Any]:
    """The forward's outputs; none when the job failed as a whole (then ``outcome`` fails every item)."""
    return [] if isinstance(outputs, ItemError) else outputs
