"""`python -m bench.int8_kernels`: where MiniLM's fp32 and exact-int8 forwards spend their kernel time, how
many kernels a forward runs, and how close the integer matmuls run to this CPU's int8 limit.

For each graph (the package's fp32 `model.onnx`, its shipped exact `model.int8.onnx`, with `--rebuild`
the int8 graph this checkout's converter builds from the same fp32 with CALIBRATED_RECIPE and the
converter's own calibration rows, with `--unfolded` the same without folding the attention's shape
arithmetic, and any
`--graph`), at batch `--batch` (32 by default) of real sentences of one token length (14 by default, [CLS] and [SEP]
included; the STS Benchmark dev split with `--stsb-dev`, else the train-split sentences the card's
agreement is measured on) and at batch 1 (the first of them), single thread and 2 threads, it runs
ONNX Runtime's profiler over `--calls` forwards after warm-up and reports:

- the kernels one forward runs (nodes with a profiled `kernel_time` event, after ORT_ENABLE_ALL);
- each op type's share of kernel time (the profiler's per-node `kernel_time` events, summed);
- the MatMulIntegerToFloat share;
- the integer MACs those matmuls did (M x K x N from each event's own shapes), the rate achieved
  while they ran (MACs / their kernel time), per thread and cycle, against the peak u8 x s8 MAC rate of
  the instruction set ONNX Runtime's MLAS picks on this CPU (read from /proc/cpuinfo; the assumption
  per instruction set and the clock source are printed with the figures).

`--rounds N` also times the graphs without the profiler, interleaved (every round runs each graph in
turn, rotating the order), and reports median ms and ratios to the first int8 graph: this machine is
shared, so only ratios measured side by side mean anything. The STSb file is read from disk (dev split
only); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from bench.harness.report import conditions
from bench.int8_quality import calibration_rows, read_sts
from converters.quantize import CALIBRATED_RECIPE, quantize_int8_exact, real_sentences
from edge_runtime.engine.cpu import all_flags, cpu_model
from edge_runtime.engine.session import session_options

INTEGER_MATMUL = "MatMulIntegerToFloat"


@dataclass(frozen=True)
class Isa:
    """An instruction set MLAS may run u8 x s8 GEMMs with, and its assumed peak."""

    name: str
    flags: tuple[str, ...]  # every one must be in /proc/cpuinfo's flags
    macs_per_cycle: int  # u8 x s8 multiply-accumulates per cycle per core, assumed
    assumption: str


#: MLAS's x64 dispatch order for U8S8 GEMMs (onnxruntime/core/mlas/lib/platform.cpp: AVX2, then the
#: AVX-VNNI kernel, then AVX-512 core (F + BW + DQ + VL), then AVX-512 VNNI, then AMX when the OS grants
#: the tiles; each later one the CPU has replaces the one before), with the peak MAC rate assumed for
#: each. The multiply throughput per core is the assumption; the reader can rescale with the MACs per
#: cycle per thread that the bench prints.
ISAS: tuple[Isa, ...] = (
    Isa("AVX2 (vpmaddubsw + vpmaddwd)", ("avx2",), 32,
        "32 u8 x s8 products per ymm vpmaddubsw, which needs a vpmaddwd to widen on the same two multiply "
        "ports: 32 MACs/cycle"),
    Isa("AVX-VNNI (vpdpbusd ymm)", ("avx2", "avx_vnni"), 64,
        "32 MACs per ymm vpdpbusd, 2 per cycle: 64 MACs/cycle"),
    Isa("AVX-512 core (vpmaddubsw zmm)", ("avx512f", "avx512bw", "avx512dq", "avx512vl"), 64,
        "64 products per zmm vpmaddubsw plus a vpmaddwd, 2 multiply ports: 64 MACs/cycle"),
    Isa("AVX-512 VNNI (vpdpbusd zmm)", ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"), 128,
        "64 MACs per zmm vpdpbusd, 2 per cycle (Intel since Ice Lake server; AMD Zen 5's four 512-bit "
        "pipes, two of which multiply; Zen 4 splits zmm and reaches half): 128 MACs/cycle"),
    Isa("AMX (tdpbusd)", ("amx_int8", "amx_tile"), 1024,
        "a 16x64 by 64x16 u8 x s8 tile product (16,384 MACs) every 16 cycles: 1,024 MACs/cycle (MLAS falls "
        "back to its AVX-512 VNNI kernel for small GEMMs)"),
)


def picked_isa(flags: set[str]) -> Isa | None:
    """The instruction set MLAS's dispatch picks for U8S8 GEMMs given these flags (None: not x86 AVX2)."""
    found = None
    for isa in ISAS:
        if all(f in flags for f in isa.flags):
            found = isa
    return found


