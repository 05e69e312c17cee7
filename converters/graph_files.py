"""ONNX graphs as package files: one file, or past protobuf's 2 GB the graph and one data file; and
dropping what a rewritten graph no longer reads.

ONNX Runtime reads a graph's external data relative to the graph file, so a package carries
``<graph>.onnx`` and ``<graph>.onnx.data`` side by side and sessions are created from the path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import TensorProto
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

#: ONNX Runtime's contrib operators' domain.
MS_DOMAIN = "com.microsoft"
#: Graphs above this are saved with their weights in one external data file (protobuf's 2 GB cap).
EXTERNAL_DATA_BYTES = 1_800_000_000
#: Tensors under this many bytes stay inside the graph file (as onnx.save's size_threshold=1024).
INLINE_TENSOR_BYTES = 1024
#: Each tensor starts at a multiple of this in a gathered data file, so it can be mapped page-aligned.
ALIGNMENT = 4096
_CHUNK = 1 << 24


def use_contrib_ops(model: onnx.ModelProto) -> None:
    """Declare ONNX Runtime's contrib domain (FusedMatMul, MatMulIntegerToFloat, RotaryEmbedding, ...) in
    ``model``'s opset imports when a rewrite added one of its operators."""
    if all(o.domain != MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))


def drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes no graph output depends on (and those whose outputs are now initializers: a
    value stored as a constant), then the initializers nothing reads."""
    stored = {t.name for t in graph.initializer}
    needed = {o.name for o in graph.output}
    live: list[onnx.NodeProto] = []
    for n in reversed(graph.node):
        if any(o in needed and o not in stored for o in n.output):
            live.append(n)
            needed.update(i for i in n.input if i)
    del graph.node[:]
    graph.node.extend(reversed(live))
    keep = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(keep)


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
                  location=data_file(dst).name, size_threshold=INLINE_TENSOR_BYTES)
        return [dst, data_file(dst)]
    onnx.save(model, str(dst))
    return [dst]


def _weight_bytes(model: onnx.ModelProto) -> int:
    """The bytes of a graph's weights (ModelProto.ByteSize() itself fails past 2 GB)."""
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer)


def gather_graph(path: Path, external_above: int = EXTERNAL_DATA_BYTES) -> list[Path]:
    """Rewrite a graph on disk as save_graph would; returns its files (the graph first).

    torch.onnx writes a graph over 2 GB with one external file per weight; a package wants one. A
    graph already in one file under ``external_above`` bytes is left as it is. The weights are
    streamed from file to file, never loaded: a 2B's text core is 5.6 GB, and the converter still
    holds the torch model (7 GB at that shape) for its parity checks.
    """
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)  # inline tensors only: under 2 GB
    spread = any(uses_external_data(t) for t in model.graph.initializer)
    if not spread and path.stat().st_size <= external_above:
        return [path]
    target = data_file(path)
    partial = target.with_name(target.name + ".partial")
    sources: set[Path] = set()
    with open(partial, "wb") as out:
        for tensor, initializer in _tensors(model.graph):
            external = uses_external_data(tensor)
            if not external and (not initializer or len(tensor.raw_data) < INLINE_TENSOR_BYTES):
                continue  # small, held in typed fields, or a node's inline constant: stays in the graph
            out.write(b"\0" * (-out.tell() % ALIGNMENT))
            offset = out.tell()
            if external:
                info = ExternalDataInfo(tensor)
                source = path.parent / info.location
                if source.resolve().parent != path.parent.resolve():
                    raise ValueError(f"{path}: tensor {tensor.name!r} has its data outside the graph's directory")
                sources.add(source)
                with open(source, "rb") as f:
                    f.seek(info.offset or 0)
                    length = _copy(f, out, info.length)
            else:
                length = out.write(tensor.raw_data)
                tensor.ClearField("raw_data")
            del tensor.external_data[:]
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", target.name), ("offset", offset), ("length", length)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
    onnx.save(model, str(path))
    partial.replace(target)
    for source in sources - {target}:
        source.unlink()
    return [path, target]


def _tensors(graph: onnx.GraphProto) -> Iterator[tuple[TensorProto, bool]]:
    """Every tensor of a graph and its subgraphs, and whether it is an initializer (the others are node
    attributes: an exporter may write a large Constant's value to the external file too)."""
    for tensor in graph.initializer:
        yield tensor, True
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t, False
            yield from ((t, False) for t in attribute.tensors)
            for sub in (*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs):
                yield from _tensors(sub)


def _copy(src: BinaryIO, dst: BinaryIO, length: int | None) -> int:
    """Copy ``length`` bytes (None: to the end of ``src``) in chunks; returns how many were copied."""
    copied = 0
    while length is None or copied < length:
        chunk = src.read(_CHUNK if length is None else min(_CHUNK, length - copied))
        if not chunk:
            if length is not None:
                raise ValueError(f"external data ended {length - copied} bytes early")
            break
        copied += dst.write(chunk)
    return copied
