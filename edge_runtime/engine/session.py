"""ONNX Runtime sessions with the settings that fix a model's numerics and its CPU share."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from . import cpu
from .errors import SessionError

Device = Literal["cpu", "cuda", "auto"]
DEVICES: tuple[str, ...] = ("cpu", "cuda", "auto")

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

# The optimisation level is part of the numerics: BASIC and DISABLE_ALL differ from ALL by up to
# ~2e-6 (docs/reference/feasibility-notes.md A.1), so every session of every model uses this one level.
GRAPH_OPTIMIZATION_LEVEL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
GRAPH_OPTIMIZATION_LEVEL_NAME = "ORT_ENABLE_ALL"
INTER_OP_THREADS = 1
# ORT's session config key for the intra-op pool's spin-wait ("1", the default, spins; "0" sleeps).
ALLOW_SPINNING_KEY = "session.intra_op.allow_spinning"
FORCE_SPINNING_STOP_KEY = "session.force_spinning_stop"

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_CGROUP = Path("/proc/self/cgroup")


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, ORT type string (e.g. 'tensor(int64)') and shape.

    Shape entries are ints for fixed dimensions, strings for named symbolic ones, None for unnamed.
    """

    name: str
    type: str
    shape: tuple[int | str | None, ...]


def cgroup_cpu_limit(cgroup_root: Path = _CGROUP_ROOT, proc_cgroup: Path = _PROC_CGROUP) -> float | None:
    """The CPU quota (in CPUs) of this process's cgroup and its ancestors, or None when unlimited.

    Reads cgroup v2 `cpu.max` ("quota period" or "max period") and cgroup v1
    `cpu.cfs_quota_us`/`cpu.cfs_period_us`; the tightest limit on the path wins.
    """
    limits: list[float] = []
    for directory in _cgroup_dirs(cgroup_root, proc_cgroup):
        limit = _read_cpu_max(directory / "cpu.max")
        if limit is None:
            limit = _read_cfs(directory / "cpu.cfs_quota_us", directory / "cpu.cfs_period_us")
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def _cgroup_dirs(cgroup_root: Path, proc_cgroup: Path) -> list[Path]:
    """Candidate cgroup directories: the process's own, each ancestor, and the mount roots."""
    relative: list[str] = []
    try:
        for line in proc_cgroup.read_text().splitlines():
            # "0::/path" (v2) or "4:cpu,cpuacct:/path" (v1)
            parts = line.split(":", 2)
            if len(parts) == 3 and (parts[1] == "" or "cpu" in parts[1].split(",")):
                relative.append(parts[2])
    except OSError:
        pass
    mounts = [cgroup_root, cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"]
    found: list[Path] = []
    for mount in mounts:
        for rel in relative or ["/"]:
            path = Path(rel.lstrip("/"))
            while True:
                candidate = mount / path
                if candidate not in found and candidate.is_dir():
                    found.append(candidate)
                if path == path.parent:
                    break
                path = path.parent
    return found


def _read_cpu_max(path: Path) -> float | None:
    try:
        fields = path.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read_cfs(quota_path: Path, period_path: Path) -> float | None:
    try:
        quota = int(quota_path.read_text().strip())
        period = int(period_path.read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def default_threads() -> int:
    """Intra-op threads for a model when none are configured: the CPUs this process may use.

    That is the affinity mask (not the host's count), capped by a cgroup CPU quota rounded down,
    because threads beyond the quota are throttled and spin (docs/reference/peer-servers.md §4). At least 1.
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, math.floor(quota))
    return max(1, cpus)


class GraphSession:
    """One ONNX Runtime session and the settings it was built with. Safe to run from any thread."""

    def __init__(self, session: ort.InferenceSession, path: Path, device: str, threads: int,
                 spinning: bool = True, tf32: bool = False, device_id: int | None = None) -> None:
        self.session = session
        self.path = path
        self.device = device
        self.device_id = device_id  # the CUDA device asked for (cuda:N); None: the provider's default
        self.threads = threads
        self.spinning = spinning  # the intra-op threads spin-wait between forwards (ORT's default)
        self.tf32 = tf32  # asked for; CUDA's options below say whether it is on
        self.inputs: dict[str, TensorSpec] = {a.name: _spec(a) for a in session.get_inputs()}
        self.outputs: dict[str, TensorSpec] = {a.name: _spec(a) for a in session.get_outputs()}
        self.input_names: list[str] = list(self.inputs)
        self.output_names: list[str] = list(self.outputs)
        self.providers: list[str] = list(session.get_providers())
        # What every padded feed's sequence width rounds up to (engine/cpu.py ROW_MULTIPLE): this CPU's
        # softmax needs it for batch invariance; CUDA's buckets fix whole shapes instead. Settable,
        # before the family is built, to run a CPU class's padding elsewhere (tests, the x86 proof).
        self.row_multiple = 1 if device == "cuda" else cpu.row_multiple()
        self.arch_class = cpu.arch_class()  # what a CPU self-check compares goldens' classes with
        # Threads by measurement (engine/threads.py): a session per intra-op thread count, and which
        # count each forward's size takes. Counts are proven to give identical outputs first.
        self._by_threads: dict[int, ort.InferenceSession] = {threads: session}
        self._plan: tuple[tuple[int, int], ...] = ()  # (most tokens in a forward, threads), ascending
        self._forced: int | None = None

    def at_threads(self, threads: int) -> ort.InferenceSession:
        """This graph's session with ``threads`` intra-op threads (made once, as this one was)."""
        if threads not in self._by_threads:
            options = session_options(threads, self.spinning)
            self._by_threads[threads] = ort.InferenceSession(str(self.path), sess_options=options,
                                                             providers=self.session.get_providers())
        return self._by_threads[threads]

    @contextmanager
    def forced_threads(self, threads: int) -> Iterator[None]:
        """Every run inside takes the ``threads`` session (measuring, before the model serves)."""
        self.at_threads(threads)
        self._forced = threads
        try:
            yield
        finally:
            self._forced = None

    def use_threads(self, plan: Sequence[tuple[int, int]]) -> None:
        """Serve forwards of at most N tokens with T threads, for each (N, T) of ``plan`` (ascending);
        a larger forward takes the last T. Sessions not in the plan are let go."""
        self._plan = tuple(plan)
        keep = {threads for _, threads in self._plan} | {self.threads}
        self._by_threads = {n: s for n, s in self._by_threads.items() if n in keep}

    def _session_for(self, feeds: Mapping[str, np.ndarray]) -> ort.InferenceSession:
        if self._forced is not None:
            return self._by_threads[self._forced]
        if not self._plan:
            return self.session
        # the first two-dimensional input counts the forward's tokens (ids or mask: rows x length)
        tokens = next((v.size for v in feeds.values() if getattr(v, "ndim", 0) == 2), 0)
        return self._by_threads[planned_threads(self._plan, tokens, self.threads)]

    @property
    def engine_args(self) -> dict[str, Any]:
        """The settings that identify this session's numerics and CPU share (for /v1/models)."""
        return {
            "threads": self.threads,
            "inter_op_threads": INTER_OP_THREADS,
            "graph_optimization_level": GRAPH_OPTIMIZATION_LEVEL_NAME,
            "providers": list(self.providers),
            "row_multiple": self.row_multiple,
            # what each provider runs with (CUDA: use_tf32, the device, the algorithm search)
            "provider_options": {name: dict(opts) for name, opts in self.session.get_provider_options().items()
                                 if name != CPU_PROVIDER},
        }

    def sibling(self, path: Path | str) -> GraphSession:
        """Another graph of the same package, opened as this one was (device, threads, options)."""
        device = f"cuda:{self.device_id}" if self.device == "cuda" and self.device_id is not None else self.device
        return create_session(path, device, self.threads, spinning=self.spinning, tf32=self.tf32)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run the graph on `feeds`; return the requested outputs (all when None) by name."""
        names = list(outputs) if outputs is not None else self.output_names
        values = self._session_for(feeds).run(names, dict(feeds))
        return dict(zip(names, values))

    def bind(self, values: Mapping[str, np.ndarray]) -> BoundInputs:
        """``values`` bound once (on this session's device), for several runs that share them."""
        return BoundInputs(self.session, values, self.device)

    def __repr__(self) -> str:
        return f"GraphSession({str(self.path)!r}, device={self.device!r}, threads={self.threads})"


class BoundInputs:
    """Inputs bound to a session once, through ONNX Runtime's IOBinding; each run binds only the rest.

    On the CPU the bound values are the caller's arrays, not copies (an OrtValue over numpy memory);
    on CUDA they are copied to the device once, not on every run. Not for concurrent runs: one
    binding holds one run's inputs.
    """

    def __init__(self, session: ort.InferenceSession, values: Mapping[str, np.ndarray], device: str) -> None:
        self._session = session
        self._io = session.io_binding()
        # kept referenced: on the CPU the OrtValues point into these arrays
        self._arrays = {name: np.ascontiguousarray(v) for name, v in values.items()}
        self._values = {name: ort.OrtValue.ortvalue_from_numpy(a, device, 0) for name, a in self._arrays.items()}
        for name, value in self._values.items():
            self._io.bind_ortvalue_input(name, value)

    @property
    def nbytes(self) -> int:
        """Bytes of the bound values (what every run shares)."""
        return sum(a.nbytes for a in self._arrays.values())

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        """Run the graph on the bound values and ``feeds``; return ``outputs`` by name, on the CPU."""
        for name, value in feeds.items():
            self._io.bind_cpu_input(name, np.ascontiguousarray(value))
        self._io.clear_binding_outputs()
        for name in outputs:
            self._io.bind_output(name)  # ONNX Runtime allocates each output (on the CPU)
        self._session.run_with_iobinding(self._io)
        return dict(zip(outputs, self._io.copy_outputs_to_cpu()))


def planned_threads(plan: Sequence[tuple[int, int]], tokens: int, default: int) -> int:
    """The intra-op threads a thread plan ((most tokens, threads) pairs, ascending) gives a forward of
    ``tokens``: the first step that holds it, the last step's past them all; ``default`` without a plan."""
    if not plan:
        return default
    return next((threads for most, threads in plan if tokens <= most), plan[-1][1])


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int | str) else None for d in (arg.shape or ()))
    return TensorSpec(arg.name, arg.type, shape)


def session_options(threads: int, spinning: bool = True) -> ort.SessionOptions:
    """The settings every session runs with: ``threads`` intra-op threads, one inter-op thread,
    sequential execution, the pinned optimisation level, no memory patterns; the intra-op threads spin
    while a forward runs and stop when it ends (``spinning`` False: they never spin)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = INTER_OP_THREADS
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = GRAPH_OPTIMIZATION_LEVEL
    # Memory patterns keep a plan per input shape; with request-sized batches that is ~30 MB per
    # new shape and no speed gain (MiniLM, 2 threads: same latency, peak RSS 256 -> 234 MB).
    options.enable_mem_pattern = False
    if not spinning:
        options.add_session_config_entry(ALLOW_SPINNING_KEY, "0")
    else:
        # spin between a forward's kernels, never after it: a model's threads spinning on after their
        # forward took the cores from other models' forwards (a bundle of six specialists on 2 vCPUs:
        # 293 ms, 238-246 with this; MiniLM int8 at batch 1 pays ~0.15 ms to wake them)
        options.add_session_config_entry(FORCE_SPINNING_STOP_KEY, "1")
    return options


def cuda_available() -> bool:
    """Whether this onnxruntime build offers the CUDA provider (whether it loads is known per session)."""
    return CUDA_PROVIDER in ort.get_available_providers()


def _split_device(device: str) -> tuple[str, int | None]:
    """``cuda:N`` -> ("cuda", N); any other device -> (device, None)."""
    kind, colon, index = device.partition(":")
    if colon and kind == "cuda" and index.isdigit():
        return kind, int(index)
    return device, None


def create_session(path: Path | str, device: str = "cpu", threads: int | None = None,
                   spinning: bool = True, tf32: bool = False) -> GraphSession:
    """Load the graph at `path` on `device` ("cpu", "cuda", "cuda:N" or "auto") with `threads` intra-op threads.

    threads None means default_threads(). Execution is sequential with one inter-op thread and the
    optimisation level pinned to ORT_ENABLE_ALL. spinning False makes the intra-op threads sleep as
    soon as a forward ends instead of spin-waiting for the next (same numerics; see models.yaml
    `spinning`). "cuda" raises SessionError when the CUDA provider is missing or does not load;
    "auto" uses CUDA when it loads and the CPU otherwise. On CUDA, fp32 matmuls run in full fp32
    unless ``tf32`` (ONNX Runtime's default turns TF32 on, which moved tiny fixtures' goldens by up to
    8.8e-3; with it off they were within 4.3e-6 of the CPU, as fast).
    """
    path = Path(path)
    asked = device
    device, device_id = _split_device(device)
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} or cuda:N, not {asked!r}")
    if threads is None:
        threads = default_threads()
    if threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    if not path.is_file():
        raise SessionError(f"graph file not found: {path}")

    available = ort.get_available_providers()
    want_cuda = device == "cuda" or (device == "auto" and CUDA_PROVIDER in available)
    if device == "cuda" and CUDA_PROVIDER not in available:
        raise SessionError(
            f"device {asked!r} asked for {path.name}, but this onnxruntime build has no {CUDA_PROVIDER} "
            f"(available: {', '.join(available)}); install onnxruntime-gpu or use device 'cpu'"
        )
    cuda_options = {"use_tf32": "1" if tf32 else "0"}
    if device_id is not None:
        cuda_options["device_id"] = str(device_id)
    cuda = (CUDA_PROVIDER, cuda_options)
    providers: list[Any] = [cuda, CPU_PROVIDER] if want_cuda else [CPU_PROVIDER]

    options = session_options(threads, spinning)
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
        raise SessionError(f"cannot load {path}: {exc}") from exc

    active = session.get_providers()
    on_cuda = CUDA_PROVIDER in active
    if device == "cuda" and not on_cuda:
        # ORT falls back to the CPU silently when the CUDA libraries fail to load.
        raise SessionError(
            f"{CUDA_PROVIDER} did not load for {path.name} (active: {', '.join(active)}); "
            "check the CUDA and cuDNN libraries onnxruntime-gpu needs"
        )
    return GraphSession(session, path, "cuda" if on_cuda else "cpu", threads, spinning, tf32,
                        device_id if on_cuda else None)
