"""``edge-runtime devices``: the devices this host offers ONNX Runtime, and the one ``auto`` takes.

The Router asks (``<command> devices``, devices.go) before it places managed deployments on ``auto``,
and reads ``auto`` from the JSON. CUDA devices are those the NVIDIA driver lists, when this
onnxruntime build has the CUDA provider; ``auto`` is the first of them, else the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .session import cuda_available

_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")


def cuda_devices(gpus: Path = _NVIDIA_GPUS) -> list[str]:
    """``cuda:N`` for each GPU the NVIDIA driver lists, when the CUDA provider is offered."""
    if not cuda_available():
        return []
    try:
        count = sum(1 for entry in gpus.iterdir() if entry.is_dir())
    except OSError:
        return []
    return [f"cuda:{i}" for i in range(count)]


def resolve_device(device: str) -> str:
    """The device kind a model on ``device`` runs on: ``cuda`` for cuda and cuda:N, and for auto
    where a CUDA device is listed; else ``cpu``."""
    kind = device.partition(":")[0]
    return "cuda" if kind == "cuda" or (kind == "auto" and cuda_devices()) else "cpu"


def report() -> dict[str, Any]:
    """``{"auto": label, "devices": [labels]}``, the shape upstream's ``devices`` command prints."""
    cuda = cuda_devices()
    return {"auto": cuda[0] if cuda else "cpu", "devices": ["cpu", *cuda]}
