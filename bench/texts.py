"""Deterministic inputs: ~20-word support-desk sentences and one long text of an exact size."""

from __future__ import annotations

import random

_SUBJECTS = ["the customer", "our team", "the new user", "a manager", "the support agent", "my colleague",
             "the billing service", "the mobile app", "an administrator", "the warehouse"]
_VERBS = ["cannot reset", "wants to update", "asked about", "keeps losing", "tried to export", "needs to cancel",
          "reported a problem with", "could not find", "is waiting for", "accidentally deleted"]
_OBJECTS = ["the account password", "last month's invoice", "the shipping address", "a shared calendar",
            "the quarterly report", "two factor authentication", "the refund request", "a saved payment card",
            "the team workspace", "an order confirmation email"]
_TAILS = ["after the latest update was installed on every laptop in the office",
          "because the confirmation link expired before anyone had a chance to open it",
          "although the same steps worked perfectly well for everybody else last week",
          "and would like someone to call back before the end of the working day",
          "since the page shows an error message that nobody on the team understands",
          "while travelling abroad with a slow and unreliable hotel internet connection"]


def sentences(count: int, seed: int = 0) -> list[str]:
    """`count` distinct sentences of 17-23 words (about 23-30 MiniLM tokens), the same for a seed."""
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        text = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"
        text = text[0].upper() + text[1:] + "."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def long_text(n_bytes: int, seed: int = 1) -> str:
    """ASCII prose of exactly `n_bytes` bytes (and characters), built from the sentences above."""
    if n_bytes < 1:
        raise ValueError("n_bytes must be positive")
    pool = sentences(200, seed)
    parts: list[str] = []
    size = 0
    i = 0
    while size < n_bytes:
        piece = pool[i % len(pool)] + " "
        parts.append(piece)
        size += len(piece)
        i += 1
    return "".join(parts)[:n_bytes]