#: A chain of dependent 64-bit adds (one cycle each on every x86 core since the P6): 4 per iteration, so
#: adds per second is the clock the core actually ran at, boost included.
CLOCK_PROBE_C = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
  unsigned long x = 0;
  long n = 200000000;
  for (int rep = 0; rep < 5; rep++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
      __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.1f\n", 4.0 * n / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9) / 1e6);
  }
  return (int)(x & 1);
}
"""


def measured_clock_mhz() -> float | None:
    """The core clock measured by CLOCK_PROBE_C (the fastest of 5 runs), or None without an x86 C compiler."""
    import platform
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or platform.machine() not in ("x86_64", "AMD64"):
        return None
    with tempfile.TemporaryDirectory(prefix="int8-clock-") as tmp:
        src, exe = Path(tmp) / "clock.c", Path(tmp) / "clock"
        src.write_text(CLOCK_PROBE_C)
        try:
            subprocess.run([cc, "-O2", str(src), "-o", str(exe)], check=True, capture_output=True, timeout=60)
            out = subprocess.run([str(exe)], check=False, capture_output=True, text=True, timeout=120).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    values = [float(v) for v in out.split()]
    return max(values) if values else None


def clock_mhz(cpuinfo: str) -> tuple[float, str]:
    """The core clock assumed for the peak, and where it came from: measured (a dependent add chain),
    else cpufreq's maximum, else /proc/cpuinfo's 'cpu MHz'."""
    measured = measured_clock_mhz()
    nominal = [float(line.partition(":")[2]) for line in cpuinfo.splitlines() if line.lower().startswith("cpu mhz")]
    if measured:
        return measured, (f"measured: a chain of dependent adds, one per cycle, fastest of 5 runs "
                          f"(/proc/cpuinfo says {max(nominal):.0f} MHz, the nominal clock)" if nominal else
                          "measured: a chain of dependent adds, one per cycle, fastest of 5 runs")
    path = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(path.read_text().strip()) / 1000, f"{path} (maximum boost clock)"
    except (OSError, ValueError):
        pass
    if not nominal:
        raise SystemExit("no clock: no C compiler, no cpufreq, no 'cpu MHz' in /proc/cpuinfo")
    return max(nominal), ("/proc/cpuinfo 'cpu MHz' (on a VM the nominal clock the hypervisor reports; boost may "
                          "be higher, so the share of peak is an upper bound)")


def sentence_batch(package: Path, stsb_dev: Path | None, tokens: int, batch: int) -> dict[str, np.ndarray]:
    """``batch`` distinct sentences of exactly ``tokens`` tokens ([CLS] and [SEP] included), in file order:
    the STS Benchmark dev split's when ``stsb_dev`` is given, else the card's corpus (STS train)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts = list(dict.fromkeys(s for p in read_sts(stsb_dev) for s in p[:2])) if stsb_dev else real_sentences()
    ids = [e.ids for e in tok.encode_batch(texts) if len(e.ids) == tokens][:batch]
    if len(ids) < batch:
        raise SystemExit(f"{stsb_dev or 'the corpus'}: only {len(ids)} sentences of {tokens} tokens; need {batch}")
    a = np.array(ids, np.int64)
    return {"input_ids": a, "attention_mask": np.ones_like(a), "token_type_ids": np.zeros_like(a)}


def session(graph: Path, threads: int, profile_prefix: str | None = None) -> ort.InferenceSession:
    """A CPU session with the server's pinned settings (edge_runtime.engine.session), profiling optional."""
    options = session_options(threads)
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


def _macs(args: dict[str, Any]) -> int:
    """M x K x N of one MatMulIntegerToFloat profiler event: A [..., K] is its first input, N the output's
    last axis (the profiler leaves out a prepacked constant weight's shape)."""
    a = next(iter(args["input_type_shape"][0].values()))
    out = next(iter(args["output_type_shape"][0].values()))
    return int(np.prod(a, dtype=np.int64)) * int(out[-1])


