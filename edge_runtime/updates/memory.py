"""The memory guard: what a new version needs against what the process may still use (giving a
released version's memory back is edge_runtime/heap.py).

The need is a package's footprint (edge_runtime/packages/footprint.py: the card's figure, else an
estimate from its file sizes).

The budget is the cgroup v2 limit minus its usage where the process runs under a limit (a
container), else the kernel's MemAvailable; the configured reserve is kept back from either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.packages.footprint import Need, package_need

__all__ = ["Budget", "Need", "available_memory", "budget", "package_need", "resident_bytes"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Budget:
    """Bytes a new version may use (after the reserve), and where the figure comes from."""

    bytes: int
    source: str


def _cgroup_dir() -> Path | None:
    """This process's cgroup v2 directory, when there is one with a memory limit file."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                path = CGROUP_ROOT / line[3:].lstrip("/")
                return path if (path / "memory.max").exists() else None
    except OSError:
        return None
    return None


def available_memory() -> Budget:
    """cgroup v2 ``memory.max - memory.current`` under a limit, else /proc/meminfo's MemAvailable."""
    group = _cgroup_dir()
    if group is not None:
        try:
            limit = (group / "memory.max").read_text().strip()
            if limit != "max":
                usage = int((group / "memory.current").read_text().strip())
                return Budget(max(0, int(limit) - usage), "cgroup v2 memory.max - memory.current")
        except (OSError, ValueError):
            pass
    try:
        match = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        match = None
    if match is None:
        raise OSError("neither a cgroup v2 memory limit nor /proc/meminfo's MemAvailable can be read")
    return Budget(int(match.group(1)) * 1024, "MemAvailable")


def memory_limit() -> Budget:
    """All the memory the process may use: the cgroup v2 ``memory.max`` under a limit, else MemTotal
    (edge_runtime_memory_limit_bytes, which the memory alert divides the resident set by)."""
    group = _cgroup_dir()
    try:
        limit = (group / "memory.max").read_text().strip() if group is not None else "max"
        if limit != "max":
            return Budget(int(limit), "cgroup v2 memory.max")
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except (OSError, ValueError):
        match = None
    return Budget(int(match.group(1)) * 1024 if match else 0, "MemTotal")


def budget(reserve: int) -> Budget:
    """What a new version may use now: the available memory less ``reserve``."""
    free = available_memory()
    return Budget(max(0, free.bytes - reserve), f"{free.source} - reserve {reserve}")


def resident_bytes() -> int:
    """This process's resident set size (VmRSS)."""
    try:
        match = re.search(r"^VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0


