"""Comparison: where one replica's p99 leaves the latency goal, the pending-jobs value there (the
autoscaling target of deploy/k8s/keda), and what turning ONNX Runtime's spin-waiting off costs.

spinning: two servers, MiniLM fp32 at `--threads` intra-op threads, `spinning: true` (ORT's default)
and `spinning: false` (the Kubernetes profile), measured in interleaved rounds: sequential one-text
embeddings (client p50 and p99), and the server process's CPU time (utime + stime from /proc) per
request under a light open-loop load, where spin-waiting after each forward shows as CPU that does
no work: what an HPA on CPU reads as load.

scaling: one server as the Kubernetes profile runs it (spinning off). Its capacity is measured with
CONNECTIONS closed-loop clients; then an open-loop sweep (Poisson arrivals, seeded) of one-text
embeddings at fractions of that capacity, sent over CONNECTIONS pooled keep-alive connections, as a
Router holds them to one replica. Rates run interleaved in short passes (interleave()), so that a
burst of other work on a shared machine lands on every rate alike, and a rate's p99 is the median of
its passes' p99s. Latency runs from each request's scheduled arrival to its last byte (so a client
that falls behind counts against the server, not in its favour). /metrics is
sampled every SAMPLE_EVERY_S for edge_runtime_pending_jobs (the queue at that instant), its running
mean edge_runtime_pending_jobs_mean (what the scalers read) and edge_runtime_saturation. The target
point is where p99 leaves the goal for good, the highest rate whose p99 is within it; the target is the
mean of the pending-jobs samples there, which is what the running mean settles to at that load. A
first, short sweep places a load that needs three replicas (THREE_PODS x its target point's rate,
and x its grid neighbours'); the sweep proper and each candidate's share at 1..5 replicas then run
interleaved together, so the target point and the replay are measured under the same conditions,
and the candidate that needs three replicas by the sweep proper's point is replayed. With --record the samples of every
step go to tests/data/scaling/pending-trace.json, which tests/test_scaling.py feeds through the
HPA's arithmetic (only when the load still needs three replicas by the sweep proper's target point).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.lab import PACKAGE_NAME, Lab
from bench.harness.load import Connection, closed_loop_capacity, open_loop
from bench.harness.report import ROOT, Table, conditions, fmt_ratio
from bench.harness.server import ServerProcess
from bench.harness.stats import median, percentile, ratio
from bench.harness.texts import sentences

GOAL_P99_S = 0.100       # a routing signal's embedding, p99 (docs/deployment.md, "How the target was chosen")
CONNECTIONS = 32         # pooled keep-alive connections to one replica
CAPACITY_S = 4.0         # closed-loop capacity measurement
PRE_PASSES = 2           # the first sweep: where to place the replayed load
PRE_STEP_S = 3.0
PASSES = 5               # the sweep and the replay, interleaved in passes (see interleave()):
STEP_S = 2.5             # 12.5 s per rate in all (the test slides 10 s windows over the replay's samples)
PLACEMENTS = (-2, 1)     # candidate target points: the first sweep's, two grid steps below to one above
SETTLE_S = 0.5           # pause between steps
SAMPLE_EVERY_S = 0.1     # /metrics sampling period
SWEEP = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # fractions of the measured capacity
THREE_PODS = 2.5         # the replayed load, in the first sweep's target-point rates: more than two hold
PODS = (1, 2, 3, 4, 5)
SPIN_ROUNDS_PER_SETTING = 5
SPIN_SEQUENTIAL = 60     # sequential requests per server and round
SPIN_RATE = 20.0         # requests per second of the light load whose CPU is measured
SPIN_LOAD_S = 3.0
TEXTS = 256
TRACE = ROOT / "tests" / "data" / "scaling" / "pending-trace.json"

_GAUGE = re.compile(rb"^(edge_runtime_pending_jobs|edge_runtime_pending_jobs_mean|edge_runtime_saturation) (\S+)$",
                    re.MULTILINE)


def embedding_bodies(n: int = TEXTS, seed: int = 5) -> list[bytes]:
    """One-text embedding requests, distinct texts, cycled through."""
    return [json.dumps({"model": PACKAGE_NAME, "input": [t]}).encode() for t in sentences(n, seed=seed)]


# -- measurements ---------------------------------------------------------------------------------

@dataclass
class Step:
    """One open-loop step: what was offered, what came back, and the gauges sampled meanwhile."""

    rate: float                     # offered requests per second
    sent: int = 0
    ok: int = 0
    overloaded: int = 0             # 429s
    other_errors: int = 0
    latencies: list[float] = field(default_factory=list)   # seconds, 200s only, from scheduled arrival
    pass_p99s: list[float] = field(default_factory=list)   # seconds: each interleaved pass's own p99
    pending: list[float] = field(default_factory=list)     # edge_runtime_pending_jobs samples
    pending_mean: list[float] = field(default_factory=list)  # edge_runtime_pending_jobs_mean samples
    saturation: list[float] = field(default_factory=list)  # edge_runtime_saturation samples
    wall_s: float = 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 50) if self.latencies else math.inf

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 99) if self.latencies else math.inf

    @property
    def achieved(self) -> float:
        return self.ok / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_pending(self) -> float:
        return sum(self.pending) / len(self.pending) if self.pending else 0.0

    @property
    def mean_saturation(self) -> float:
        return sum(self.saturation) / len(self.saturation) if self.saturation else 0.0

    @property
    def typical_p99(self) -> float:
        """The median of the passes' p99s (the p99 of all samples when the step ran in one pass): on a
        shared machine one pass can fall into a burst of other work, and the median leaves it out."""
        return median(self.pass_p99s) if self.pass_p99s else self.p99

    def within(self, goal_s: float) -> bool:
        """Typical p99 within the goal, and every request answered 200 (a 429 is the replica refusing load)."""
        return (bool(self.latencies) and self.typical_p99 <= goal_s and self.overloaded == 0
                and self.other_errors == 0)


async def _sample_metrics(port: int, step: Step, stop: asyncio.Event) -> None:
    conn = await Connection.open(port)
    try:
        while not stop.is_set():
            status, body = await conn.request("GET", "/metrics")
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            values = {m.group(1): float(m.group(2)) for m in _GAUGE.finditer(body)}
            step.pending.append(values[b"edge_runtime_pending_jobs"])
            step.pending_mean.append(values[b"edge_runtime_pending_jobs_mean"])
            step.saturation.append(values[b"edge_runtime_saturation"])
            with contextlib.suppress(TimeoutError):  # the sampling period passed: sample again
                await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
    finally:
        conn.close()


async def measured_step(port: int, rate: float, duration_s: float, bodies: list[bytes], seed: int,
                        connections: int = CONNECTIONS) -> Step:
    """Poisson arrivals at ``rate`` for ``duration_s`` over ``connections`` pooled connections (the harness's
    open loop), with /metrics sampled meanwhile."""
    step = Step(rate=rate)
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_metrics(port, step, stop))
    run = await open_loop(port, lambda i: ("/v1/embeddings", bodies[i % len(bodies)]), rate,
                          connections=connections, duration_s=duration_s, seed=seed)
    stop.set()
    await sampler
    step.sent, step.wall_s = run.sent, run.wall_s
    for reply in run.replies:
        if reply.status == 200:
            step.ok += 1
            step.latencies.append(reply.latency_s)
        elif reply.status == 429:
            step.overloaded += 1
        else:
            step.other_errors += 1
    return step


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process (and its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the comparisons ------------------------------------------------------------------------------

def _server(lab: Lab, spinning: bool) -> ServerProcess:
    server = ServerProcess(lab.settings.package, "fp32", lab.settings.threads, name=PACKAGE_NAME,
                           log_dir=lab.log_dir, models=[{
                               "name": PACKAGE_NAME, "package": str(lab.settings.package.resolve()),
                               "variant": "fp32", "device": "cpu", "threads": lab.settings.threads,
                               "spinning": spinning}])
    return lab.adopt(server)


@dataclass
class SpinResult:
    latencies: list[float] = field(default_factory=list)
    cpu_per_request: list[float] = field(default_factory=list)  # seconds of server CPU per request
    cores_busy: list[float] = field(default_factory=list)       # server CPU seconds per wall second


def measure_spinning(lab: Lab) -> tuple[dict[bool, SpinResult], Table]:
    """Sequential latency and server CPU under a light load, spinning on and off, interleaved."""
    servers = {True: _server(lab, True), False: _server(lab, False)}
    for server in servers.values():
        server.wait_ready()
    bodies = embedding_bodies()
    results = {s: SpinResult() for s in servers}
    for server in servers.values():
        for body in bodies[:20]:
            server.request("POST", "/v1/embeddings", body)
    rounds = SPIN_ROUNDS_PER_SETTING
    for r in range(rounds):
        order = [True, False] if r % 2 == 0 else [False, True]
        for spinning in order:
            server = servers[spinning]
            for k in range(SPIN_SEQUENTIAL):
                resp = server.request("POST", "/v1/embeddings", bodies[(r * SPIN_SEQUENTIAL + k) % len(bodies)])
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {resp.body[:200]!r}")
                results[spinning].latencies.append(resp.read_s)
            cpu0 = _cpu_seconds(server.proc.pid)
            step = asyncio.run(measured_step(server.port, SPIN_RATE, SPIN_LOAD_S, bodies, seed=100 + r, connections=4))
            cpu = _cpu_seconds(server.proc.pid) - cpu0
            if step.ok != step.sent:
                raise RuntimeError(f"light load: {step.sent - step.ok} of {step.sent} requests failed")
            results[spinning].cpu_per_request.append(cpu / step.ok)
            results[spinning].cores_busy.append(cpu / step.wall_s)
    on, off = results[True], results[False]
    rows = [
        ["sequential p50 ms", f"{percentile(on.latencies, 50) * 1e3:.2f}", f"{percentile(off.latencies, 50) * 1e3:.2f}",
         fmt_ratio(ratio(percentile(off.latencies, 50), percentile(on.latencies, 50)))],
        ["sequential p99 ms", f"{percentile(on.latencies, 99) * 1e3:.2f}", f"{percentile(off.latencies, 99) * 1e3:.2f}",
         fmt_ratio(ratio(percentile(off.latencies, 99), percentile(on.latencies, 99)))],
        [f"server CPU ms per request at {SPIN_RATE:g} req/s (median of rounds)",
         f"{median(on.cpu_per_request) * 1e3:.2f}", f"{median(off.cpu_per_request) * 1e3:.2f}",
         fmt_ratio(ratio(median(off.cpu_per_request), median(on.cpu_per_request)))],
        [f"server CPU at {SPIN_RATE:g} req/s, cores (median of rounds)",
         f"{median(on.cores_busy):.3f}", f"{median(off.cores_busy):.3f}",
         fmt_ratio(ratio(median(off.cores_busy), median(on.cores_busy)))],
    ]
    table = Table(
        f"Intra-op spinning on vs off: MiniLM fp32, one text, {lab.settings.threads} threads, "
        f"{rounds} rounds × {SPIN_SEQUENTIAL} sequential + {SPIN_LOAD_S:g} s at {SPIN_RATE:g} req/s",
        ["measure", "spinning on (ORT default)", "spinning off (k8s profile)", "off / on"], rows,
        ["Client time from http.client, keep-alive; CPU is the server process's utime + stime over the "
         "light load (its event loop included).",
         "Spinning off saves the CPU that spin-waiting burns between forwards, so CPU tracks work; its "
         "cost is the wake-up of sleeping threads at the start of each forward."])
    for server in servers.values():
        server.stop()
    return results, table


@dataclass
class ScalingRun:
    capacity: float
    sweep: list[Step]
    target_rate: float | None
    target: float | None
    replay: dict[int, Step]
    total_rate: float | None  # the replayed load, all replicas together

    @property
    def needs_three(self) -> bool:
        """The replayed load is more than two replicas hold within the goal and at most three."""
        return (self.target_rate is not None and self.total_rate is not None
                and 2 < self.total_rate / self.target_rate <= 3 + 1e-9)


def interleave(port: int, rates: dict[int, float], passes: int, step_s: float, bodies: list[bytes],
               seed: int) -> dict[int, Step]:
    """Each rate for `passes` x `step_s` seconds, in passes of one short step per rate (the order
    rotating), merged per rate: a burst of other work on a shared machine then lands on every rate
    alike instead of on whichever rate ran at the time."""
    merged = {key: Step(rate=rate) for key, rate in rates.items()}
    keys = list(rates)
    for n in range(passes):
        for key in keys[n % len(keys):] + keys[: n % len(keys)]:
            time.sleep(SETTLE_S)
            part = asyncio.run(measured_step(port, rates[key], step_s, bodies, seed=seed + 1000 * n + key))
            _extend(merged[key], part)
    return merged


def _target_step(sweep: list[Step], goal_s: float) -> Step | None:
    """Where p99 leaves the goal for good: the highest rate within it. A lower rate out of the goal
    (a burst of other work on a shared machine) does not move the point."""
    within = [step for step in sweep if step.within(goal_s)]
    return within[-1] if within else None


def measure_scaling(lab: Lab, goal_s: float = GOAL_P99_S) -> ScalingRun:
    """The capacity, a first sweep to place the replay, then the sweep and the three-replica load's
    shares measured together, interleaved: the target point and the replay under the same conditions."""
    server = _server(lab, False)
    server.wait_ready()
    bodies = embedding_bodies()
    asyncio.run(closed_loop_capacity(server.port, "/v1/embeddings", 1.0, bodies, CONNECTIONS))  # warm-up
    capacity = asyncio.run(closed_loop_capacity(server.port, "/v1/embeddings", CAPACITY_S, bodies, CONNECTIONS))
    grid = {i: capacity * f for i, f in enumerate(SWEEP)}
    first = interleave(server.port, grid, PRE_PASSES, PRE_STEP_S, bodies, seed=0)
    placed = _target_step([first[i] for i in grid], goal_s)
    if placed is None:
        print("  no rate of the first sweep met the goal: nothing to replay", flush=True)
        server.stop()
        return ScalingRun(capacity, [first[i] for i in grid], None, None, {}, None)
    # Candidate loads: THREE_PODS x the first sweep's point and x its grid neighbours, so that one is
    # THREE_PODS x the sweep proper's point when the two sweeps differ by a step or two.
    at = list(grid.values()).index(placed.rate)
    near = [i for i in range(at + PLACEMENTS[0], at + PLACEMENTS[1] + 1) if 0 <= i < len(grid)]
    totals = {c: THREE_PODS * grid[i] for c, i in enumerate(near)}
    shares = {100 + 10 * c + pods: total / pods for c, total in totals.items() for pods in PODS}
    merged = interleave(server.port, {**grid, **shares}, PASSES, STEP_S, bodies, seed=10)
    sweep = [merged[i] for i in grid]
    point = _target_step(sweep, goal_s)
    fitting = [c for c, t in totals.items() if point is not None and 2 < t / point.rate <= 3]
    chosen = min(fitting, key=lambda c: abs(totals[c] / point.rate - THREE_PODS)) if point and fitting else 1
    total = totals[chosen]
    replay = {pods: merged[100 + 10 * chosen + pods] for pods in PODS}
    for step in sweep:
        print(f"  {step.rate:7.1f} req/s offered: p99 {step.p99 * 1e3:8.1f} ms (passes' median "
              f"{step.typical_p99 * 1e3:.1f}), pending {step.mean_pending:.2f}, 429s {step.overloaded}", flush=True)
    for pods, step in replay.items():
        print(f"  {pods} replicas, {step.rate:7.1f} req/s each: p99 {step.p99 * 1e3:8.1f} ms, "
              f"pending {step.mean_pending:.3f}, 429s {step.overloaded}", flush=True)
    server.stop()
    target_step = point
    if target_step is None or target_step.mean_pending <= 0:
        print("  no target point in the sweep (or its queue was always empty)", flush=True)
        return ScalingRun(capacity, sweep, None, None, replay, total)
    return ScalingRun(capacity, sweep, target_step.rate, target_step.mean_pending, replay, total)


def _extend(into: Step, part: Step) -> None:
    """Add one pass's step to the merged step of the same rate."""
    into.sent += part.sent
    into.ok += part.ok
    into.overloaded += part.overloaded
    into.other_errors += part.other_errors
    into.latencies += part.latencies
    if part.latencies:
        into.pass_p99s.append(part.p99)
    into.pending += part.pending
    into.pending_mean += part.pending_mean
    into.saturation += part.saturation
    into.wall_s += part.wall_s


