"""Loading a tokenizer.json and reading what the budget cut needs to know about it.

Two facts come from the file itself: the special-token envelope the post-processor puts around a
text or a pair (probed, and required to be fixed), and whether the pipeline drops or folds
characters, which decides the characters-per-token bound and whether a cut may go inside a run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from tokenizers.pre_tokenizers import ByteLevel

# How many original characters a normalizer can fold into one: NFC composes up to four
# (U+03B1 U+0313 U+0300 U+0345 -> U+1F82), Hangul jamo three; NFKC and SentencePiece's
# precompiled nmt_nfkc compose the same way.
_COMPOSING = {"NFC", "NFKC", "Precompiled"}
COMPOSE_FACTOR = 4
# Normalizers that never remove a character nor merge several into one.
_KEEPING_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel", "NFC", "NFKC"}
# Pre-tokenizers that keep every character (those that remove split characters are checked apart).
_KEEPING_PRETOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts", "FixedLength"}
# Characters a precompiled SentencePiece charsmap commonly removes, checked one by one.
_DROP_SUSPECTS = (
    [chr(c) for c in range(0x00, 0x20)]
    + [chr(c) for c in range(0x7F, 0xA1)]
    + [chr(c) for c in range(0x200B, 0x2010)]
    + [chr(c) for c in range(0x2028, 0x202F)]
    + [chr(c) for c in range(0x2060, 0x2065)]
    + [chr(c) for c in range(0xFE00, 0xFE10)]
    + ["\u00ad", "\u034f", "\u061c", "\u115f", "\u1160", "\u17b4", "\u17b5", "\u180e", "\u3164",
       "\ufeff", "\uffa0", "\ufff9", "\ufffa", "\ufffb", "\U000e0001", "\U000e0020", "\U000e0100"]
)


def load_tokenizer(path: Path) -> Tokenizer:
    """Read a tokenizer.json with its baked-in padding and truncation turned off (we pad ourselves)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


@dataclass(frozen=True)
class TokenizerTraits:
    """What the tokenizer's pipeline does to characters, read from its JSON."""

    model: str
    folds: bool  # drops or folds characters: no characters-per-token bound, no cut inside a run
    reasons: tuple[str, ...]  # why it folds, for the report
    composes: bool  # the normalizer may merge several characters into one
    longest_token_chars: int  # longest vocabulary entry or added token, in characters
    longest_added_chars: int  # longest added token, in characters
    unknown_ids: tuple[int, ...] = ()  # the model's unknown token, if it has one

    @property
    def chars_per_token(self) -> int | None:
        """Most original characters one token can cover; None when characters can vanish."""
        if self.folds:
            return None
        return self.longest_token_chars * (COMPOSE_FACTOR if self.composes else 1)


