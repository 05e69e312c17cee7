"""Starts the real server as a subprocess on 127.0.0.1 and waits for it; tests speak HTTP to it."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_models_file(path: Path, models: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


class Server:
    """`python -m edge_runtime serve` in a subprocess; stop() ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, models_file: Path, *extra: str, log: Path | None = None,
                 env: dict[str, str] | None = None, tls_ca: Path | None = None,
                 headers: dict[str, str] | None = None) -> None:
        """``env`` adds environment variables; ``tls_ca`` speaks HTTPS, trusting that certificate;
        ``headers`` go with every request of ``client`` (an API key, say)."""
        self.port = free_port()
        self.url = f"{'https' if tls_ca else 'http'}://127.0.0.1:{self.port}"
        self.log_path = log or models_file.with_suffix(f".{self.port}.log")
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", **(env or {}))
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child process writes it until stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edge_runtime", "serve", "--models", str(models_file),
             "--host", "127.0.0.1", "--port", str(self.port), *extra],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        verify = ssl.create_default_context(cafile=str(tls_ca)) if tls_ca else True
        self.client = httpx.Client(base_url=self.url, timeout=60.0, headers=headers, verify=verify)

    def wait(self, status: tuple[str, ...] = ("ready",), timeout: float = 120.0) -> dict[str, Any]:
        """Wait until /health reports one of `status`; raises with the server log otherwise."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                last = self.client.get("/health").json()
                if last.get("status") in status:
                    return last
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not {status} after {timeout}s (last {last}):\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-6000:]

    def stop(self) -> None:
        self.client.close()
        end(self.proc)
        self._log.close()


def end(proc: subprocess.Popen[bytes]) -> None:
    """Stop a child process: SIGTERM, then SIGKILL if it is still running after 10 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def embed(server: Server, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    """POST /v1/embeddings; request and response both validated against openapi.yaml."""
    from edge_runtime.api.schema import request_validator, validate_response

    request_validator("/v1/embeddings").validate(body)
    response = server.client.post("/v1/embeddings", json=body)
    answer = response.json()
    validate_response("/v1/embeddings", "post", response.status_code, answer)
    assert response.status_code == status, answer
    return answer