def glue_part(event: str) -> str | None:
    """Which step of the converter's per-token quantization a profiled node is (the rewriter names its
    nodes ``er_q/<activation or matmul>/<step>``: Smooth, ReduceMax, ReduceMin, Neg, Max, Scale, ScaleShape,
    ZeroPoints, QuantizeLinear, TokenScale, Bias), or None for the graph's own nodes and the GEMM."""
    name = event.removesuffix("_kernel_time")
    if not name.startswith("er_q/"):
        return None
    step = name.rsplit("/", 1)[-1]
    return None if step == INTEGER_MATMUL else step


def profile(graph: Path, feeds: dict[str, np.ndarray], threads: int, calls: int, warmup: int = 3) -> dict[str, Any]:
    """Kernels per forward, kernel time per op type of one forward (each node's median over ``calls``
    profiled forwards after ``warmup``), and the integer MACs of one forward."""
    with tempfile.TemporaryDirectory(prefix="int8-kernels-") as tmp:
        s = session(graph, threads, str(Path(tmp) / "p"))
        for _ in range(warmup + calls):
            s.run(None, feeds)
        events = json.loads(Path(s.end_profiling()).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    if len(runs) < warmup + calls:
        raise RuntimeError(f"profiler recorded {len(runs)} runs, expected {warmup + calls}")
    start = runs[warmup]
    durations: dict[str, list[float]] = defaultdict(list)
    op_of: dict[str, str] = {}
    macs_of: dict[str, int] = {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < start:
            continue
        durations[e["name"]].append(e["dur"])
        op_of[e["name"]] = e["args"]["op_name"]
        if op_of[e["name"]] == INTEGER_MATMUL:
            macs_of[e["name"]] = _macs(e["args"])
    # each node's median over the calls: a call preempted by the other tenants' work moves a median
    # far less than a sum (this VM is shared)
    per_op: dict[str, float] = defaultdict(float)
    glue: dict[str, float] = defaultdict(float)
    for name, durs in durations.items():
        per_op[op_of[name]] += statistics.median(durs)
        part = glue_part(name)
        if part:
            glue[part] += statistics.median(durs)
    total = sum(per_op.values())
    return {"kernels_per_call": len(durations), "kernel_us_per_call": total,
            "share": {k: v / total for k, v in per_op.items()},
            "glue_share": {k: v / total for k, v in glue.items()},
            "integer_macs_per_call": sum(macs_of.values()), "integer_us_per_call": per_op.get(INTEGER_MATMUL, 0.0)}


def ceiling_graph(path: Path, k: int = 384, n: int = 1536) -> Path:
    """A lone MatMulIntegerToFloat (uint8 [M, K] x int8 [K, N], the model's FFN shape) written to ``path``."""
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-64, 65, (k, n)).astype(np.int8), "w"),
             numpy_helper.from_array(np.array(1.0, np.float32), "a_scale"),
             numpy_helper.from_array(np.full(n, 0.01, np.float32), "w_scale"),
             numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    node = helper.make_node(INTEGER_MATMUL, ["a", "w", "a_scale", "w_scale", "zp"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "ceiling", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]),
         str(path))
    return path


def kernel_ceiling(graph: Path, threads: int, m: int = 1024, calls: int = 30) -> float:
    """The best MAC rate (MACs/s) ONNX Runtime's integer GEMM reaches here on a large uint8 x int8 product:
    the practical ceiling, measured rather than assumed (the fastest of ``calls``)."""
    s = session(graph, threads)
    a = np.random.default_rng(1).integers(1, 256, (m, 384)).astype(np.uint8)
    s.run(None, {"a": a})
    best = min(_timed(s, {"a": a}) for _ in range(calls))
    return m * 384 * 1536 / best


def _timed(s: ort.InferenceSession, feeds: dict[str, np.ndarray]) -> float:
    t = time.perf_counter()
    s.run(None, feeds)
    return time.perf_counter() - t


