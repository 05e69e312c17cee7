"""Token classification: per-token labels to BIO spans with code-point offsets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    edges are trimmed of whitespace. Tokens with offsets (0, 0) (specials) are skipped.
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
            lead = len(piece) - len(piece.lstrip())
            trail = len(piece) - len(piece.rstrip())
            start, end = start + lead, end - trail
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
