"""The vision core's files in a package: its graph, and the case its converter recorded to self-check it."""

from __future__ import annotations

import numpy as np

from edge_runtime.packages import Package
from edge_runtime.packages.golden import GoldenCase

VISION_GRAPH = "vision.onnx"
VISION_GOLDEN = "vision_check.npz"  # the vision core's recorded case: in/<input>, out/<output>


def vision_golden(package: Package) -> list[GoldenCase]:
    """The vision core's recorded case (``vision_check.npz``: ``in/<input>``, ``out/<output>``)."""
    with np.load(package.file(VISION_GOLDEN), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return [GoldenCase({k[3:]: v for k, v in arrays.items() if k.startswith("in/")},
                       {k[4:]: v for k, v in arrays.items() if k.startswith("out/")})]


__all__ = ["VISION_GOLDEN", "VISION_GRAPH", "vision_golden"]