def interleaved(graphs: dict[str, Path], feeds: dict[str, np.ndarray], threads: int, rounds: int,
                calls: int) -> dict[str, dict[str, float]]:
    """Median forward wall ms and CPU ms (this process's, all its threads) of each graph, rounds
    interleaved with the order rotating, the range of the per-round wall medians, and the best round's
    CPU median (the least disturbed estimate: another tenant's work only ever adds time).

    With one intra-op thread the CPU time is the least load-sensitive figure on a shared machine (time
    the other tenants take is not counted); with more, it counts spin-waiting too."""
    sessions = {k: session(p, threads) for k, p in graphs.items()}
    for s in sessions.values():
        for _ in range(3):
            s.run(None, feeds)
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    rounds_of: dict[str, list[float]] = {k: [] for k in sessions}
    cpu_rounds: dict[str, list[float]] = {k: [] for k in sessions}
    keys = list(sessions)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            mine, mine_cpu = [], []
            for _ in range(calls):
                t, c = time.perf_counter(), time.process_time()
                sessions[k].run(None, feeds)
                mine_cpu.append((time.process_time() - c) * 1000)
                mine.append((time.perf_counter() - t) * 1000)
            wall[k] += mine
            cpu[k] += mine_cpu
            rounds_of[k].append(statistics.median(mine))
            cpu_rounds[k].append(statistics.median(mine_cpu))
    return {k: {"median_ms": statistics.median(v), "median_cpu_ms": statistics.median(cpu[k]),
                "round_min_ms": min(rounds_of[k]), "round_max_ms": max(rounds_of[k]),
                "best_round_cpu_ms": min(cpu_rounds[k])} for k, v in wall.items()}


