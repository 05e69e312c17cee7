"""Token classification: per-token labels to spans with code-point offsets: BIO entities, or runs of
tokens whose positive-label probability passes a threshold (grounded heads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Unicode White_Space, as the Router's span decoders trim (Rust's ``char::is_whitespace``): Python's
#: ``str.isspace`` would also strip U+001C..U+001F, which are not whitespace there.
WHITESPACE = "".join(map(chr, [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                               0x2029, 0x202F, 0x205F, 0x3000]))


@dataclass(frozen=True)
class Span:
    """A span found in a text: code-point offsets, end exclusive."""

    label: str
    start: int
    end: int
    text: str
    probability: float

    def body(self) -> dict[str, object]:
        return {"label": self.label, "start": self.start, "end": self.end,
                "text": self.text, "probability": float(self.probability)}


def _entity(label: str) -> tuple[str, str]:
    """Split a BIO label into (prefix, entity); 'O' and unprefixed labels have no prefix."""
    if len(label) > 2 and label[1] == "-" and label[0] in "BIES":
        return label[0], label[2:]
    return "", label


def decode_bio(
    probabilities: np.ndarray, offsets: np.ndarray, labels: list[str], text: str
) -> list[Span]:
    """Decode spans from per-token probabilities [n, L] and offsets [n, 2] into ``text``.

    Each token takes its first argmax label. B-X opens a span, I-X continues an open X or opens one,
    anything else closes. A span's probability is the mean of its tokens' label probabilities, and its
    edges are trimmed of Unicode whitespace; a span that is whitespace only is kept as it is (the
    Router's decoders keep it: a model that labels a run of spaces says so). Tokens with offsets
    (0, 0) (specials) are skipped.
    """
    spans: list[Span] = []
    current: list[int] | None = None  # [start, end] of the open span
    probs_of: list[float] = []
    entity = ""

    def close() -> None:
        nonlocal current, probs_of
        if current is not None:
            start, end = current[0], current[1]
            piece = text[start:end]
            if piece.strip(WHITESPACE):
                start += len(piece) - len(piece.lstrip(WHITESPACE))
                end -= len(piece) - len(piece.rstrip(WHITESPACE))
            if end > start:
                spans.append(Span(entity, start, end, text[start:end], float(np.mean(probs_of))))
        current, probs_of = None, []

    best = probabilities.argmax(axis=-1)
    for t in range(len(best)):
        start, end = int(offsets[t][0]), int(offsets[t][1])
        if start == 0 and end == 0:
            continue
        prefix, name = _entity(labels[int(best[t])])
        p = float(probabilities[t, best[t]])
        if prefix == "B" or (prefix == "I" and (current is None or name != entity)):
            close()
            current, entity, probs_of = [start, end], name, [p]
        elif prefix == "I" and current is not None:
            current[1] = end
            probs_of.append(p)
        else:
            close()
    close()
    return spans


def bio_answer(probabilities: np.ndarray, offsets: np.ndarray, labels: list[str], text: str,
               threshold: float | None, windows: list[tuple[int, int]] | None) -> dict[str, Any]:
    """A token classification answer: the BIO spans (those at least ``threshold`` probable, when
    given) and the windows the input was read in, when it was."""
    spans = decode_bio(probabilities, offsets, labels, text)
    if threshold is not None:
        spans = [s for s in spans if s.probability >= threshold]
    answer: dict[str, Any] = {"spans": [s.body() for s in spans]}
    if windows is not None:
        answer["windows"] = [{"start": a, "end": b} for a, b in windows]
    return answer


def positive_runs(probabilities: np.ndarray, offsets: np.ndarray, text: str, label: str,
                  passes: Callable[[float], bool]) -> list[Span]:
    """Runs of consecutive tokens whose positive-label probability ``passes`` (a grounded head's rule).

    ``probabilities`` [n] are the positive label's per token, ``offsets`` [n, 2] code points into
    ``text``. A token without a source span (end <= start) neither extends nor ends a run. A run spans
    its first token's start to its furthest end, untrimmed, and its probability is its tokens' maximum.
    """
    spans: list[Span] = []
    run: list[float] | None = None  # [start, end, probability]
    for p, (start, end) in zip(probabilities.tolist(), offsets.tolist()):
        if end <= start:
            continue
        if passes(p):
            run = [start, end, p] if run is None else [run[0], max(run[1], end), max(run[2], p)]
        elif run is not None:
            spans.append(Span(label, int(run[0]), int(run[1]), text[int(run[0]):int(run[1])], run[2]))
            run = None
    if run is not None:
        spans.append(Span(label, int(run[0]), int(run[1]), text[int(run[0]):int(run[1])], run[2]))
    return spans
