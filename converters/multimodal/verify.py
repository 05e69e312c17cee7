"""Verification of a multimodal export: each tower's graph through ONNX Runtime against the Transformers
module it was exported from, on sample texts, images and clips."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError

#: largest |onnx - torch| on any vector element a tower may show
TOLERANCE = 1e-4


def tower_session(path: Path) -> Any:
    from converters.verify import create_session

    return create_session(path)


def compare(name: str, session: Any, torch_fn: Callable[..., Any], feeds_list: list[dict[str, np.ndarray]],
             pool: Callable[[np.ndarray, int], np.ndarray] | None = None) -> tuple[float, int]:
    """(max |onnx - torch|, forwards compared) over feeds run alone and, when several share one
    shape, as one batch too."""
    import torch

    worst = 0.0
    runs = [[f] for f in feeds_list]
    shapes = {tuple((k, v.shape) for k, v in f.items()) for f in feeds_list}
    if len(feeds_list) > 1 and len(shapes) == 1:
        runs.append(feeds_list)
    for run in runs:
        feeds = {k: np.concatenate([f[k] for f in run]) for k in run[0]}
        got = session.run(None, feeds)[0]
        with torch.no_grad():
            want = torch_fn(**{k: torch.from_numpy(v) for k, v in feeds.items()}).numpy()
        if pool is not None:
            got = np.stack([pool(got[i], i) for i in range(len(run))])
            want = np.stack([pool(want[i], i) for i in range(len(run))])
        if got.shape != want.shape or not np.all(np.isfinite(got)):
            raise ConversionError(f"{name} tower: ONNX output {got.shape} differs from PyTorch {want.shape}")
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    if worst > TOLERANCE:
        raise ConversionError(f"{name} tower: |onnx - torch| = {worst:.3g}, above {TOLERANCE:g}; refused")
    return worst, len(runs)


def sample_images() -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(7)
    images = []
    for (w, h), mode in (((64, 48), "RGB"), ((31, 90), "RGB"), ((40, 40), "L"), ((120, 75), "RGBA")):
        small = rng.integers(0, 256, size=(max(1, h // 4), max(1, w // 4), len(mode)), dtype=np.uint8)
        img = Image.fromarray(small[..., 0] if len(mode) == 1 else small, mode=mode)
        images.append(img.resize((w, h), Image.Resampling.BILINEAR))
    return images


def sample_clips(rate: int, window_s: int) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    clips = []
    for seconds, freq in ((0.37, 220.0), (window_s * 0.6, 440.0), (window_s * 1.5, 880.0)):
        t = np.arange(int(seconds * rate)) / rate
        clips.append((0.3 * np.sin(2 * np.pi * freq * t) + rng.normal(0, 0.02, t.shape)).astype(np.float32))
    return clips
