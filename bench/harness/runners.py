"""The harness's handles on its contestants, all with one interface: time(texts, n) and embed(texts).

HttpContestant times our server from this process (client wall time, JSON included); WorkerContestant
drives a `python -m bench.contestant` subprocess that times its library in-process.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.harness.clients import LeanClient
from bench.harness.report import ROOT
from bench.harness.server import ServerProcess
from bench.harness.stats import timed

#: Every torch or converter subprocess runs with these: nothing is downloaded, and the tokenizers
#: library keeps to one thread beside the contestants' own pools.
OFFLINE_ENV: dict[str, str] = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def offline_env(**extra: str) -> dict[str, str]:
    """A subprocess's environment: this one with OFFLINE_ENV and ``extra`` over it."""
    return {**os.environ, **OFFLINE_ENV, **extra}


def stay_offline() -> None:
    """In a worker or build process: OFFLINE_ENV wherever whoever started it set nothing else."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)

WORKER_READY_TIMEOUT_S = 300.0


class Contestant(Protocol):
    label: str

    def time(self, texts: list[str], n: int) -> list[float]:
        """n timed calls on the same texts, seconds each."""
        ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """L2-normalised float32 embeddings, one row per text."""
        ...


def decode_embeddings(body: dict[str, Any], encoding_format: str) -> np.ndarray:
    """The vectors of an OpenAI-shaped embeddings response; raises on an item error."""
    rows = []
    for item in sorted(body["data"], key=lambda d: d["index"]):
        if item.get("embedding") is None:
            raise RuntimeError(f"item {item.get('index')} failed: {item.get('error')}")
        if encoding_format == "base64":
            rows.append(np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4"))
        else:
            rows.append(np.asarray(item["embedding"], dtype=np.float32))
    return np.stack(rows)


class HttpContestant:
    """Our server over HTTP; each timed call encodes the request, sends it and decodes the vectors.

    ``lean``: through LeanClient (bench/harness/clients.py) instead of http.client, whose header parsing
    alone costs 0.1-0.3 ms a call: what the server costs a lean caller such as the Router's Go client.
    """

    def __init__(self, label: str, server: ServerProcess, encoding_format: str = "float", lean: bool = False) -> None:
        self.label = label
        self.server = server
        self.encoding_format = encoding_format
        self.lean = LeanClient(server.port) if lean else None

    def _call(self, texts: list[str]) -> np.ndarray:
        if self.lean is not None:
            body = json.dumps(self.server.embeddings_payload(texts, self.encoding_format)).encode()
            status, raw = self.lean.post("/v1/embeddings", body)
            if status != 200:
                raise RuntimeError(f"{self.label}: HTTP {status}: {raw[:500]!r}")
            return decode_embeddings(json.loads(raw), self.encoding_format)
        resp = self.server.embeddings(texts, self.encoding_format)
        if resp.status != 200:
            raise RuntimeError(f"{self.label}: HTTP {resp.status}: {resp.body[:500]!r}")
        return decode_embeddings(resp.json(), self.encoding_format)

    def time(self, texts: list[str], n: int) -> list[float]:
        return timed(lambda: self._call(texts), n)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._call(texts)


class WorkerProcess:
    """`python -m MODULE ARGS` in its own process, spoken to in JSON lines over pipes (a ready line first)."""

    def __init__(self, label: str, module: str, args: list[str], threads: int, log_path: Path,
                 python: Path | None = None) -> None:
        """``python`` runs it (default: this interpreter; the Transformers 5 contestants run in .venv-ref)."""
        self.label = label
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - the child process writes it until stop()
        # The OpenMP/MKL variables cap torch's pools before torch reads them; set_num_threads repeats it.
        env = offline_env(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([str(python or sys.executable), "-m", module, *args, "--threads", str(threads)],
                                     cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, encoding="utf-8")
        self.load_s: float | None = None

    def wait_ready(self, timeout: float = WORKER_READY_TIMEOUT_S) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"{self.label}: not loaded after {timeout:.0f}s:\n{self.log_tail()}")
        self.load_s = float(self._reply()["load_s"])

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"{self.label}: worker exited with {self.proc.returncode}:\n{self.log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.label}: {reply['error']}")
        return reply

    def _ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


Answer = Callable[[dict[str, Any]], dict[str, Any]]


def serve_worker(load: Callable[[], Answer]) -> int:
    """The worker's side of WorkerProcess: load, write the ready line, then answer JSON lines until quit.

    ``{"op": "answer", "body": ...}`` returns ``load()``'s answer; ``{"op": "time", "body": ..., "n": N}``
    returns ``{"seconds": [...]}`` of N timed answers. The protocol keeps a private copy of stdout and fd 1
    then points at stderr, so that whatever a library prints goes to the log and not into the protocol.
    """
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.perf_counter()
    answer = load()
    protocol.write(json.dumps({"ready": True, "load_s": time.perf_counter() - started}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            break
        try:
            if op == "answer":
                reply: dict[str, Any] = answer(cmd["body"])
            elif op == "time":
                reply = {"seconds": timed(functools.partial(answer, cmd["body"]), int(cmd["n"]))}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - reported to the harness, which raises
            reply = {"error": f"{type(e).__name__}: {e}"}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
    return 0


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two equally shaped batches of vectors."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


class WorkerContestant(WorkerProcess):
    """A library in its own process (bench/contestant.py)."""

    def __init__(self, label: str, kind: str, threads: int, source: Path, onnx: Path | None,
                 log_path: Path, device: str = "cpu", thread_plan: Sequence[tuple[int, int]] = ()) -> None:
        """``thread_plan``: (most tokens, threads) pairs, as a server's /v1/models reports its measured plan."""
        args = [kind, "--source", str(source), "--device", device] + (["--onnx", str(onnx)] if onnx is not None else [])
        if thread_plan:
            args += ["--thread-plan", ",".join(f"{most}:{threads}" for most, threads in thread_plan)]
        super().__init__(label, "bench.contestant", args, threads, log_path)

    def time(self, texts: list[str], n: int) -> list[float]:
        return [float(s) for s in self._ask({"op": "time", "texts": texts, "n": n})["seconds"]]

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.asarray(self._ask({"op": "embed", "texts": texts})["embeddings"], dtype=np.float32)


