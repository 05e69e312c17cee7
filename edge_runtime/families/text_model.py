"""What the families over one text-encoder graph share (encoder, task_heads): the card's kind, head and
labels, the tokenizer within the served token limit, and the engine's probe-row and warm hooks."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_runtime.families.base import ProbeRow, random_row
from edge_runtime.packages import Package
from edge_runtime.text import TextEncoder


class TextEncoderModel:
    """A package read through its tokenizer; the family sets ``forward`` from its head's outputs."""

    batchable = True  # the load-time probe decides how rows may share a forward

    def __init__(self, package: Package, max_input_tokens: int | None = None,
                 max_scan_tokens: int | None = None) -> None:
        card = package.card
        self.kind = card.kind
        self.surfaces = frozenset(card.surfaces)
        self.labels: list[str] = list(card.labels or [])
        self.head: dict[str, Any] = dict(card.head or {})
        limit = int(card.limits["max_input_tokens"])
        self.max_input_tokens = min(limit, max_input_tokens or limit)
        # The models file's scan budget for overflow: window when options.max_tokens sets none.
        self.max_scan_tokens = max_scan_tokens
        self.text = TextEncoder(package.file("tokenizer.json"), self.max_input_tokens)
        self.digest = package.digest
        self._vocab_size = self.text.tokenizer.get_vocab_size()
        self._probe_rng = np.random.default_rng(0)

    # -- engine hooks -------------------------------------------------------------------------

    def probe_row(self, length: int) -> ProbeRow:
        """A fresh row of random token ids for the batch-invariance probe (equal rows would prove nothing)."""
        return random_row(self._probe_rng, self._vocab_size, length)

    def warm(self) -> None:
        """Probe the tokenizer's cut classes now, so the first long input does not pay for it."""
        self.text.cut_report()
