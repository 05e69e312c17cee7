"""The CPU this process runs on, as far as ONNX Runtime's kernels (and so speed and fp32 rounding) depend on it.

Exact int8 gives the same integer products on every CPU class, but its speed, and the last bits of the
float operations around them, do not: every figure a converter records (agreement, goldens) and every
benchmark names the CPU model and the int8 instructions it had, and a package's goldens name the
architecture class they were recorded on (:func:`arch_class`).

On aarch64 ONNX Runtime picks its kernels from the auxiliary vector's HWCAP bits (through pytorch/cpuinfo,
or directly where cpuinfo cannot read sysfs), so this module reads the same bits: QEMU's user-mode
emulator answers them for the emulated ``-cpu`` model but shows the host's /proc/cpuinfo.
"""

from __future__ import annotations

import ctypes
import functools
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The instruction-set extensions that pick ONNX Runtime's kernels: x86 (AVX2's 16-bit pair sums,
#: AVX-512, the VNNI dot products, AMX tiles, bf16) and ARM (dot products, int8 matrix multiply, SVE).
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "asimddp", "i8mm", "sve")
#: Those of them that compute int8 products.
INT8_FLAGS = ("avx2", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")

#: getauxval's keys, and the Linux arm64 HWCAP bits of the features above (arch/arm64/include/uapi/asm/hwcap.h),
#: named as /proc/cpuinfo's Features line names them.
AT_HWCAP, AT_HWCAP2 = 16, 26
ARM_HWCAPS: dict[str, tuple[int, int]] = {
    "asimddp": (AT_HWCAP, 1 << 20), "sve": (AT_HWCAP, 1 << 22),
    "sve2": (AT_HWCAP2, 1 << 1), "i8mm": (AT_HWCAP2, 1 << 13), "bf16": (AT_HWCAP2, 1 << 14),
}

#: Architecture classes: CPUs whose float kernels round alike, so that goldens recorded on one class hold
#: bit for bit on another of it (the int8 variants' integer products are exact on every class).
#: "aarch64" is ARMv8 without SVE (Cortex-A53/A72/A76, Neoverse N1: Pi 4/5, Jetson Orin, Graviton2, Altra),
#: whose softmax sums a row's tail one element at a time; "aarch64-sve" (Neoverse V1/V2: Graviton3/4) runs
#: ONNX Runtime's SVE softmax, which rounds differently again.
X86_64, AARCH64, AARCH64_SVE = "x86_64", "aarch64", "aarch64-sve"
ARCH_CLASSES = (X86_64, AARCH64, AARCH64_SVE)

#: Row-padding multiple per architecture class: the sequence width every padded feed rounds up to so
#: that a row's answer does not depend on its batch. MLAS's generic softmax (aarch64 without SVE) adds
#: the ``n mod 4`` tail of a row as scalars after its 8- and 4-wide blocks, so masked padding moves
#: former tail elements into vector lanes and changes the rounding; with every width a multiple of 8,
#: padding only ever fills whole blocks with exact zeros (docs/reference/arm64-notes.md §3.3). x86 and
#: SVE kernels handle the tail in vector lanes: nothing to pad.
ROW_MULTIPLE = {X86_64: 1, AARCH64: 8, AARCH64_SVE: 1}


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


def machine() -> str:
    """This process's architecture: "x86_64", "aarch64" (also for macOS's "arm64"), or what Python reports."""
    name = platform.machine().lower()
    return {"amd64": X86_64, "arm64": AARCH64}.get(name, name)


def hwcap_flags(auxv: dict[int, int] | None = None) -> set[str]:
    """The ARM features of :data:`ARM_HWCAPS` this process's auxiliary vector has (``auxv`` maps
    AT_HWCAP / AT_HWCAP2 to their values; default: getauxval's on aarch64, none elsewhere: other
    architectures give the same bits other meanings)."""
    if auxv is None:
        if machine() != AARCH64:
            return set()
        auxv = {key: _getauxval(key) for key in (AT_HWCAP, AT_HWCAP2)}
    return {name for name, (key, bit) in ARM_HWCAPS.items() if auxv.get(key, 0) & bit}


def _getauxval(key: int) -> int:
    try:
        getauxval = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):
        return 0
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(getauxval(key))


def classify(arch: str, flags: set[str] | Sequence[str]) -> str:
    """The architecture class of a CPU of ``arch`` with ``flags`` (an unknown architecture is its own name)."""
    if arch == AARCH64:
        return AARCH64_SVE if "sve" in flags else AARCH64
    return arch


@functools.cache
def _here() -> tuple[str, str, list[str]]:
    """(model, architecture class, kernel flags) of this machine, read once."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    arch = machine()
    model = cpu_model(text)
    flags = cpu_flags(text)
    if arch == AARCH64:
        # the kernels' own source; /proc/cpuinfo under qemu-user is the host's (x86 flags, its model name)
        have = hwcap_flags()
        flags = [f for f in KERNEL_FLAGS if f in have]
        if not all_flags(text) & {"asimd", "fp"}:
            model = None
    return model or platform.processor() or arch or "unknown", classify(arch, flags), flags


def cpu_class() -> dict[str, Any]:
    """This machine's CPU model and int8 instructions: ``{"model": ..., "int8_instructions": [...]}``."""
    model, _, flags = _here()
    return {"model": model, "int8_instructions": [f for f in flags if f in INT8_FLAGS]}


def arch_class() -> str:
    """This machine's architecture class (:data:`ARCH_CLASSES`; another architecture's own name)."""
    return _here()[1]


def row_multiple(arch: str | None = None) -> int:
    """The multiple every padded row width of a CPU session rounds up to on ``arch`` (default: this
    machine's class) so that rows answer alike alone and batched: :data:`ROW_MULTIPLE`, 1 elsewhere."""
    return ROW_MULTIPLE.get(arch_class() if arch is None else arch, 1)