def _flatten(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    if not node:
        return []
    if node.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for child in node.get(key, []):
            out.extend(_flatten(child, key))
        return out
    return [node]


def _precompiled_drops(tokenizer: Tokenizer) -> bool:
    """True when a precompiled charsmap removes a character or collapses repeated white space."""
    normalizer = tokenizer.normalizer
    if normalizer is None:
        return False
    for ch in _DROP_SUSPECTS:
        if normalizer.normalize_str("a" + ch + "b") == "ab":
            return True
    return any(len(normalizer.normalize_str("a" + ch * 3 + "b")) < 5 for ch in (" ", "\u3000", "\u00a0", "\t"))


def analyze(tokenizer: Tokenizer) -> TokenizerTraits:
    """Classify the tokenizer's normalizer, pre-tokenizer, model and added tokens."""
    spec = json.loads(tokenizer.to_str())
    reasons: list[str] = []
    composes = False
    for norm in _flatten(spec.get("normalizer"), "normalizers"):
        kind = norm.get("type", "?")
        composes = composes or kind in _COMPOSING
        if kind == "Precompiled":
            if _precompiled_drops(tokenizer):
                reasons.append("the precompiled normalizer removes characters")
        elif kind == "Replace":
            pattern = norm.get("pattern", {})
            content = norm.get("content", "")
            # a plain one-for-one character replacement (" " -> "▁") keeps the count
            if not ("String" in pattern and len(pattern["String"]) == 1 and len(content) >= 1):
                reasons.append("a Replace normalizer can remove characters")
        elif kind not in _KEEPING_NORMALIZERS:
            reasons.append(f"the {kind} normalizer drops or folds characters")
    for pre in _flatten(spec.get("pre_tokenizer"), "pretokenizers"):
        kind = pre.get("type", "?")
        if kind in ("Split", "Punctuation"):
            if pre.get("behavior") == "Removed":
                reasons.append(f"the {kind} pre-tokenizer removes what it splits on")
        elif kind not in _KEEPING_PRETOKENIZERS:
            reasons.append(f"the {kind} pre-tokenizer drops characters")
    model = spec.get("model", {})
    model_type = model.get("type", "?")
    if model_type in ("WordPiece", "WordLevel"):
        reasons.append(f"{model_type} reads an unknown or long word as one unknown token")
    elif model_type == "Unigram":
        if not model.get("byte_fallback"):
            reasons.append("Unigram fuses unknown characters into one token")
    elif model_type == "BPE":
        if model.get("fuse_unk"):
            reasons.append("BPE fuses unknown characters into one token")
        elif model.get("unk_token") is None and not model.get("byte_fallback"):
            vocab = model.get("vocab", {})
            pres = _flatten(spec.get("pre_tokenizer"), "pretokenizers")
            byte_level = any(p.get("type") == "ByteLevel" for p in pres)
            if not (byte_level and all(ch in vocab for ch in ByteLevel.alphabet())):
                reasons.append("BPE without an unknown token skips characters outside its alphabet")
    else:
        reasons.append(f"unknown model type {model_type}")
    added = spec.get("added_tokens", [])
    if any(t.get("lstrip") or t.get("rstrip") for t in added):
        reasons.append("an added token strips the white space around it")
    longest_added = max((len(t.get("content", "")) for t in added), default=0)
    longest_vocab = max((len(k) for k in tokenizer.get_vocab(with_added_tokens=True)), default=1)
    unk = model.get("unk_token")
    unknown = [tokenizer.token_to_id(unk)] if isinstance(unk, str) else []
    if isinstance(model.get("unk_id"), int):  # Unigram
        unknown.append(model["unk_id"])
    return TokenizerTraits(
        model=model_type,
        folds=bool(reasons),
        reasons=tuple(reasons),
        composes=composes,
        longest_token_chars=max(longest_vocab, longest_added, 1),
        longest_added_chars=longest_added,
        unknown_ids=tuple(sorted({u for u in unknown if u is not None})),
    )


@dataclass(frozen=True)
class Layout:
    """The specials around the content of one input shape, as the post-processor puts them."""

    before: tuple[int, ...]  # ids before the first sequence
    before_types: tuple[int, ...]
    between: tuple[int, ...]  # ids between the sequences (pairs only)
    between_types: tuple[int, ...]
    after: tuple[int, ...]  # ids after the last sequence
    after_types: tuple[int, ...]
    content_types: tuple[int, ...]  # type id of each sequence's tokens

    @property
    def specials(self) -> int:
        return len(self.before) + len(self.between) + len(self.after)


def _layout(tokenizer: Tokenizer, text: str, pair: str | None) -> Layout:
    enc = tokenizer.encode(text, pair, add_special_tokens=True)
    seq = enc.sequence_ids
    ids, types = enc.ids, enc.type_ids
    groups: list[list[int]] = [[]]  # special positions between sequence runs
    content_types: list[int] = []
    seen: list[int] = []
    prev: int | None = None
    for i, s in enumerate(seq):
        if s is None:
            groups[-1].append(i)
            prev = None
            continue
        if seen and seen[-1] == s and prev is None and groups[-1]:
            raise ValueError("the post-processor puts special tokens inside a sequence")
        prev = s
        if not seen or seen[-1] != s:
            if s in seen:
                raise ValueError("the post-processor interleaves the sequences")
            seen.append(s)
            content_types.append(types[i])
            groups.append([])
        elif types[i] != content_types[-1]:
            raise ValueError("the post-processor gives one sequence several type ids")
    expected = [0] if pair is None else [0, 1]
    if seen != expected:
        raise ValueError("the post-processor reorders or drops a sequence")
    # the content must come through the post-processor unchanged
    for s, piece in zip(expected, [text] if pair is None else [text, pair]):
        alone = tokenizer.encode(piece, add_special_tokens=False)
        if [ids[i] for i, x in enumerate(seq) if x == s] != alone.ids:
            raise ValueError("the post-processor changes the content tokens")
    pick = lambda g: tuple(ids[i] for i in g)  # noqa: E731
    pick_t = lambda g: tuple(types[i] for i in g)  # noqa: E731
    mid = groups[1] if pair is not None else []
    return Layout(
        before=pick(groups[0]), before_types=pick_t(groups[0]),
        between=pick(mid), between_types=pick_t(mid),
        after=pick(groups[-1]), after_types=pick_t(groups[-1]),
        content_types=tuple(content_types),
    )


@dataclass(frozen=True)
class Envelope:
    """The fixed special-token envelope of single texts and of pairs."""

    single: Layout
    pair: Layout

    @classmethod
    def probe(cls, tokenizer: Tokenizer) -> Envelope:
        """Run the tokenizer's own post-processor on probe texts of different lengths.

        Raises ValueError when the envelope depends on the content (we assemble rows ourselves,
        so it must not).
        """
        shapes = []
        for text, pair in (("a", "b"), ("hello world, again.", "x y z 1 2 3")):
            single, double = _layout(tokenizer, text, None), _layout(tokenizer, text, pair)
            shapes.append((single, double))
        if shapes[0] != shapes[1]:
            raise ValueError("the tokenizer's special-token envelope depends on the content")
        single, double = shapes[0]
        if single.specials != tokenizer.num_special_tokens_to_add(False) or double.specials != (
            tokenizer.num_special_tokens_to_add(True)
        ):
            raise ValueError("the post-processor's envelope disagrees with num_special_tokens_to_add")
        return cls(single, double)
