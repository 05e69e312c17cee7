"""Deterministic inputs: ~20-word support-desk sentences, one long text of an exact size, long texts of the
shapes issue 8 names (one long word, punctuation runs, base64, CJK, emoji, ...), decision requests about
support messages, and a prefix of words fitted to a token count."""

from __future__ import annotations

import base64
import random
from collections.abc import Callable, Sequence
from typing import Any

from edge_runtime.text.probe import lcg_bytes

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


# -- the long-input shapes of issue 8 ---------------------------------------------------------------


def _repeat_to(block: str, n_bytes: int) -> str:
    """``block`` repeated and cut to at most ``n_bytes`` UTF-8 bytes (a cut character is dropped)."""
    text = block * (n_bytes // len(block.encode("utf-8")) + 1)
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")


_EMOJI = ["\U0001F600", "\U0001F602", "\U0001F44D\U0001F3FD", "\u2764\uFE0F", "\U0001F1EB\U0001F1F7",
          "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\U0001F525", "\U0001F389",
          "\U0001F9D1\U0001F3FF\u200D\U0001F4BB"]
_SCRIPT_WORDS = ["support", "\u0437\u0430\u043a\u0430\u0437",
                 "\u03bb\u03bf\u03b3\u03b1\u03c1\u03b9\u03b1\u03c3\u03bc\u03cc\u03c2",
                 "\u0627\u0644\u0641\u0627\u062a\u0648\u0631\u0629", "\u05d7\u05e9\u05d1\u05d5\u05df",
                 "\u0916\u093e\u0924\u093e", "\u8d26\u6237", "\u30a2\u30ab\u30a6\u30f3\u30c8", "\uacc4\uc815",
                 "caf\u00e9", "stra\u00dfe", "\U0001F600", "2024-05-01", "#42"]


def _words(n_bytes: int, seed: int) -> str:
    return long_text(n_bytes, seed)


def _one_long_word(n_bytes: int, seed: int) -> str:
    # lowercase letters, no separator anywhere: one pre-token for every word-splitting tokenizer
    return _repeat_to("".join(chr(97 + b % 26) for b in lcg_bytes(seed, 65536)), n_bytes)


def _punctuation_runs(n_bytes: int, seed: int) -> str:
    return _repeat_to("!?", n_bytes)  # the "!?!?...": one token per character


def _whitespace_runs(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    parts = []
    for _ in range(256):  # words between runs of 1 to 4,000 mixed white-space characters
        parts.append(rng.choice(["ticket", "refund", "login", "invoice"]))
        parts.append("".join(rng.choice(" \t\n\r\u00a0\u3000") for _ in range(rng.randint(1, 4000))))
    return "x" + _repeat_to("".join(parts), n_bytes - 2) + "x"  # not stripped away by the server


def _base64(n_bytes: int, seed: int) -> str:
    return _repeat_to(base64.b64encode(lcg_bytes(seed, 49152)).decode("ascii"), n_bytes)  # 64 Ki-character blocks


def _hex(n_bytes: int, seed: int) -> str:
    return _repeat_to(lcg_bytes(seed, 32768).hex(), n_bytes)  # one unbroken run of hex digits


def _cjk(n_bytes: int, seed: int) -> str:
    # Chinese ideographs with Japanese kana runs, no spaces and no punctuation
    rng = random.Random(seed)
    chars = [chr(rng.randint(0x4E00, 0x9FA5)) if rng.random() < 0.8 else chr(rng.randint(0x3041, 0x3093))
             for _ in range(30000)]
    return _repeat_to("".join(chars), n_bytes)


def _emoji(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    groups = ["".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 6))) for _ in range(4000)]
    return _repeat_to(" ".join(groups) + " ", n_bytes)


