"""Comparison c: a 5 MiB text against MiniLM's 256-token budget, under overflow reject and truncate.

Each mode gets a fresh server, so its peak RSS (VmHWM) starts from the same warmed baseline: the
growth shows whether a long input costs memory proportional to its size or to the token budget.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.lab import Lab
from bench.report import Table, fmt_ms
from bench.stats import median
from bench.texts import long_text, sentences

TEXT_BYTES = 5 * 1024 * 1024
MAX_TOKENS = 256  # MiniLM's limit (content plus specials); the package refuses more
REQUESTS = 3
MODES = ("reject", "truncate")
MIB = 1024 * 1024


def _outcome(status: int, body: Any) -> tuple[str, str]:
    """(result, tokens) for the table: an embedding's dimension or the error code, and usage."""
    if status != 200:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return f"HTTP {status} {error.get('code', '')}".strip(), "–"
    item = body["data"][0]
    usage = body.get("usage", {})
    tokens = str(usage.get("prompt_tokens", "–")) + (" (lower bound)" if usage.get("tokens_lower_bound") else "")
    if item.get("embedding") is None:
        return f"item error {item.get('error', {}).get('code')}", tokens
    return f"embedding, {len(item['embedding'])} dims", tokens


def run(lab: Lab) -> list[Table]:
    text = long_text(TEXT_BYTES)
    rows = []
    for mode in MODES:
        server = lab.fresh_server("fp32")
        try:
            server.embeddings(sentences(4, seed=5))  # warm: the baseline includes one ordinary forward
            before = server.memory()
            seconds: list[float] = []
            outcome = ("–", "–")
            after_first: dict[str, int] = {}
            for i in range(REQUESTS):
                started = time.perf_counter()
                resp = server.embeddings([text], options={"max_tokens": MAX_TOKENS, "overflow": mode})
                seconds.append(time.perf_counter() - started)
                outcome = _outcome(resp.status, json.loads(resp.body))
                if i == 0:
                    after_first = server.memory()
            after = server.memory()
        finally:
            server.stop()
        rows.append([
            mode, outcome[0], outcome[1], fmt_ms(median(seconds), 1),
            f"{before['VmRSS'] / MIB:.1f} → {after['VmRSS'] / MIB:.1f}",
            f"{(after_first['VmHWM'] - before['VmHWM']) / MIB:+.1f}",
            f"{(after['VmHWM'] - before['VmHWM']) / MIB:+.1f}",
        ])
    return [Table(
        f"Long input: one {TEXT_BYTES // MIB} MiB text, options.max_tokens {MAX_TOKENS}",
        ["overflow", "result", "tokens", f"median ms ({REQUESTS} requests)", "VmRSS MiB before → after",
         "VmHWM growth MiB (1st)", f"VmHWM growth MiB (all {REQUESTS})"],
        rows,
        ["A fresh server per mode, warmed with one ordinary request before the baseline is read from "
         "/proc/<pid>/status. The time includes sending the 5 MiB body over loopback."],
    )]