def scaling_tables(run: ScalingRun, goal_s: float = GOAL_P99_S) -> list[Table]:
    rows = [[f"{s.rate:.1f}", f"{s.achieved:.1f}", f"{s.p50 * 1e3:.1f}", f"{s.p99 * 1e3:.1f}",
             f"{s.typical_p99 * 1e3:.1f}",
             f"{s.mean_pending:.2f}", f"{max(s.pending, default=0):.0f}", f"{s.mean_saturation:.3f}",
             str(s.overloaded), "yes" if s.within(goal_s) else "no"] for s in run.sweep]
    notes = [f"Closed-loop capacity with {CONNECTIONS} connections: {run.capacity:.1f} req/s. "
             f"{PASSES} interleaved passes of {STEP_S:g} s per rate (the replay's rates among them); the client "
             "shares the machine's cores with the server.",
             "Target point: where p99 leaves the goal for good, the highest offered rate whose p99 (the median "
             "of its passes' p99s) is within it with no 429; the target is the mean pending-jobs value sampled "
             "there."]
    if run.target is not None and run.target_rate is not None:
        notes.append(f"**Target point: {run.target_rate:.1f} req/s per replica, mean pending jobs "
                     f"{run.target:.3f}** (the scalers' target, to three decimals).")
    else:
        notes.append("No step met the goal: no target point.")
    tables = [Table(f"Scaling target: open-loop one-text embeddings on one replica (MiniLM fp32, spinning off), "
                    f"p99 goal {goal_s * 1e3:g} ms",
                    ["offered req/s", "answered req/s", "p50 ms", "p99 ms", "passes' median p99 ms",
                     "mean pending", "max pending",
                     "mean saturation", "429s", "within goal"], rows, notes)]
    if run.replay and run.target and run.total_rate and run.target_rate:
        target = run.target
        replay_rows = [[str(p), f"{s.rate:.1f}", f"{s.p99 * 1e3:.1f}", f"{s.mean_pending:.3f}",
                        str(s.overloaded), str(math.ceil(p * s.mean_pending / target))]
                       for p, s in sorted(run.replay.items())]
        tables.append(Table(
            f"A load that needs three replicas ({run.total_rate:.1f} req/s, "
            f"{run.total_rate / run.target_rate:.2f} × the target point's rate), as one replica sees it with "
            f"1-{max(PODS)} replicas",
            ["replicas", "req/s per replica", "p99 ms", "mean pending", "429s",
             "ceil(replicas × pending / target)"], replay_rows,
            ["tests/test_scaling.py replays these samples through the HPA's algorithm and behaviour."]))
    return tables


