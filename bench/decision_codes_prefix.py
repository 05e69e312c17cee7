"""`python -m bench.decision_codes prefix`: a state-once request's prefix cache shared by its branches
(CausalForward ``branch_mode="shared"``) against tiled once per branch of a chunk (``"tiled"``, the
default: faster where a chunk holds several branches), side by side in one run, on a built state-once package.

Rows are random token ids below the prompt (a ``--prefix``-token prefix and ``--branch``-token
branches, ``--questions`` of them), as ``bench.decision_codes``'s engine contestant uses them.

- Memory: each (mode, questions) in a fresh process, which loads the graph, runs the same prefix with
  one branch (so the baseline holds the model, the prefill and a one-branch run in ONNX Runtime's
  arena), resets the peak (``/proc/self/clear_refs``), runs the request once and reports VmHWM minus
  VmRSS before it: the request's own peak resident growth, ORT's arena and numpy alike
  (tracemalloc would miss the arena). Also the bytes of the prefix cache the request hands to the
  session: one cache shared, or a chunk's tiled copies.
- Time: one process, both modes on one session, alternating which goes first in each round; medians
  and the ratio tiled / shared. The last-token hidden states of both modes are compared bit for bit.

The harness imports neither onnxruntime nor torch; ``prefix-child`` does the measuring.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from bench.decision_codes_build import CACHE_DIR, PACKAGES, token_rows
from bench.harness.report import ROOT

MODES = ("shared", "tiled")
QUESTIONS = (1, 8, 32)
PREFIX_TOKENS = 500
BRANCH_TOKENS = 30
ROUNDS = 5
MIB = 1024 * 1024


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


def _forward(package: Path, graph: str, threads: int, mode: str) -> Any:
    from edge_runtime.engine.causal import CausalForward
    from edge_runtime.engine.session import create_session

    config = json.loads((package / "decision_config.json").read_text(encoding="utf-8"))
    session = create_session(package / graph, "cpu", threads)
    return CausalForward(session, pad_id=int(config["pad_token_id"]), branch_mode=mode)


def _rows(package: Path, prefix: int, branch: int, questions: int) -> Any:
    from edge_runtime.engine.causal import branch_row

    vocab = json.loads((package / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    ids, branches = token_rows(len(vocab), prefix, branch, questions)
    return branch_row(ids, branches)


def cache_bytes(forward: Any, prefix: int, questions: int) -> int:
    """Bytes of the prefix's key/value cache a request hands to the session at once."""
    per_row = prefix * forward.kv_bytes_per_token()
    if forward.branch_mode == "shared":
        return per_row
    return per_row * min(questions, forward._chunk_rows(prefix))


def memory_child(args: argparse.Namespace) -> dict[str, Any]:
    """One (mode, questions) in this fresh process: the request's peak RSS growth."""
    forward = _forward(args.package, args.graph, args.threads, args.mode)
    row = _rows(args.package, args.prefix, args.branch, args.questions)
    forward([_rows(args.package, args.prefix, args.branch, 1)])  # warm: the model, the prefill, one branch
    rss = _status_kib("VmRSS")
    _reset_peak()
    started = time.perf_counter()
    forward([row])
    seconds = time.perf_counter() - started
    return {"mode": args.mode, "questions": args.questions, "peak_growth_bytes": (_status_kib("VmHWM") - rss) * 1024,
            "held_after_bytes": (_status_kib("VmRSS") - rss) * 1024, "seconds": seconds,
            "cache_bytes": cache_bytes(forward, args.prefix, args.questions)}


def time_child(args: argparse.Namespace) -> dict[str, Any]:
    """Both modes on one session, interleaved: seconds per call by mode and questions, and bit equality."""
    import numpy as np

    from edge_runtime.engine.causal import CausalForward

    shared = _forward(args.package, args.graph, args.threads, "shared")
    tiled = CausalForward(shared.session, pad_id=shared.pad_id, branch_mode="tiled")
    forwards = {"shared": shared, "tiled": tiled}
    out: dict[str, Any] = {"seconds": {}, "identical": {}}
    for q in args.counts:
        row = _rows(args.package, args.prefix, args.branch, q)
        results = {m: f([row])[0] for m, f in forwards.items()}  # also the warm-up
        out["identical"][str(q)] = bool(np.array_equal(results["shared"], results["tiled"]))
        seconds: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            for m in (MODES if r % 2 == 0 else MODES[::-1]):
                started = time.perf_counter()
                forwards[m]([row])
                seconds[m].append(time.perf_counter() - started)
        out["seconds"][str(q)] = seconds
    return out


