"""The d3 prompt: one chat-formatted prompt per question, rendered and tokenized as the released runtime does.

upstream-formats.md §3.6. Each question is one prompt: a system turn, a user turn (one image placeholder per
request image in front of the text) and the thinking-off generation prompt, with the user text

    State:\\n<state or (empty)>\\n\\nQuestion:\\n<instructions or the default>\\n\\nOptions:\\n<code>: <text>
    ...\\n\\nReply with only the code of the best option.

Option texts in code order: Choice ``key`` or ``key: describe(description)``; Noul the false then the true
description (``No / false`` and ``Yes / true`` when absent); Score ``describe(level)`` per level, which must be
distinct. ``describe`` is the string itself, else ``json.dumps(value, ensure_ascii=False)`` with the DEFAULT
separators (``", "``, ``": "``) and no key sorting, unlike the compact canonical JSON elsewhere.

The whole string is encoded once, no special tokens added, with the package tokenizer (built by the converter
as §3.5 says and saved as tokenizer.json): chat markup that appears literally in the state matches as added
tokens, exactly as in the released runtime, and tokens may merge across the state/question boundary. Nothing
is truncated: a prompt over the token limit fails its question with ``max_length_exceeded``. Pure and
server-side: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from edge_runtime.families.code_options import (
    DEFAULT_INSTRUCTIONS,
    EMPTY_STATE,
    REPLY,
    SYSTEM,
    describe,
    option_texts,
)
from edge_runtime.questions import InvalidQuestion, Question, failed_answer
from edge_runtime.questions.base import QUESTION_MALFORMED

IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
SYSTEM_TURN = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
ASSISTANT_OPEN = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
#: Question parts up to this many characters are cached by text (the Router repeats its questions).
_CACHE_CHARS = 4096


def refusal(q: Question, codes: int) -> InvalidQuestion | None:
    """A question the d3 prompt cannot list: more options than codes, or Score levels that read the same."""
    if len(q.options) > codes:
        return InvalidQuestion(q.id, q.type, "too_many_options",
                               f"this model lists at most {codes} options under its codes; the question has "
                               f"{len(q.options)}")
    if q.type == "score":
        levels = option_texts(q)
        if any(not text for text in levels) or len(set(levels)) != len(levels):
            return InvalidQuestion(q.id, q.type, QUESTION_MALFORMED,
                                   "score levels must be distinct and non-empty as the prompt shows them")
    return None


def user_text(state: Any, q: Question, codes: Sequence[str]) -> str:
    """The user turn's text of one question (§3.6, lines joined with newlines)."""
    shown = EMPTY_STATE if state is None or state == "" else describe(state)
    instructions = describe(q.instructions) if q.instructions is not None else DEFAULT_INSTRUCTIONS
    options = [f"{code}: {text}" for code, text in zip(codes, option_texts(q))]
    return "\n".join(["State:", shown, "", "Question:", instructions, "", "Options:", *options, "", REPLY])


def render(user: str, images: int = 0, videos: int = 0) -> str:
    """The whole prompt: system turn, user turn (image then video placeholders first), generation prompt."""
    media = IMAGE_PLACEHOLDER * images + VIDEO_PLACEHOLDER * videos
    return f"{SYSTEM_TURN}<|im_start|>user\n{media}{user}<|im_end|>\n{ASSISTANT_OPEN}"


@dataclass(frozen=True)
class PromptTokens:
    """One question's prompt: its token IDs (one per media placeholder, not yet expanded) and its length as
    the limit counts it (each placeholder counted as its media's tokens)."""

    ids: tuple[int, ...]
    length: int


class D3Prompt:
    """Renders and tokenizes the d3 prompt of a converted package (its tokenizer.json and codes)."""

    def __init__(self, tokenizer: Tokenizer, codes: Sequence[str]) -> None:
        self.tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.codes = list(codes)
        self._normalizer = self.tokenizer.normalizer
        # The most UTF-8 bytes one token's string holds: a prompt longer than limit * this (normalised)
        # cannot fit the limit, so it is refused without being tokenized.
        self.max_token_bytes = max(len(t.encode("utf-8")) for t in self.tokenizer.get_vocab())
        self._cached = lru_cache(maxsize=4096)(self._encode)

    @classmethod
    def from_file(cls, tokenizer_path: Path, codes: Sequence[str]) -> D3Prompt:
        return cls(Tokenizer.from_file(str(tokenizer_path)), codes)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode(self, text: str) -> tuple[int, ...]:
        """The whole string's IDs, no special tokens added (chat markup in it matches as added tokens)."""
        return self._cached(text) if len(text) <= _CACHE_CHARS else self._encode(text)

    def check_codes(self, token_ids: Sequence[int]) -> None:
        """Raise ValueError unless every code encodes alone to exactly its one token."""
        if len(token_ids) != len(self.codes):
            raise ValueError(f"{len(self.codes)} codes but {len(token_ids)} token ids")
        for code, tid in zip(self.codes, token_ids):
            got = list(self._encode(code))
            if got != [tid]:
                raise ValueError(f"code {code!r} tokenizes to {got}, not the single token [{tid}]")

    def text(self, state: Any, q: Question, images: int = 0, videos: int = 0) -> str:
        """One question's whole prompt string."""
        return render(user_text(state, q, self.codes), images, videos)

    def tokens(self, state: Any, q: Question, limit: int, media_tokens: Sequence[int] = (),
               videos: int = 0) -> PromptTokens | dict[str, Any]:
        """The question's prompt tokens, or its in-place error: ``max_length_exceeded`` when the prompt (each
        placeholder counted as its media's ``media_tokens``) exceeds ``limit``; ``question_malformed`` when the
        request carries media and the state or question holds a literal image or video placeholder."""
        images = len(media_tokens) - videos
        text = self.text(state, q, images, videos)
        if media_tokens and (text.count(IMAGE_TOKEN) != images or text.count(VIDEO_TOKEN) != videos):
            return failed_answer(q.type, "invalid_question", QUESTION_MALFORMED,
                                 "the state or question contains a literal image or video placeholder token")
        extra = sum(media_tokens) - len(media_tokens)
        if len(text) > limit - extra:  # a shorter text is cheap to tokenize whatever its tokens
            normal = self._normalizer.normalize_str(text) if self._normalizer is not None else text
            if len(normal.encode("utf-8")) > (limit - extra) * self.max_token_bytes:
                return _too_long(q, limit)
        ids = self.encode(text)
        length = len(ids) + extra
        if length > limit:
            return _too_long(q, limit)
        return PromptTokens(ids, length)


def common_prefix(rows: Sequence[Sequence[int]]) -> int:
    """The longest common token prefix of the rows, leaving at least one token in every row: what a causal
    package runs once for a request's questions (each prompt is encoded whole, so the prefix ends where the
    rows' tokens first differ, which may be inside the state when a token merges across the boundary)."""
    n = max(min(len(r) for r in rows) - 1, 0)
    first = rows[0]
    for k in range(n):
        if any(r[k] != first[k] for r in rows[1:]):
            return k
    return n


def _too_long(q: Question, limit: int) -> dict[str, Any]:
    return failed_answer(q.type, "max_length_exceeded", "question_tokens",
                         f"the state and this question take more than the {limit} tokens this model reads per "
                         "question; nothing was truncated")


__all__ = ["D3Prompt", "PromptTokens", "common_prefix", "describe", "refusal", "render", "user_text"]