def _top(share: dict[str, float], n: int = 9) -> str:
    items = sorted(share.items(), key=lambda kv: -kv[1])
    head = ", ".join(f"{k} {v:.1%}" for k, v in items[:n])
    rest = sum(v for _, v in items[n:])
    return head + (f", other {rest:.1%}" if rest else "")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Profile (and optionally time) every graph at every batch and thread count; print as it goes."""
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    flags = all_flags(cpuinfo)
    isa = picked_isa(flags)
    mhz, clock_source = clock_mhz(cpuinfo)
    int8_flags = [f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx_vnni_int8",
                              "amx_tile", "amx_int8") if f in flags]
    print(f"CPU: {cpu_model(cpuinfo)}; int8-relevant flags: {', '.join(int8_flags) or 'none'}; "
          f"onnxruntime {ort.__version__}")
    print(f"MLAS U8S8 kernel assumed (its x64 dispatch order over these flags): "
          f"{isa.name if isa else 'none known'}")
    if isa:
        print(f"peak assumption: {isa.assumption}; clock {mhz:.0f} MHz from {clock_source}")
    graphs = {"fp32": args.package / "model.onnx", "int8 (package)": args.package / "model.int8.onnx"}
    for extra in args.graph:
        name, _, path = extra.partition("=")
        graphs[name] = Path(path)
    results: dict[str, Any] = {"conditions": conditions(2, args.rounds), "cpu": cpu_model(cpuinfo),
                               "int8_flags": int8_flags, "isa": isa.name if isa else None,
                               "peak_macs_per_cycle": isa.macs_per_cycle if isa else None,
                               "clock_mhz": mhz, "clock_source": clock_source, "runs": []}
    with tempfile.TemporaryDirectory(prefix="int8-kernels-") as tmp:
        rebuilt = {"int8 (this checkout)": CALIBRATED_RECIPE} if args.rebuild else {}
        if args.unfolded:
            rebuilt["int8 (this checkout, unfolded)"] = dataclasses.replace(CALIBRATED_RECIPE, fold_attention=False)
        for i, (name, recipe) in enumerate(rebuilt.items()):
            graphs[name] = quantize_int8_exact(graphs["fp32"], Path(tmp) / f"rebuilt{i}.int8.onnx", recipe,
                                               calibration_rows(args.package))
        ceiling_path = ceiling_graph(Path(tmp) / "ceiling.onnx")
        ceilings = {t: kernel_ceiling(ceiling_path, t) for t in args.threads}
        for t, c in ceilings.items():
            print(f"ceiling: a lone {INTEGER_MATMUL} [1024, 384] x [384, 1536], {t} thread(s): {c / 1e9:.1f} G MAC/s"
                  + (f" = {c / (t * mhz * 1e6):.1f} MACs/cycle/thread at {mhz:.0f} MHz" if isa else ""), flush=True)
        results["ceiling_macs_per_s"] = ceilings
        # the inputs the graphs take (a ModernBERT export has no token_type_ids)
        names = [i.name for i in onnx.load(str(graphs["fp32"]), load_external_data=False).graph.input]
        many = {k: v for k, v in sentence_batch(args.package, args.stsb_dev, args.tokens, args.batch).items()
                if k in names}
        one = {k: v[:1] for k, v in many.items()}
        for batch_name, feeds in ((f"batch {args.batch}", many), ("batch 1", one)):
            for threads in args.threads:
                for name, graph in graphs.items():
                    p = profile(graph, feeds, threads, args.calls)
                    row: dict[str, Any] = {"graph": name, "batch": batch_name, "threads": threads, **p}
                    line = (f"{batch_name} x {args.tokens} tokens, {threads} thread(s), {name}: "
                            f"{p['kernels_per_call']} kernels, kernel time {p['kernel_us_per_call'] / 1000:.2f} "
                            f"ms/forward; {_top(p['share'])}")
                    if p["integer_us_per_call"] and isa:
                        rate = p["integer_macs_per_call"] / (p["integer_us_per_call"] * 1e-6)
                        per_cycle = rate / (threads * mhz * 1e6)
                        row.update(macs_per_s=rate, macs_per_cycle_per_thread=per_cycle,
                                   share_of_peak=per_cycle / isa.macs_per_cycle,
                                   share_of_ceiling=rate / ceilings[threads])
                        line += (f"\n    {INTEGER_MATMUL}: {p['share'].get(INTEGER_MATMUL, 0):.1%} of kernel "
                                 f"time; {p['integer_macs_per_call'] / 1e6:.1f} M MACs in "
                                 f"{p['integer_us_per_call'] / 1000:.2f} ms = {rate / 1e9:.1f} G MAC/s, "
                                 f"{per_cycle:.1f} MACs/cycle/thread at {mhz:.0f} MHz = "
                                 f"{per_cycle / isa.macs_per_cycle:.0%} of the assumed {isa.macs_per_cycle}; "
                                 f"{rate / ceilings[threads]:.0%} of the measured ceiling")
                    if p["glue_share"]:
                        line += (f"\n    per-token glue {sum(p['glue_share'].values()):.1%} of kernel time: "
                                 f"{_top(p['glue_share'], 12)}")
                    print(line, flush=True)
                    results["runs"].append(row)
                if args.rounds:
                    ms = interleaved(graphs, feeds, threads, args.rounds, args.timed_calls)
                    base = ms[args.baseline] if args.baseline in ms else ms["int8 (package)"]
                    for k, v in ms.items():
                        print(f"  timed, {batch_name}, {threads} thread(s), {k}: wall median {v['median_ms']:.2f} ms "
                              f"(rounds {v['round_min_ms']:.2f}-{v['round_max_ms']:.2f}), "
                              f"{args.baseline}/this {base['median_ms'] / v['median_ms']:.3f}x; CPU median "
                              f"{v['median_cpu_ms']:.2f} ms, {args.baseline}/this "
                              f"{base['median_cpu_ms'] / v['median_cpu_ms']:.3f}x; best round's CPU "
                              f"{v['best_round_cpu_ms']:.2f} ms, "
                              f"{base['best_round_cpu_ms'] / v['best_round_cpu_ms']:.3f}x", flush=True)
                    results.setdefault("timed", []).append({"batch": batch_name, "threads": threads, "ms": ms})
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.int8_kernels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stsb-dev", type=Path,
                        help="the STS Benchmark dev split (sts-dev.csv); default: the card's corpus (STS train)")
    parser.add_argument("--package", type=Path, default=Path("models/minilm-embedding"))
    parser.add_argument("--graph", action="append", default=[], metavar="NAME=PATH",
                        help="another graph of the same inputs to profile beside the package's")
    parser.add_argument("--rebuild", action="store_true",
                        help="also profile the int8 graph this checkout's converter builds (CALIBRATED_RECIPE)")
    parser.add_argument("--unfolded", action="store_true",
                        help="also profile that graph built without folding the attention's shape arithmetic")
    parser.add_argument("--tokens", type=int, default=14, help="token length of the dev sentences batched")
    parser.add_argument("--batch", type=int, default=32, help="sentences in the batched forward (and batch 1)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--calls", type=int, default=20, help="profiled forwards per graph and setting")
    parser.add_argument("--rounds", type=int, default=0, help="interleaved timing rounds (0: profile only)")
    parser.add_argument("--timed-calls", type=int, default=10, help="timed forwards per graph per round")
    parser.add_argument("--baseline", default="int8 (package)", help="the graph the timed ratios divide")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if not (args.package / "model.int8.onnx").is_file():
        raise SystemExit(f"{args.package}: no model.int8.onnx (convert the default packages first)")
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
