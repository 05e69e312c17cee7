"""Comparison b: what the server adds around the model, from its own Server-Timing header.

overhead = total - forward (parse, tokenize, queue, post, serialize and the handler's glue);
transport = client wall time - total (the socket, HTTP parsing on both sides, the event loop).
"""

from __future__ import annotations

from bench.harness.lab import Lab
from bench.harness.report import Table
from bench.harness.stats import percentile
from bench.harness.texts import sentences

REQUESTS_PER_ROUND = 50
WARMUP = 10
TARGET_MS = 1.0
SHORT_WORDS = 6  # one short text: a handful of tokens, so forward is small and overhead shows
PHASES = ("parse", "tokenize", "queue", "forward", "post", "serialize", "total")


def run(lab: Lab) -> list[Table]:
    server = lab.server("fp32")
    text = [" ".join(sentences(1, seed=3)[0].split()[:SHORT_WORDS])]
    for _ in range(WARMUP):
        server.embeddings(text)
    overhead: list[float] = []
    transport: list[float] = []
    client: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(lab.settings.rounds):
        for _ in range(REQUESTS_PER_ROUND):
            resp = server.embeddings(text)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.body[:300]!r}")
            timing = resp.server_timing()
            missing = [p for p in ("forward", "total") if p not in timing]
            if missing:
                raise RuntimeError(f"Server-Timing lacks {missing}: {resp.headers.get('server-timing')!r}")
            overhead.append(timing["total"] - timing["forward"])
            transport.append(resp.read_s * 1000.0 - timing["total"])
            client.append(resp.read_s * 1000.0)
            for p in PHASES:
                if p in timing:
                    phases[p].append(timing[p])
    return [summary_table(overhead, transport, client, len(text[0].split())), phase_table(phases)]


def summary_table(overhead: list[float], transport: list[float], client: list[float], words: int) -> Table:
    p50 = percentile(overhead, 50)
    rows = [
        ["server overhead (total − forward)", f"{p50:.3f}", f"{percentile(overhead, 90):.3f}",
         f"< {TARGET_MS:g} ms: {'met' if p50 < TARGET_MS else 'NOT met'}"],
        ["transport (client − total)", f"{percentile(transport, 50):.3f}", f"{percentile(transport, 90):.3f}", ""],
        ["client wall time", f"{percentile(client, 50):.3f}", f"{percentile(client, 90):.3f}", ""],
    ]
    return Table(
        f"Server overhead: one short embedding ({words} words), {len(overhead)} sequential keep-alive requests",
        ["measure", "p50 ms", "p90 ms", "target"],
        rows,
        ["From the response's Server-Timing header; client time is measured to the last body byte."],
    )


def phase_table(phases: dict[str, list[float]]) -> Table:
    rows = [[p, f"{percentile(v, 50):.3f}", f"{percentile(v, 90):.3f}"] for p, v in phases.items() if v]
    return Table("Server overhead: Server-Timing phases", ["phase", "p50 ms", "p90 ms"], rows)
