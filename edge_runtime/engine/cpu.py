"""The CPU this process runs on, as far as ONNX Runtime's kernels (and so speed and fp32 rounding) depend on it.

Exact int8 gives the same numbers on every CPU class, but its speed, and fp32's last bits, do not: every
figure a converter records (agreement, goldens) and every benchmark names the CPU model and the int8
instructions it had.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The instruction-set extensions that pick ONNX Runtime's kernels: x86 (AVX2's 16-bit pair sums,
#: AVX-512, the VNNI dot products, AMX tiles, bf16) and ARM (dot products, int8 matrix multiply).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "asimddp", "i8mm")
#: Those of them that compute int8 products.
INT8_FLAGS = ("avx2", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def cpu_model(cpuinfo: str) -> str | None:
    """The first 'model name' in /proc/cpuinfo text (x86), else the first 'Hardware'/'Model' line (ARM)."""
    fallback = None
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep:
            continue
        if key == "model name" and value.strip():
            return value.strip()
        if key in ("hardware", "model") and value.strip() and fallback is None:
            fallback = value.strip()
    return fallback


def all_flags(cpuinfo: str) -> set[str]:
    """Every flag the first CPU lists ('flags' on x86, 'Features' on ARM)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return set(value.split())
    return set()


def cpu_flags(cpuinfo: str, wanted: Sequence[str] = KERNEL_FLAGS) -> list[str]:
    """Which of ``wanted`` the first CPU lists, in ``wanted``'s order."""
    have = all_flags(cpuinfo)
    return [w for w in wanted if w in have]


@functools.cache
def cpu_class() -> dict[str, Any]:
    """This machine's CPU model and int8 instructions: ``{"model": ..., "int8_instructions": [...]}``."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return {"model": cpu_model(text) or platform.processor() or "unknown",
            "int8_instructions": cpu_flags(text, INT8_FLAGS)}
