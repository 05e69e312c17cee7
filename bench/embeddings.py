"""Comparison a: all-MiniLM-L6-v2 embeddings, our server over HTTP vs PyTorch, Optimum and bare ONNX
Runtime in-process, at batch 1, 8 and 32, then image and audio embeddings against the same towers in
PyTorch (bench/media.py). Our own exact int8 graph also runs in-process (bare sessions at the thread
counts the server measured, tokenizers and numpy pooling) beside the server, so what the server adds
around the forward is a number per batch; the int8 server is also timed through a lean client (no header
parsing: what the Router's Go client pays) and its Server-Timing phases read at batch 1. Issue 40's goals
open the tables, judged on this run.

Every contestant has the same intra-op thread budget. Rounds are interleaved in a rotating order so
that drift on a shared machine spreads over every contestant alike. Our int8 is the exact
(per-token) variant, served batched under exact numerics; the run checks that claim itself: every
text embedded alone must come back bit-identical to its row in the batch of 32.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from bench import media
from bench.harness.lab import Lab
from bench.harness.report import Table, fmt_ms, fmt_ratio
from bench.harness.runners import Contestant, HttpContestant, cosines
from bench.harness.server import ServerProcess
from bench.harness.server_timing import parse_server_timing
from bench.harness.stats import Summary, ratio, summarize
from bench.harness.texts import sentences

BATCH = 32
#: Batch size -> (timed calls per round, untimed calls before the first round).
BATCHES = {1: (30, 5), 8: (12, 3), BATCH: (6, 2)}
SETTLE_S = 0.3      # idle gap between contestants, so spinning pools of the previous one go quiet
REFERENCE = "torch"
ORT = "onnxruntime"
ORT_INT8 = "onnxruntime-int8"
LEAN = "ours-int8-lean"
#: Issue 13's targets for exact int8 over HTTP at batch 32.
TARGET_VS_TORCH = 2.0
TARGET_VS_ORT = 1.5
#: Issue 40's: exact int8 over HTTP against sentence-transformers at batch 1 and 32, and the most the server
#: may add to the same graph's forward in-process at batch 1.
GOAL_VS_TORCH = 2.5
GOAL_OVERHEAD_MS = 0.5
PHASE_CALLS = 200  # one-text calls read for their Server-Timing phases


@dataclass
class Result:
    key: str
    contestant: Contestant
    by_batch: dict[int, Summary]

    @property
    def batch1(self) -> Summary:
        return self.by_batch[1]

    @property
    def batch32(self) -> Summary:
        return self.by_batch[BATCH]


def _contestants(lab: Lab) -> dict[str, Contestant]:
    """Start everything in parallel (loading dominates), then wait for each. Our int8 graph in-process
    starts once the int8 server is ready: it runs each forward at the thread count the server measured
    for that size (/v1/models), so that the difference between them is the server's own work."""
    servers = {v: lab.start_server(v) for v in ("fp32", "int8")}
    workers = {k: lab.start_worker(k) for k in ("sentence-transformers", "optimum", ORT)}
    for server in servers.values():
        server.wait_ready()
    workers[ORT_INT8] = lab.start_worker(ORT_INT8, thread_plan=served_thread_plan(servers["int8"]))
    for worker in workers.values():
        worker.wait_ready()
    return {
        "ours-fp32": HttpContestant("edge-runtime fp32 (HTTP, float JSON)", servers["fp32"]),
        "ours-int8": HttpContestant("edge-runtime exact int8 (HTTP, float JSON)", servers["int8"]),
        "ours-int8-b64": HttpContestant("edge-runtime exact int8 (HTTP, base64)", servers["int8"], "base64"),
        LEAN: HttpContestant("edge-runtime exact int8 (HTTP, base64, lean client)", servers["int8"], "base64",
                             lean=True),
        REFERENCE: workers["sentence-transformers"],
        "optimum": workers["optimum"],
        ORT: workers[ORT],
        ORT_INT8: workers[ORT_INT8],
    }


