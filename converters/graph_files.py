"""ONNX graphs as package files: one file, or past protobuf's 2 GB the graph and one data file.

ONNX Runtime reads a graph's external data relative to the graph file, so a package carries
``<graph>.onnx`` and ``<graph>.onnx.data`` side by side and sessions are created from the path.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

#: Graphs above this are saved with their weights in one external data file (protobuf's 2 GB cap).
EXTERNAL_DATA_BYTES = 1_800_000_000


def data_file(graph: Path) -> Path:
    """Where a graph's external data lives: beside it, named after it."""
    return graph.with_name(graph.name + ".data")


def save_graph(model: onnx.ModelProto, dst: Path, external_above: int = EXTERNAL_DATA_BYTES) -> list[Path]:
    """Write ``model`` at ``dst``, its weights in ``dst.data`` when it is over ``external_above``
    bytes; returns the files written (the graph first)."""
    dst = Path(dst)
    for stale in (dst, data_file(dst)):
        stale.unlink(missing_ok=True)
    if _weight_bytes(model) > external_above:
        onnx.save(model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data_file(dst).name, size_threshold=1024)
        return [dst, data_file(dst)]
    onnx.save(model, str(dst))
    return [dst]


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of a graph's weights (ModelProto.ByteSize() itself fails past 2 GB)."""
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)


def gather_graph(path: Path, external_above: int = EXTERNAL_DATA_BYTES) -> list[Path]:
    """Rewrite a graph on disk as save_graph would; returns its files (the graph first).

    torch.onnx writes a graph over 2 GB with one external file per weight; a package wants one. A
    graph already in one file under ``external_above`` bytes is left as it is.
    """
    path = Path(path)
    head = onnx.load(str(path), load_external_data=False)
    spread = sorted({e.value for t in head.graph.initializer if uses_external_data(t)
                     for e in t.external_data if e.key == "location"})
    if not spread and path.stat().st_size <= external_above:
        return [path]
    del head
    model = onnx.load(str(path))  # with its weights: the graph's size, once
    written = save_graph(model, path, external_above)
    for name in spread:
        if path.parent / name not in written:
            (path.parent / name).unlink(missing_ok=True)
    return written
