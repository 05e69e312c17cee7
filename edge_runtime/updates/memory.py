"""The memory guard: what a new version needs against what the process may still use, and giving a
released version's memory back to the operating system.

The need comes from the card (``memory.resident_bytes``) when a converter recorded it. Today's
converters do not, so it is estimated from the package's file sizes: twice the variant's graph
files (ONNX Runtime holds the weights and builds its optimized copy while the session is made)
plus every other file the variant reads (tokenizer, goldens, heads, other graphs of its family);
the graphs of the other variants are not counted. The estimate is labelled as one wherever shown.

The budget is the cgroup v2 limit minus its usage where the process runs under a limit (a
container), else the kernel's MemAvailable; the configured reserve is kept back from either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("edge_runtime.updates")

CGROUP_ROOT = Path("/sys/fs/cgroup")
GRAPH_FACTOR = 2


@dataclass(frozen=True)
class Need:
    """Bytes a version is expected to hold, and where the figure comes from (card or estimate)."""

    bytes: int
    source: str


@dataclass(frozen=True)
class Budget:
    """Bytes a new version may use (after the reserve), and where the figure comes from."""

    bytes: int
    source: str


def package_need(package: Path, variant: str) -> Need:
    """The card's recorded need, else an estimate from the manifest's file sizes (see the module)."""
    try:
        card = json.loads((package / "card.json").read_text(encoding="utf-8"))
        manifest = json.loads((package / "MANIFEST.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot size package {package}: {exc}") from None
    recorded = (card.get("memory") or {}).get("resident_bytes")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return Need(recorded, "card")
    variants = card.get("variants") or {}
    mine = (variants.get(variant) or {}).get("file")
    others = {v.get("file") for name, v in variants.items() if name != variant} - {mine}
    graphs = rest = 0
    for rel, entry in (manifest.get("files") or {}).items():
        size = int(entry.get("size", 0))
        stem = rel.removesuffix(".data")  # an external-data file belongs to its graph
        if stem in others or (stem.endswith(".onnx") and _variant_of(stem, variants) not in (None, variant)):
            continue
        if rel.endswith((".onnx", ".onnx.data")):
            graphs += size
        else:
            rest += size
    return Need(GRAPH_FACTOR * graphs + rest, "estimate from package file sizes (2 x graphs + other files)")


def _variant_of(graph: str, variants: dict[str, dict[str, str]]) -> str | None:
    """The variant whose graph file ``graph`` is a split or tower graph of (model.int8.question.onnx
    belongs to int8), None when it is shared by every variant."""
    for name, v in variants.items():
        stem = str(v.get("file", "")).removesuffix(".onnx")
        if stem and stem != "model" and graph.startswith(stem + "."):
            return name
    return None


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


_libc: ctypes.CDLL | None = None


def give_back() -> None:
    """Collect cycles, then ask glibc to return freed heap pages to the OS (malloc_trim): without it
    a released session's arenas stay resident and RSS would only ever grow across swaps."""
    global _libc
    gc.collect()
    if os.name != "posix":
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim): nothing to ask
        log.debug("malloc_trim is not available")
