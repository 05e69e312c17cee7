"""Helpers shared by the reliability tests: process memory, Prometheus samples, contract checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from edge_runtime.api.schema import validate_response
from tests.support.server_harness import Server

MiB = 1 << 20
#: The type of the module fixture start_server(models, *flags) -> Server (tests/reliability/conftest.py).
StartServer = Callable[..., Server]
# The encoder fixture kinds under the names these tests serve them.
ENCODERS = {
    "emb": "embedding",
    "cls": "sequence-classification",
    "ml": "multi-label",
    "tok": "token-classification",
    "rr": "rerank",
}


def encoder_entries(fixture_package: Callable[..., Path], **extra: Any) -> list[dict[str, Any]]:
    """models.yaml entries for every encoder fixture kind (one thread each, on CPU)."""
    return [{"name": name, "package": str(fixture_package(kind)), "device": "cpu", "threads": 1, **extra}
            for name, kind in ENCODERS.items()]


# ---- process memory ----------------------------------------------------------------------------


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes, from /proc/<pid>/status."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def reset_peak(pid: int) -> bool:
    """Reset a process's VmHWM to its current RSS (clear_refs 5); False where the kernel refuses.

    Without the reset VmHWM still holds the peak of model loading, which would hide a smaller
    transient peak that a request causes later.
    """
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class PeakGrowth:
    """Peak RSS growth of a process over a block: ``with PeakGrowth(pid) as g: ...; g.growth``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.reset = False

    def __enter__(self) -> PeakGrowth:
        self.reset = reset_peak(self.pid)
        self.before = memory(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = memory(self.pid)

    @property
    def growth(self) -> int:
        """Bytes the peak rose above the RSS at the start (or above the old peak without a reset)."""
        base = self.before["VmRSS"] if self.reset else self.before["VmHWM"]
        return max(0, self.after["VmHWM"] - base)

    def describe(self) -> str:
        return (f"VmRSS before {self.before['VmRSS'] / MiB:.1f} MiB, VmHWM after {self.after['VmHWM'] / MiB:.1f} MiB, "
                f"VmRSS after {self.after['VmRSS'] / MiB:.1f} MiB, peak growth {self.growth / MiB:.1f} MiB"
                f"{'' if self.reset else ' (VmHWM could not be reset)'}")


# ---- metrics -----------------------------------------------------------------------------------


def metric(server: Server, sample: str, **labels: str) -> float:
    """The value of one Prometheus sample (e.g. edge_runtime_dropped_rows_total{model=...}); 0 if absent."""
    text = server.client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.01) -> None:
    """Poll `condition` until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"not within {timeout} s: {what}")


# ---- contract ----------------------------------------------------------------------------------


def checked(response: httpx.Response, path: str, method: str = "post") -> httpx.Response:
    """A response whose JSON body is valid for its path, method and status in openapi.yaml."""
    if response.headers.get("content-type", "").startswith("application/json"):
        validate_response(path, method, response.status_code, response.json())
    return response


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The contract's error object of an error response."""
    return dict(response.json()["error"])