def served_thread_plan(server: ServerProcess) -> list[tuple[int, int]]:
    """The (most tokens, threads) plan a server measured for its model at load (none: one count)."""
    model = next(m for m in server.get("/v1/models").json()["data"] if m["id"] == server.name)
    plan = model.get("engine_args", {}).get("threads_by_tokens", {}).get("plan", [])
    return [(int(step["up_to_tokens"]), int(step["threads"])) for step in plan]


def alone_vs_batched(contestant: HttpContestant, texts: list[str]) -> int:
    """How many texts embed bit-identically alone and inside one batch of all of them (base64: exact bytes)."""
    exact = HttpContestant(contestant.label, contestant.server, "base64")
    batched = exact.embed(texts)
    return sum(int(exact.embed([t])[0].tobytes() == batched[i].tobytes()) for i, t in enumerate(texts))


def run(lab: Lab) -> list[Table]:
    """Measure, then return the headline, latency, throughput, overhead and agreement tables."""
    rounds = lab.settings.rounds
    contestants = _contestants(lab)
    texts = {size: sentences(size, seed=7 if size == 1 else 11) for size in BATCHES}
    for c in contestants.values():
        for size, (_, warmup) in BATCHES.items():
            c.time(texts[size], warmup)
    keys = list(contestants)
    timed: dict[str, dict[int, list[list[float]]]] = {k: {size: [] for size in BATCHES} for k in keys}
    for r in range(rounds):
        order = keys[r % len(keys):] + keys[: r % len(keys)]
        for key in order:
            time.sleep(SETTLE_S)
            for size, (calls, _) in BATCHES.items():
                timed[key][size].append(contestants[key].time(texts[size], calls))
    results = {k: Result(k, contestants[k], {size: summarize(v) for size, v in timed[k].items()}) for k in keys}
    batch = texts[BATCH]
    vectors = {k: contestants[k].embed(batch) for k in keys}
    identical = {k: alone_vs_batched(contestants[k], batch)  # type: ignore[arg-type]
                 for k in ("ours-fp32", "ours-int8")}
    phases = server_phases(contestants["ours-int8-b64"], texts[1])  # type: ignore[arg-type]
    tables = [goals_table(results, phases), int8_table(results, vectors, identical),
              latency_table(results, lab.settings.threads, rounds),
              throughput_table(results), overhead_table(results), agreement_table(results, vectors)]
    return tables + media.run(lab)  # image and audio rows: SigLIP base vision, Whisper tiny.en


def overhead_table(results: dict[str, Result]) -> Table:
    """What the server adds around the forward: each of our variants over HTTP (base64 for int8, exact
    bytes) against the same graph in-process, at every batch size."""
    rows = []
    for http_key, local_key in (("ours-int8-b64", ORT_INT8), (LEAN, ORT_INT8), ("ours-fp32", ORT)):
        for size in BATCHES:
            http, local = results[http_key].by_batch[size], results[local_key].by_batch[size]
            rows.append([results[http_key].contestant.label, str(size), fmt_ms(local.median), fmt_ms(http.median),
                         fmt_ms(http.median - local.median), fmt_ratio(ratio(local.median, http.median))])
    return Table(
        "Embeddings: the server around the forward (HTTP against the same graph in-process)",
        ["served", "batch", "in-process median ms", "HTTP median ms", "server + HTTP ms", "in-process / HTTP"],
        rows,
        ["In-process: bare ONNX Runtime sessions on the package's graph with the same pinned settings, the "
         "package's tokenizer and numpy mean pooling; the int8 graph runs each forward at the thread count the "
         "server measured for its size (its /v1/models plan), fp32 at the common count. HTTP: the client's wall "
         "time, so the difference holds the client's own encoding and decoding as well as the server's work "
         "(http.client's header parsing alone is 0.1-0.3 ms; the lean client's is a few microseconds)."],
    )


