"""The Router's process manager, re-told in Python: how it starts, watches, recycles and stops a managed runtime.

Each piece cites the Go it follows, in vllm-project/semantic-router ``src/semantic-router/pkg/modelservice/``:
process.go 0b2b70f0 (``processPlan.files``, ``writeModelsFile``, ``managedCommand``, ``privateDir``,
``ManagedRequestBytes``, ``managedBundleTasks``), supervisor.go 4fc6a864 (``runOnce``: the stale socket
removed, a new process group, stderr merged into stdout; ``terminate``: SIGTERM to the group, SIGKILL
after 10 s; ``recycle``), group.go 0b2b70f0 (``watch`` every 0.5 s while starting, ``refresh``: /health
with a 2 s timeout, the cards from /v1/models once a model is ready, ``recyclesLocked``: every model
failed), transport.go 7f5ea638 (HTTP/1.1 over the socket, base URL ``http://model-runtime``) and
manager.go (``VLLM_SRUN_COMMAND`` split on white space).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.router import api
from tests.router.client import health_state
from tests.router.goshapes import decode
from tests.support.server_harness import ROOT

#: process.go
MANAGED_REQUEST_BYTES = 64 << 20
MANAGED_BUNDLE_TASKS = 1024
#: supervisor.go
STOP_GRACE_PERIOD = 10.0
#: group.go
STARTING_POLL_INTERVAL = 0.5
HEALTH_TIMEOUT = 2.0
#: transport.go
UNIX_BASE_URL = "http://model-runtime"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")

#: What VLLM_SRUN_COMMAND names for this suite: our runtime, as an operator would set it.
COMMAND = f"{sys.executable} -m edge_runtime"


def private_dir(directory: Path) -> None:
    """process.go ``privateDir``: created 0700, or tightened; a symbolic link is refused."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeError(f"{directory} is not a directory")
    directory.chmod(0o700)


@dataclass
class ManagedProcess:
    """One Router-managed runtime: its plan's files and argv, its process group, what /health says."""

    runtime_dir: Path
    name: str
    models: list[dict[str, Any]]
    cache_dir: Path | None = None
    threads: int = 0
    command: str = COMMAND
    extra_args: tuple[str, ...] = ()  # what an operator adds through VLLM_SRUN_COMMAND
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    states: dict[str, tuple[str, str]] = field(default_factory=dict)
    cards: dict[str, api.ModelCard] = field(default_factory=dict)
    readiness: dict[str, bool] = field(default_factory=dict)
    starts: int = 0

    def __post_init__(self) -> None:
        private_dir(self.runtime_dir)
        identity = json.dumps({"models": self.models, "command": self.command, "threads": self.threads},
                              sort_keys=True).encode()
        digest = hashlib.sha256(identity).hexdigest()[:12]
        base = _UNSAFE.sub("_", self.name) + "-" + digest
        self.socket = self.runtime_dir / f"{base}.sock"
        self.models_file = self.runtime_dir / f"{base}.models.json"
        # writeModelsFile: JSON, owner-only
        self.models_file.write_text(json.dumps({"models": self.models}, indent=2) + "\n", encoding="utf-8")
        self.models_file.chmod(0o600)

    def argv(self) -> list[str]:
        """manager.go's command (split on white space) + process.go ``managedCommand``."""
        argv = [*self.command.split(), *self.extra_args, "serve", "--models", str(self.models_file),
                "--uds", str(self.socket), "--max-request-bytes", str(MANAGED_REQUEST_BYTES),
                "--max-bundle-tasks", str(MANAGED_BUNDLE_TASKS)]
        if self.cache_dir is not None:
            argv += ["--cache-dir", str(self.cache_dir)]
        if self.threads > 0:
            argv += ["--threads", str(self.threads)]
        return argv

    def start(self, remove_stale: bool = True) -> None:
        """supervisor.go ``runOnce``: remove a stale socket (any other file there is an error), start
        the command in a process group of its own with stdout and stderr merged."""
        if remove_stale:
            remove_stale_socket(self.socket)
        self.starts += 1
        self.log_path = self.runtime_dir / f"{self.name}.{self.starts}.log"
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes it until it exits
        env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", **self.env)
        self.proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # Setpgid: the process leads its own group
        log.close()
        self.states, self.cards, self.readiness = {}, {}, {}

    def client(self, timeout: float = 60.0) -> httpx.Client:
        """transport.go ``newHTTPClient`` for ``unix://``: HTTP/1.1 over the socket."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url=UNIX_BASE_URL,
                            timeout=timeout)

    def refresh(self) -> None:
        """group.go ``refresh``: /health (2 s timeout) gives each model's state; when a model turns
        ready (``needsCards``), /v1/models gives every card, keyed by id; a model is ready when its
        state is and it has a card."""
        names = [m["name"] for m in self.models]
        try:
            with self.client(HEALTH_TIMEOUT) as client:
                health = decode(api.Health, client.get("/health").json())
                self.states = {n: health_state(health, n, len(names)) for n in names}
                if any(self.states[n][0] == "ready" and not self.readiness.get(n) for n in names):
                    listed = decode(api.ModelList, client.get("/v1/models").json())
                    self.cards.update({card.id: card for card in listed.data or []})
        except (httpx.HTTPError, OSError, ValueError):
            self.states = {n: ("unreachable", "") for n in names}
        self.readiness = {n: self.states[n][0] == "ready" and n in self.cards for n in names}

    def ready(self, name: str) -> bool:
        return self.readiness.get(name, False)

    def every_model_failed(self) -> bool:
        """group.go ``recyclesLocked``: a managed process in which every model failed is recycled."""
        return bool(self.states) and all(state == "failed" for state, _ in self.states.values())

    def watch(self, until: Any, timeout: float = 180.0) -> float:
        """group.go ``watch``: refresh every 0.5 s until ``until(self)``; returns the seconds it took."""
        started = time.monotonic()
        while True:
            self.refresh()
            if until(self):
                return time.monotonic() - started
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"the runtime exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"not there after {timeout} s: {self.states}\n{self.log()}")
            time.sleep(STARTING_POLL_INTERVAL)

    def wait_ready(self, timeout: float = 180.0) -> float:
        return self.watch(lambda p: all(p.ready(m["name"]) for m in p.models), timeout)

    def terminate(self) -> float:
        """supervisor.go ``terminate``: SIGTERM to the group, SIGKILL after 10 s; the seconds it took
        (the grace period or more means the runtime was killed)."""
        assert self.proc is not None
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_GRACE_PERIOD)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return time.monotonic() - started

    def kill(self) -> None:
        """The runtime dies without a chance to clean up (OOM killer, SIGKILL): its socket stays."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def group_alive(self) -> bool:
        """Whether any process of the runtime's group is still there."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:] if self.log_path else ""


def remove_stale_socket(path: Path) -> None:
    """supervisor.go ``removeStaleSocket``: a socket left behind is removed; any other file is an error."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise RuntimeError(f"{path} exists and is not a socket")
    path.unlink()