def _mixed_scripts(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    words = [rng.choice(_SCRIPT_WORDS) + rng.choice(["", "", ",", ".", "!"]) for _ in range(20000)]
    return _repeat_to(" ".join(words) + " ", n_bytes)


def _surrogates_replaced(n_bytes: int, seed: int) -> str:
    # what a client sends after decoding damaged UTF-8 (lone surrogates, stray continuation bytes,
    # truncated sequences) with errors="replace": prose with single U+FFFD and runs of them
    rng = random.Random(seed)
    raw = bytearray(long_text(200_000, seed).encode("utf-8"))
    for _ in range(6000):
        at = rng.randrange(len(raw))
        raw[at: at + 1] = rng.choice([b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\x80", b"\xff", b"\xe2\x82", b"\xc3"])
    return _repeat_to(bytes(raw).decode("utf-8", errors="replace"), n_bytes)


#: The text shapes of issue 8 item 2, each ``(n_bytes, seed) -> text`` of at most n_bytes UTF-8 bytes.
SHAPES: dict[str, Callable[[int, int], str]] = {
    "words": _words,
    "one long word": _one_long_word,
    "punctuation runs": _punctuation_runs,
    "whitespace runs": _whitespace_runs,
    "base64": _base64,
    "hex": _hex,
    "CJK without spaces": _cjk,
    "emoji": _emoji,
    "mixed scripts": _mixed_scripts,
    "surrogates replaced": _surrogates_replaced,
}


def shaped_text(shape: str, n_bytes: int, seed: int = 3) -> str:
    """A text of one of SHAPES, of ``n_bytes`` UTF-8 bytes less at most three (a character's tail)."""
    if n_bytes < 16:
        raise ValueError("n_bytes must be at least 16")
    return SHAPES[shape](n_bytes, seed)


def fit_words(count: Callable[[str], int], words: Sequence[str], target: int) -> str:
    """The prefix of ``words`` (joined by spaces) whose ``count`` is closest to ``target``.

    ``count`` must not decrease as words are added (a token count does not); binary search finds the
    longest prefix within the target, then the next one is taken when it is closer.
    """
    if not words:
        raise ValueError("no words to fit")
    lo, hi = 1, len(words)
    if count(" ".join(words)) < target:
        raise ValueError(f"all {len(words)} words count {count(' '.join(words))}, fewer than {target}")
    while lo < hi:  # the longest prefix with count <= target (or 1 word)
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= target:
            lo = mid
        else:
            hi = mid - 1
    best = lo
    if lo < len(words) and abs(count(" ".join(words[: lo + 1])) - target) < abs(count(" ".join(words[:lo])) - target):
        best = lo + 1
    return " ".join(words[:best])


# Questions a router asks about a support message: a Choice, a Noul and a Score each, from these.
_CHOICES: list[tuple[str, dict[str, str | None]]] = [
    ("Which team should handle this message?",
     {"billing": "payments, invoices and refunds", "shipping": "parcels and delivery",
      "technical": "apps, logins and errors", "sales": "new orders and pricing"}),
    ("What does the customer want?",
     {"refund": "money back", "information": "an answer to a question",
      "change": "an update to an account or an order", "cancel": "to stop a service", "other": None}),
    ("Which product area is this about?", {"account": "sign-in and settings", "orders": None, "reports": None}),
]
_NOULS: list[tuple[str, dict[str, str] | None]] = [
    ("Is the customer upset?", {"true": "the customer sounds angry or frustrated"}),
    ("Does the message ask for a call back?", None),
    ("Is this about money?", {"false": "nothing about payments", "true": "payments, charges or refunds"}),
]
_SCORES: list[tuple[str, list[str]]] = [
    ("How urgent is this message?", ["not urgent", "this week", "today", "within the hour", "right now"]),
    ("How hard will this be to resolve?", ["trivial", "easy", "moderate", "hard"]),
]


def decision_requests(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` distinct requests (state and questions), the same for a seed, in both servers' format.

    Each state is one to three support-desk sentences; each request asks a Choice (``criteria`` as
    ``{key: description}``), a Noul and a Score (``criteria`` as a list of levels).
    """
    rng = random.Random(seed)
    pool = sentences(max(3 * count, 8), seed=seed + 100)
    out = []
    for i in range(count):
        state = " ".join(pool[(3 * i + k) % len(pool)] for k in range(rng.randint(1, 3)))
        c_text, c_crit = rng.choice(_CHOICES)
        n_text, n_crit = rng.choice(_NOULS)
        s_text, s_crit = rng.choice(_SCORES)
        noul: dict[str, Any] = {"type": "noul", "instructions": n_text}
        if n_crit is not None:
            noul["criteria"] = dict(n_crit)
        out.append({"state": state, "questions": {
            "route": {"type": "choice", "instructions": c_text, "criteria": dict(c_crit)},
            "flag": noul,
            "level": {"type": "score", "instructions": s_text, "criteria": list(s_crit)},
        }})
    return out