def server_phases(contestant: HttpContestant, texts: list[str], n: int = PHASE_CALLS) -> dict[str, float]:
    """The median of each Server-Timing phase (ms) over ``n`` calls of ``texts``, after the timed rounds."""
    for _ in range(5):  # the idle vCPU's wake-up, as the rounds' warm-up calls
        contestant.server.embeddings(texts, contestant.encoding_format)
    seen: dict[str, list[float]] = {}
    for _ in range(n):
        resp = contestant.server.embeddings(texts, contestant.encoding_format)
        for phase, ms in parse_server_timing(resp.headers.get("server-timing", "")).items():
            seen.setdefault(phase, []).append(ms)
    return {phase: statistics.median(values) for phase, values in seen.items()}


def goals_table(results: dict[str, Result], phases: dict[str, float]) -> Table:
    """Issue 40's goals, each with what this run measured, through http.client and through the lean client;
    ``phases``: the int8 server's Server-Timing medians at batch 1, for the server's own share."""
    torch = results[REFERENCE]
    rows = []
    for key in ("ours-int8-b64", LEAN):
        ours = results[key]
        for size in (1, BATCH):
            r = ratio(torch.by_batch[size].median, ours.by_batch[size].median)
            rows.append([f"{ours.contestant.label}: speed vs sentence-transformers, batch {size}", fmt_ratio(r),
                         f">= {GOAL_VS_TORCH:.1f}x", "met" if r is not None and r >= GOAL_VS_TORCH else "NOT met"])
        added = (ours.by_batch[1].median - results[ORT_INT8].by_batch[1].median) * 1000.0
        rows.append([f"{ours.contestant.label}: HTTP minus the graph in-process, batch 1", f"{added:.2f} ms",
                     f"<= {GOAL_OVERHEAD_MS:.1f} ms", "met" if added <= GOAL_OVERHEAD_MS else "NOT met"])
    own = phases.get("total", 0.0) - phases.get("forward", 0.0)
    rows.append(["the int8 server's own work around the forward, batch 1 (Server-Timing total - forward)",
                 f"{own:.2f} ms", f"<= {GOAL_OVERHEAD_MS:.1f} ms", "met" if own <= GOAL_OVERHEAD_MS else "NOT met"])
    return Table(
        "Embeddings: issue 40's goals (exact int8 MiniLM over HTTP)",
        ["measure", "this run", "goal", "verdict"],
        rows,
        ["Medians of every round's calls. The lean client sends pre-built bytes and parses no header but "
         "Content-Length (bench/harness/clients.py): what a caller like the Router's Go client sees.",
         f"Server-Timing at batch 1 (medians of {PHASE_CALLS} calls after the rounds, ms): "
         + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()) + ". Between the server's total and the "
         "client's wall time lie Sanic's reading and writing, the loopback socket and two wake-ups of an idle vCPU."],
    )


def int8_table(results: dict[str, Result], vectors: dict[str, np.ndarray], identical: dict[str, int]) -> Table:
    """Issue 13's check in one place: exact int8 over HTTP at batch 32 against the peers, and its numerics."""
    ours = results["ours-int8"].batch32
    rows = []
    for key, target in ((REFERENCE, TARGET_VS_TORCH), (ORT, TARGET_VS_ORT), ("ours-fp32", None)):
        peer = results[key].batch32
        r, best = ratio(peer.median, ours.median), ratio(peer.round_low, ours.round_low)
        verdict = "" if target is None else (f"{target:.1f}x: {'met' if r >= target else 'NOT met'}")
        rows.append([results[key].contestant.label, fmt_ms(peer.median, 1), fmt_ms(ours.median, 1),
                     fmt_ratio(r), fmt_ratio(best), verdict])
    cos_fp32 = cosines(vectors["ours-int8"], vectors["ours-fp32"])
    cos_torch = cosines(vectors["ours-int8"], vectors[REFERENCE])
    return Table(
        f"Exact int8 (per-token) over HTTP, batch {BATCH}, against each peer",
        ["peer", "peer median ms", "ours int8 median ms", "speed vs peer", "speed vs peer (best rounds)",
         "target"],
        rows,
        [f"Rows alone vs batched, bit for bit (each text alone, then all {BATCH} in one request, base64): "
         f"exact int8 {identical['ours-int8']}/{BATCH}, fp32 {identical['ours-fp32']}/{BATCH}.",
         f"Agreement of exact int8 on these {BATCH} texts: cosine to our fp32 min {cos_fp32.min():.6f} mean "
         f"{cos_fp32.mean():.6f}; to sentence-transformers min {cos_torch.min():.6f} mean {cos_torch.mean():.6f}.",
         "Our time is client wall time over HTTP (float JSON); the peers' is in-process around the library "
         "call. ONNX Runtime fp32 in-process is a bare session on the package's model.onnx with the same "
         "pinned settings (ORT_ENABLE_ALL, sequential) plus tokenizers and numpy pooling."],
    )


