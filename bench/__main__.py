"""`python -m bench all | embeddings | overhead | longinput | decisions | sparrow | vela2 | decision-vision |
decision3 | decision-codes | memory | managed | scaling | task-heads [--threads 2] [--rounds 7] [--record]`,
`python -m bench swap [--seconds S] [--rate R] [--soak N] [--record]` (bench/swap.py: its own options), and
`python -m bench gpu [--device cuda|cpu] [--record]` (bench/gpu.py: MiniLM's batching modes against PyTorch on
one device).

`decisions` runs the sparrow-nano comparison (`sparrow` alone), then `vela2` (the Vela 2.0 package at the 0.3B's
shape against PyTorch), `decision-vision` (image and video requests at Qwen3-VL-2B's shape
against Transformers) and `decision3` (a Decision 3.0 package at d3-edge's shape against Transformers 5);
`vela2`, `decision-vision` and `decision3` alone need none of the default packages. `scaling`
(intra-op spinning's cost, and the autoscaling target with its pending-jobs trace) runs only by name.
`managed` times repeated and new calls over the Router's socket and over TCP (the result cache). `task-heads`
(by name only) times the Router's six Vela 1.0 specialists at their shape against Transformers."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    decision3,
    decision_codes,
    decision_vision,
    decisions,
    embeddings,
    longinput,
    managed,
    memory,
    overhead,
    scaling,
    task_heads,
    vela2,
)
from bench.harness.lab import PACKAGE_NAME, Lab, Settings
from bench.harness.report import BENCHMARKS_DOC, ROOT, ForeignLoad, Table, conditions, record, render_run

CONVERT_TIMEOUT_S = 900


def decisions_and_vela2(lab: Lab) -> list[Table]:
    """The decisions comparisons: sparrow-nano against its own server, vela2 against PyTorch, then
    decision-vision (Qwen3-VL-2B's shape) and decision3 (d3-edge's shape) against Transformers."""
    return decisions.run(lab) + vela2.run(lab) + decision_vision.run(lab) + decision3.run(lab)


COMPARISONS: dict[str, Callable[[Lab], list[Table]]] = {
    "embeddings": embeddings.run,
    "overhead": overhead.run,
    "longinput": longinput.run,
    "decisions": decisions_and_vela2,
    "sparrow": decisions.run,
    "vela2": vela2.run,
    "decision-vision": decision_vision.run,
    "decision3": decision3.run,
    "decision-codes": decision_codes.run,
    "memory": memory.run,
    "managed": managed.run,
    "scaling": scaling.run,
    "task-heads": task_heads.run,
}
#: Comparisons another one already runs (so `all` leaves them out).
INCLUDED = {"sparrow", "vela2", "decision-vision", "decision3"}  # in decisions
#: Comparisons `all` leaves out: they run by name only (scaling takes minutes of sustained load; task-heads
#: builds six 307M packages once and holds thirteen models (six int8, one fp32, six in Transformers) while it runs).
BY_NAME_ONLY = {"scaling", "task-heads"}
#: Comparisons that build their own packages and need none of the default ones.
STANDALONE = {"vela2", "decision-vision", "decision3", "task-heads"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("comparison", choices=["all", *COMPARISONS])
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for every contestant (2)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    parser.add_argument("--packages", type=Path, default=ROOT / "models",
                        help="where `python -m converters default --out DIR` wrote the packages (models/); "
                             "converted there first when missing")
    parser.add_argument("--record", action="store_true",
                        help=f"append the results to {BENCHMARKS_DOC.relative_to(ROOT)}")
    parser.add_argument("--doc", type=Path, default=BENCHMARKS_DOC, help=argparse.SUPPRESS)
    return parser


def _shown(packages: Path) -> str:
    """The packages directory as a record names it: relative to the checkout when inside it (a record
    names no path of the machine it ran on)."""
    path = packages.resolve()
    return f"{path.relative_to(ROOT)}/" if path.is_relative_to(ROOT) else path.name + "/"


def convert_defaults(packages: Path) -> bool:
    """Build the default packages as `make serve` does, in a subprocess (converters import torch)."""
    command = [sys.executable, "-m", "converters", "default", "--out", str(packages)]
    print(f"no package at {packages}; running {' '.join(command[1:])}", flush=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(command, cwd=ROOT, env=env, timeout=CONVERT_TIMEOUT_S)
    if done.returncode != 0 or not (packages / PACKAGE_NAME / "card.json").is_file():
        print(f"error: `python -m converters default --out {packages}` failed ({done.returncode})", file=sys.stderr)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["swap"]:  # its own options (load rate, soak): bench/swap.py parses them
        from bench import swap

        return swap.main(argv[1:])
    if argv[:1] == ["gpu"]:  # its own options (the device): bench/gpu.py parses them
        from bench import gpu

        return gpu.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.threads < 1 or args.rounds < 1:
        print("error: --threads and --rounds must be at least 1", file=sys.stderr)
        return 2
    settings = Settings(threads=args.threads, rounds=args.rounds, packages=args.packages, record=args.record)
    names = ([n for n in COMPARISONS if n not in INCLUDED | BY_NAME_ONLY] if args.comparison == "all"
             else [args.comparison])
    needs_minilm = bool(set(names) - STANDALONE)
    needs_sparrow = {"decisions", "memory", "longinput", "managed"} & set(names)
    defaults = ([settings.package] if needs_minilm else []) + \
        ([settings.packages / decisions.PACKAGE] if needs_sparrow else [])
    if not all((p / "card.json").is_file() for p in defaults) and not convert_defaults(args.packages):
        return 2
    conds = conditions(args.threads, args.rounds, {"packages": _shown(settings.packages)})
    print("\n".join(f"{k}: {v}" for k, v in conds.items()), flush=True)
    lab = Lab(settings)
    foreign = ForeignLoad()
    tables: list[Table] = []
    started = time.perf_counter()
    try:
        for name in names:
            t0 = time.perf_counter()
            for table in COMPARISONS[name](lab):
                tables.append(table)
                print("\n" + table.markdown(), flush=True)
            print(f"\n[{name}: {time.perf_counter() - t0:.0f} s]", flush=True)
    except BaseException:
        lab.stop_all()
        print(f"\nserver and worker logs: {lab.log_dir}", file=sys.stderr)
        raise
    lab.stop_all()
    shutil.rmtree(lab.log_dir, ignore_errors=True)  # kept only when something failed
    elapsed = time.perf_counter() - started
    conds["wall time"] = f"{elapsed:.0f} s"
    # Other work on a shared machine shows here: a load well above the cores means noisy numbers.
    conds["load average at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    conds["CPU used by other processes during the run"] = foreign.describe()
    if args.record:
        record(render_run(f"python -m bench {args.comparison}", conds, tables), args.doc)
        print(f"\nrecorded in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