def _child(argv: list[str], timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.decision_codes", "prefix-child", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"prefix-child {' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _common(args: argparse.Namespace) -> list[str]:
    return ["--package", str(args.package), "--graph", args.graph, "--threads", str(args.threads),
            "--prefix", str(args.prefix), "--branch", str(args.branch)]


def run(args: argparse.Namespace) -> int:
    """Memory per (mode, questions) in fresh processes, then the interleaved timing; Markdown on stdout."""
    if not (args.package / "decision_config.json").is_file():
        print(f"no state-once package at {args.package}; build one with "
              "`python -m bench.decision_codes build --out DIR --layers N` (DIR/state-once)", file=sys.stderr)
        return 2
    memory = {(m, q): _child([*_common(args), "--what", "memory", "--mode", m, "--questions", str(q)], 1200)
              for q in args.counts for m in MODES}
    timing = _child([*_common(args), "--what", "time", "--rounds", str(args.rounds),
                     "--counts", *map(str, args.counts)], 3600)
    print(f"### decision-codes prefix cache: shared vs tiled ({args.package.name}/{args.graph}, "
          f"{args.prefix}-token prefix, {args.branch}-token branches, {args.threads} threads)\n")
    print("| questions | prefix cache handed to the session, shared / tiled (MiB) | peak RSS growth, shared / "
          "tiled (MiB) | RSS held after, shared / tiled (MiB) | median s, shared / tiled | tiled / shared time "
          "| bits equal |")
    print("|---|---|---|---|---|---|---|")
    for q in args.counts:
        s, t = memory[("shared", q)], memory[("tiled", q)]
        secs = timing["seconds"][str(q)]
        ms, mt = median(secs["shared"]), median(secs["tiled"])
        print(f"| {q} | {s['cache_bytes'] / MIB:.1f} / {t['cache_bytes'] / MIB:.1f} | "
              f"{s['peak_growth_bytes'] / MIB:.1f} / {t['peak_growth_bytes'] / MIB:.1f} | "
              f"{s['held_after_bytes'] / MIB:.1f} / {t['held_after_bytes'] / MIB:.1f} | {ms:.3f} / {mt:.3f} | "
              f"{mt / ms:.2f}x | {timing['identical'][str(q)]} |")
    print(f"\n{args.rounds} interleaved rounds per question count (both modes on one session, alternating "
          "which goes first). Memory: VmHWM - VmRSS over one request in a fresh process warmed with the same "
          "prefix and one branch; held after: VmRSS after the request - before it.")
    return 0


def child_main(args: argparse.Namespace) -> int:
    """``prefix-child``: one measurement, its JSON on the last line of stdout."""
    result = memory_child(args) if args.what == "memory" else time_child(args)
    print(json.dumps(result))
    return 0


def arguments(p: argparse.ArgumentParser, child: bool = False) -> None:
    """The command line of ``prefix`` (and, with ``child``, of ``prefix-child``)."""
    p.add_argument("--package", type=Path, default=CACHE_DIR / PACKAGES["prefix_causal"],
                   help="a state-once decision-codes package (default: bench decision-codes' build)")
    p.add_argument("--graph", default="model.onnx", help="the package's graph file (model.onnx, model.int8.onnx)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=PREFIX_TOKENS)
    p.add_argument("--branch", type=int, default=BRANCH_TOKENS)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--counts", type=int, nargs="+", default=list(QUESTIONS), help="questions per request")
    if child:
        p.add_argument("--what", choices=("memory", "time"), required=True)
        p.add_argument("--mode", choices=MODES, default="shared")
        p.add_argument("--questions", type=int, default=1)