@dataclass(frozen=True)
class Command:
    """One subcommand of a per-family bench's command line: its help, its arguments and what it runs
    (returning the exit status)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def bench_main(argv: Sequence[str] | None, prog: str, commands: Mapping[str, Command]) -> int:
    """The command line skeleton every per-family bench plugs its subcommands into: parse, stay
    offline (nothing a bench runs may download), run the chosen command."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in commands.items():
        command.arguments(sub.add_parser(name, help=command.help))
    args = parser.parse_args(argv)
    stay_offline()
    return commands[args.command].run(args)


def torch_command(load_torch: Callable[[Path, Path, int], Answer], what: str) -> Command:
    """``torch --threads N --source S --package PKG``: serve ``what`` (the torch contestant) as a
    worker for the bench's rounds."""
    def arguments(t: argparse.ArgumentParser) -> None:
        t.add_argument("--threads", type=int, required=True)
        t.add_argument("--source", type=Path, required=True, help="the source (its weights)")
        t.add_argument("--package", type=Path, required=True, help="the converted package (tokenizer, layout)")

    return Command(f"the {what} contestant (imports torch)", arguments,
                   lambda args: serve_worker(lambda: load_torch(args.source, args.package, args.threads)))


def contestant_main(argv: Sequence[str] | None, prog: str, build: Callable[[Path, Path], None],
                    load_torch: Callable[[Path, Path, int], Answer], what: str) -> int:
    """The command line of a bench that converts a source and times it against torch: ``build
    --source S --out PKG`` writes the source when missing and converts it (imports torch), and
    ``torch`` serves the torch contestant (:func:`torch_command`)."""
    def arguments(b: argparse.ArgumentParser) -> None:
        b.add_argument("--source", type=Path, required=True)
        b.add_argument("--out", type=Path, required=True, help="the package directory")

    def run_build(args: argparse.Namespace) -> int:
        build(args.source, args.out)
        return 0

    return bench_main(argv, prog, {
        "build": Command("write the source when missing and convert it (imports torch)", arguments, run_build),
        "torch": torch_command(load_torch, what),
    })


Samples = dict[str, dict[str, list[list[float]]]]


def interleaved_rounds(rounds: int, budget_s: float, settle_s: float,
                       plan: Mapping[str, Mapping[str, Callable[[], list[float]]]]) -> Samples:
    """Timed rounds: in each, every case's contestants time it in turn, each round starting one
    contestant further (so none always runs first or warm), ``settle_s`` of quiet before each. No
    round starts once the timed rounds so far plus one round's length pass ``budget_s``: a slow
    machine runs fewer rounds, and the tables say how many. case -> contestant -> one list per round."""
    samples: Samples = {case: {k: [] for k in by} for case, by in plan.items()}
    timed_start = time.perf_counter()
    round_s = 0.0
    for r in range(rounds):
        if r and time.perf_counter() - timed_start + round_s > budget_s:
            break
        t0 = time.perf_counter()
        for case, by in plan.items():
            keys = list(by)
            for key in keys[r % len(keys):] + keys[: r % len(keys)]:
                time.sleep(settle_s)
                samples[case][key].append(by[key]())
        round_s = time.perf_counter() - t0
    return samples


def build_in_subprocess(module: str, what: str, source: Path, package: Path, log_dir: Path, timeout_s: float,
                        extra: Sequence[str] = (), cards: Sequence[Path] = ()) -> float:
    """Run ``python -m <module> build --source S --out PKG [extra...]`` offline (it imports torch), its output
    in ``log_dir``; the seconds it took. RuntimeError with the log's tail when it fails or leaves a card of
    ``cards`` (default: PKG's own) unwritten."""
    command = [sys.executable, "-m", module, "build", "--source", str(source), "--out", str(package), *extra]
    print(f"building the {what} package: {' '.join(command[1:])}", flush=True)
    log_path = log_dir / f"{what}-build.log"
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        done = subprocess.run(command, cwd=ROOT, env=offline_env(), stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout_s)
    if done.returncode != 0 or not all(card.is_file() for card in (cards or [package / "card.json"])):
        raise RuntimeError(f"the {what} build failed ({done.returncode}):\n"
                           f"{log_path.read_text(errors='replace')[-3000:]}")
    return time.perf_counter() - started
