"""Comparison: repeated calls as the Router makes them to a runtime it manages (issue 35).

Two servers started with the Router's managed command line over one models file in the Router's
shape (``minilm-embedding`` under profile exact, so its exact int8, and ``sparrow-nano``): one on a
Unix socket (``--uds``), as the Router runs it, one on TCP (127.0.0.1) beside it. Timed one after
the other with the lean client (bench/harness/clients.py ``LeanClient``), in interleaved rounds, on both
transports: a repeated embedding (one short text, the same each time: its row is answered from the
result cache), a new embedding each time (a miss: the forward runs), a repeated 3-question decision
and a new one each time. Reported: p50 and p99 of each, the repeat against the miss, and the socket
against TCP. Goal: a repeat under 0.3 ms p50 over the socket.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.decisions import PACKAGE as SPARROW
from bench.harness.clients import LeanClient
from bench.harness.lab import PACKAGE_NAME, Lab
from bench.harness.report import ROOT, Table, fmt_ratio
from bench.harness.server import free_port, terminate
from bench.harness.stats import percentile

PER_ROUND = 100  # timed requests per row, transport and round
WARMUP = 8  # untimed, before each timed row: the idle vCPU comes back to speed
READY_TIMEOUT_S = 180.0
TARGET_P50_MS = 0.3
TEXT = "How do I reset my password?"
STATE = "I was charged twice for order 1182, I want my money back"
QUESTIONS = {
    "tool": {"type": "choice", "instructions": "Which tool should handle this?",
             "choices": [{"key": "refunds", "description": "Refund a payment"},
                         {"key": "shipping", "description": "Track a delivery"},
                         {"key": "account", "description": "Reset a password"}]},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
    "angry": {"type": "score", "instructions": "How angry is the customer?", "levels": ["Calm", "Annoyed", "Furious"]},
}


class ManagedServer:
    """``python -m edge_runtime serve`` with the Router's managed argv, on a socket or on TCP."""

    def __init__(self, models_file: Path, threads: int, socket_path: Path | None, log: Path) -> None:
        self.port = 0 if socket_path is not None else free_port()
        where = ["--uds", str(socket_path)] if socket_path is not None else ["--host", "127.0.0.1",
                                                                             "--port", str(self.port)]
        self._log = open(log, "wb")  # noqa: SIM115 - the child process writes it until stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_runtime", "serve", "--models", str(models_file), *where,
             "--max-request-bytes", str(64 << 20), "--max-bundle-tasks", "1024", "--threads", str(threads)],
            cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
        self.client = LeanClient(self.port, socket_path)
        self.log = log

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                status, body = self.client.get("/health")
                if status == 200 and json.loads(body).get("status") == "ready":
                    return
            except (OSError, EOFError, ValueError):
                self.client.close()
            time.sleep(0.2)
        raise TimeoutError(f"not ready after {READY_TIMEOUT_S:.0f} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.client.close()
        terminate(self.proc)
        self._log.close()


def _bodies() -> dict[str, Callable[[int], bytes]]:
    """Each row's request body; ``n`` makes a miss's text new."""
    def embed(text: str) -> bytes:
        return json.dumps({"model": PACKAGE_NAME, "input": [{"type": "text", "text": text}],
                           "encoding_format": "base64"}).encode()

    def decide(state: str) -> bytes:
        return json.dumps({"model": SPARROW, "state": state, "questions": QUESTIONS}).encode()

    return {
        "embedding, repeated (hit)": lambda n: embed(TEXT),
        "embedding, new each time (miss)": lambda n: embed(f"{TEXT} (ticket {n})"),
        "3-question decision, repeated (hit)": lambda n: decide(STATE),
        "3-question decision, new each time (miss)": lambda n: decide(f"{STATE}, ticket {n}"),
    }


def run(lab: Lab) -> list[Table]:
    work = Path(tempfile.mkdtemp(prefix="bench-managed-", dir="/tmp"))  # a short socket path
    models = [{"model": str((lab.settings.packages / name).resolve()), "revision": "", "name": name,
               "device": "cpu", "profile": "exact"} for name in (PACKAGE_NAME, SPARROW)]
    models_file = work / "worker.models.json"
    models_file.write_text(json.dumps({"models": models}))
    servers = {"socket": ManagedServer(models_file, lab.settings.threads, work / "worker.sock", work / "uds.log"),
               "TCP": ManagedServer(models_file, lab.settings.threads, None, work / "tcp.log")}
    try:
        for server in servers.values():
            server.wait_ready()
        samples = _measure(servers, lab.settings.rounds)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return [_table(samples, lab.settings.threads)]


def _measure(servers: dict[str, ManagedServer], rounds: int) -> dict[tuple[str, str], list[float]]:
    bodies = _bodies()
    counter = itertools.count()
    samples: dict[tuple[str, str], list[float]] = {(row, t): [] for row in bodies for t in servers}
    for r in range(rounds):
        order = list(servers.items()) if r % 2 == 0 else list(reversed(servers.items()))
        for transport, server in order:
            for row, body in bodies.items():
                for _ in range(WARMUP):
                    server.client.post(_path(row), body(next(counter)))
                for _ in range(PER_ROUND):
                    data = body(next(counter))
                    started = time.perf_counter()
                    status, answer = server.client.post(_path(row), data)
                    samples[(row, transport)].append((time.perf_counter() - started) * 1000.0)
                    if status != 200:
                        raise RuntimeError(f"{row} over {transport}: HTTP {status}: {answer[:300]!r}")
    return samples


def _path(row: str) -> str:
    return "/v1/embeddings" if row.startswith("embedding") else "/v1/decisions"


def _table(samples: dict[tuple[str, str], list[float]], threads: int) -> Table:
    rows = []
    for (row, transport), values in samples.items():
        p50 = percentile(values, 50)
        miss = samples.get((row.replace("repeated (hit)", "new each time (miss)"), transport))
        tcp = samples.get((row, "TCP"))
        goal = ""
        if transport == "socket" and row.endswith("(hit)"):
            goal = f"< {TARGET_P50_MS:g} ms: {'met' if p50 < TARGET_P50_MS else 'NOT met'}"
        rows.append([row, transport, f"{p50:.3f}", f"{percentile(values, 99):.3f}",
                     fmt_ratio(percentile(miss, 50) / p50) if miss is not None and row.endswith("(hit)") else "",
                     fmt_ratio(percentile(tcp, 50) / p50) if tcp is not None and transport == "socket" else "", goal])
    return Table(
        f"Calls as the Router makes them to a managed runtime: {len(next(iter(samples.values())))} sequential "
        f"keep-alive requests per row and transport, intra-op threads {threads} (--threads)",
        ["request", "transport", "p50 ms", "p99 ms", "miss / hit (p50)", "TCP / socket (p50)", "goal"],
        rows,
        ["Client wall time to the last body byte (LeanClient). A hit answers every row from the result "
         "cache (engine/result_cache.py); a miss runs the forward. Both servers run at once, rounds "
         "interleaved (order alternating)."],
    )
