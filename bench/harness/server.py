"""Our server as a contestant: `python -m edge_runtime serve` on 127.0.0.1 in a subprocess, a keep-alive
HTTP client for it, and the memory figures of its process from /proc."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.harness.report import ROOT
from bench.harness.server_timing import parse_server_timing

HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.2


def parse_proc_status(text: str) -> dict[str, int]:
    """The Vm* and Rss* lines of /proc/<pid>/status, in bytes (the file gives kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or not (key.startswith("Vm") or key.startswith("Rss")):
            continue
        fields = value.split()
        if len(fields) == 2 and fields[1] == "kB" and fields[0].isdigit():
            out[key] = int(fields[0]) * 1024
    return out


def free_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """Stop a server process: SIGTERM, then SIGKILL if it is still running after ``grace_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    read_s: float  # from sending the request to the last body byte

    def json(self) -> Any:
        return json.loads(self.body)

    def server_timing(self) -> dict[str, float]:
        return parse_server_timing(self.headers.get("server-timing", ""))


#: serve's flag that turns the result cache off (engine/result_cache.py).
NO_RESULT_CACHE = ("--result-cache-entries", "0")


class ServerProcess:
    """One server serving one package variant as `name`, with `threads` intra-op threads on the CPU."""

    def __init__(self, package: Path, variant: str, threads: int, name: str = "minilm-embedding",
                 log_dir: Path | None = None, batching: str = "exact",
                 models: list[dict[str, Any]] | None = None, args: tuple[str, ...] = (),
                 result_cache: bool = False) -> None:
        """Serve one package as `name`, or, with `models`, those models.yaml entries as they are;
        `args` are more `serve` options (--max-request-bytes ...). The comparisons repeat their inputs
        round after round, which the result cache would answer without a forward: the server runs
        without it unless ``result_cache`` (bench/managed.py measures the cache itself)."""
        self.name = name
        self.port = free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="bench-server-", dir=log_dir))
        models_file = self._dir / "models.yaml"
        models_file.write_text(yaml.safe_dump({"models": models or [{
            "name": name, "package": str(package.resolve()), "variant": variant,
            "device": "cpu", "threads": threads, "batching": batching,
        }]}), encoding="utf-8")
        self.log_path = self._dir / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child process writes it until stop()
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_runtime", "serve", "--models", str(models_file),
             "--host", HOST, "--port", str(self.port), *(() if result_cache else NO_RESULT_CACHE), *args],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        self._conn: http.client.HTTPConnection | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll /health until every model is ready; raises with the log when it exits or times out."""
        polls = int(timeout / POLL_INTERVAL_S)
        last: Any = None
        for _ in range(polls):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                last = self.get("/health").json()
                if last.get("status") == "ready":
                    return
                if last.get("status") in ("failed", "degraded"):
                    raise RuntimeError(f"server is {last.get('status')}: {last}\n{self.log_tail()}")
            except (OSError, http.client.HTTPException, ValueError):
                self._reset()
            time.sleep(POLL_INTERVAL_S)
        raise TimeoutError(f"server not ready after {timeout:.0f}s (last /health: {last}):\n{self.log_tail()}")

    def stop(self) -> None:
        self._reset()
        terminate(self.proc)
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def memory(self) -> dict[str, int]:
        """VmRSS, VmHWM (peak RSS) and friends of the server process, in bytes."""
        return parse_proc_status(Path(f"/proc/{self.proc.pid}/status").read_text())

    def reset_peak(self) -> None:
        """Set VmHWM back to the current VmRSS (Linux's clear_refs "5"), so that the next peak is one
        request's rather than the process's whole history."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    # -- HTTP ---------------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(HOST, self.port, timeout=300)
        return self._conn

    def _reset(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(self, method: str, path: str, body: bytes | None = None) -> Response:
        """One request on the kept-alive connection (reconnecting once if the server closed it)."""
        headers = {"content-type": "application/json"} if body is not None else {}
        for attempt in (0, 1):
            conn = self._connection()
            try:
                started = time.perf_counter()
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                read_s = time.perf_counter() - started
                return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, read_s)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self._reset()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, payload: Any) -> Response:
        return self.request("POST", path, json.dumps(payload).encode())

    def get(self, path: str) -> Response:
        return self.request("GET", path)

    def embeddings_payload(self, texts: list[str], encoding_format: str = "float",
                           options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The /v1/embeddings body asking this server's model for ``texts``."""
        payload: dict[str, Any] = {"model": self.name, "input": texts, "encoding_format": encoding_format}
        if options:
            payload["options"] = options
        return payload

    def embeddings(self, texts: list[str], encoding_format: str = "float",
                   options: dict[str, Any] | None = None) -> Response:
        return self.post("/v1/embeddings", self.embeddings_payload(texts, encoding_format, options))