def latency_table(results: dict[str, Result], threads: int, rounds: int) -> Table:
    ref = results[REFERENCE].batch1
    ours = results["ours-fp32"].batch1
    rows = [[
        r.contestant.label, fmt_ms(r.batch1.median), fmt_ms(r.batch1.p90),
        f"{fmt_ms(r.batch1.round_low)}–{fmt_ms(r.batch1.round_high)}",
        fmt_ratio(ratio(ref.median, r.batch1.median)), fmt_ratio(ratio(ref.round_low, r.batch1.round_low)),
        fmt_ratio(ratio(ours.median, r.batch1.median)),
    ] for r in results.values()]
    return Table(
        f"Embeddings, batch 1: latency (all-MiniLM-L6-v2, {threads} threads, {rounds} rounds × {BATCHES[1][0]} calls)",
        ["contestant", "median ms", "p90 ms", "round medians ms (best–worst)", "speed vs torch",
         "speed vs torch (best rounds)", "speed vs ours fp32"],
        rows,
        ["speed vs X = X's median / this median (above 1: faster than X). The best-rounds ratio compares "
         "each contestant's best round median: the least disturbed estimate on a shared machine.",
         "One ~20-word text (about 25 tokens) per call; HTTP times include the request, JSON and decoding."],
    )


def throughput_table(results: dict[str, Result]) -> Table:
    def tput(r: Result) -> float:
        return BATCH / r.batch32.median

    ref = tput(results[REFERENCE])
    ref_best = results[REFERENCE].batch32.round_low
    ours = tput(results["ours-fp32"])
    rows = [[
        r.contestant.label, fmt_ms(r.batch32.median, 1),
        f"{fmt_ms(r.batch32.round_low, 1)}–{fmt_ms(r.batch32.round_high, 1)}",
        f"{tput(r):.0f}", fmt_ratio(ratio(tput(r), ref)), fmt_ratio(ratio(ref_best, r.batch32.round_low)),
        fmt_ratio(ratio(tput(r), ours)),
    ] for r in results.values()]
    return Table(
        f"Embeddings, batch {BATCH}: throughput",
        ["contestant", "median ms / batch", "round medians ms (best–worst)", "texts/s", "vs torch",
         "vs torch (best rounds)", "vs ours fp32"],
        rows,
        [f"{BATCH} distinct ~20-word texts per call; texts/s = {BATCH} / median batch time."],
    )


def agreement_table(results: dict[str, Result], vectors: dict[str, np.ndarray]) -> Table:
    rows = []
    for key, r in results.items():
        vs_torch = cosines(vectors[key], vectors[REFERENCE])
        vs_ours = cosines(vectors[key], vectors["ours-fp32"])
        rows.append([r.contestant.label, f"{vs_torch.min():.6f}", f"{vs_torch.mean():.6f}",
                     f"{vs_ours.min():.6f}", f"{vs_ours.mean():.6f}"])
    return Table(
        f"Embeddings: agreement on the same {BATCH} texts (cosine)",
        ["contestant", "min vs torch", "mean vs torch", "min vs ours fp32", "mean vs ours fp32"],
        rows,
        ["int8 is the exact variant: per-token activation scales and per-channel int8 weights of the same "
         "graph; its cosine to fp32 is the quality cost."],
    )