def trace_document(run: ScalingRun, goal_s: float, conds: dict[str, str]) -> dict[str, Any]:
    """What tests/test_scaling.py reads: the target point and every step's pending-jobs samples."""
    def step(s: Step) -> dict[str, Any]:
        d = asdict(s)
        d.pop("latencies")
        d.update(p50_ms=round(s.p50 * 1e3, 2), p99_ms=round(s.p99 * 1e3, 2),
                 typical_p99_ms=round(s.typical_p99 * 1e3, 2), mean_pending=round(s.mean_pending, 4))
        return d

    return {
        "what": "bench/scaling.py: pending-jobs samples from one replica under open-loop load",
        "conditions": conds,
        "goal_p99_ms": goal_s * 1e3,
        "connections": CONNECTIONS,
        "sample_every_s": SAMPLE_EVERY_S,
        "capacity_rps": round(run.capacity, 2),
        "target_point": {"rate": run.target_rate, "mean_pending": run.target},
        "sweep": [step(s) for s in run.sweep],
        "three_pods": {"total_rate": run.total_rate,
                       "per_replica": {str(p): step(s) for p, s in sorted(run.replay.items())}},
    }


def run(lab: Lab) -> list[Table]:
    """Both measurements; with --record the trace goes to tests/data/scaling/pending-trace.json."""
    _, spin_table = measure_spinning(lab)
    print("\n" + spin_table.markdown(), flush=True)
    scaling = measure_scaling(lab)
    tables = [spin_table, *scaling_tables(scaling)]
    if lab.settings.record and not (scaling.target and scaling.needs_three):
        print(f"\nno target point, or the replayed load is not a three-replica load under this run's "
              f"conditions: {TRACE.relative_to(ROOT)} left as it was", flush=True)
    elif lab.settings.record:
        conds = conditions(lab.settings.threads, lab.settings.rounds)
        TRACE.parent.mkdir(parents=True, exist_ok=True)
        TRACE.write_text(json.dumps(trace_document(scaling, GOAL_P99_S, conds), indent=1) + "\n", encoding="utf-8")
        print(f"\ntrace recorded in {TRACE.relative_to(ROOT)}", flush=True)
    return tables
