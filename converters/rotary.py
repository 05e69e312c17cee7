"""An exported ModernBERT's rotary position embedding as ONNX Runtime's one ``RotaryEmbedding`` kernel.

TorchScript spells ``q * cos + rotate_half(q) * sin`` (Q and K of every layer) as seven kernels: two
Slices of the head's halves, a Neg, a Concat, two Muls and an Add, each a pass over [batch, heads,
tokens, head size]. ONNX Runtime's contrib ``RotaryEmbedding`` (non-interleaved, the halves' layout) does
the same arithmetic in one pass: ~10x faster on its own, 1.04x / 1.05x on a 307M int8 forward at batch 8 /
1 with 2 threads. It is not bit-identical: its kernels fuse a multiply and an add (one rounding where the
export has two), so outputs move by an ULP here and there. The rewrite is therefore checked against the
graph it came from on the converter's rows (:func:`fuse_verified`), and the converter's parity check
against Transformers and the int8 agreement are measured on the fused graph. Each element is computed
from its own token's values, so batch invariance holds as before.

The cos and sin it reads are the export's own (the tensors every layer's Muls read, computed once a
forward), their first half taken as the cache ``[tokens, head size / 2]`` with position ids from 0: the
same values, YaRN's scaling included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.attention_shapes import proof_feeds, proof_session
from converters.graph_files import EXTERNAL_DATA_BYTES, MS_DOMAIN, drop_dead_nodes, save_graph, use_contrib_ops
from converters.verify import Row

#: Node and tensor names this module adds start with this.
PREFIX = "er_rotary"
#: The largest |fused - export| the rewrite may cause on any output: an ULP-level change of the hidden
#: states (the fused kernel rounds once where the export rounds twice), far under any parity tolerance.
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Rotation:
    """One matched ``x * cos + rotate_half(x) * sin``: its input, the cos and sin it reads and its Add."""

    x: str
    cos: str
    sin: str
    out: str


def _matches(graph: onnx.GraphProto) -> list[Rotation]:
    """Every Add of ``Mul(x, cos)`` and ``Mul(Concat(Neg(Slice(x)), Slice(x)), sin)`` on x's last axis."""
    producer = {o: n for n in graph.node for o in n.output}

    def made(name: str, op: str) -> onnx.NodeProto | None:
        n = producer.get(name)
        return n if n is not None and n.op_type == op and n.domain in ("", "ai.onnx") else None

    found = []
    for add in graph.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        a, b = made(add.input[0], "Mul"), made(add.input[1], "Mul")
        if a is None or b is None:
            continue
        for direct, rotated in ((a, b), (b, a)):
            concat = next((c for i in rotated.input if (c := made(i, "Concat")) is not None), None)
            if concat is None or len(concat.input) != 2:
                continue
            neg, first = made(concat.input[0], "Neg"), made(concat.input[1], "Slice")
            second = made(neg.input[0], "Slice") if neg is not None else None
            if first is None or second is None or first.input[0] != second.input[0]:
                continue
            x = first.input[0]
            if x not in direct.input:
                continue
            cos = next(i for i in direct.input if i != x)
            sin = next(i for i in rotated.input if i != concat.output[0])
            found.append(Rotation(x, cos, sin, add.output[0]))
            break
    return found


def fuse_rotary(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: each matched rotation becomes one ``RotaryEmbedding`` over its 4-D input
    ([batch, heads, tokens, head size]); the caches are sliced once per cos/sin tensor. Returns how many."""
    graph = model.graph
    rotations = _matches(graph)
    if not rotations:
        return 0
    graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), f"{PREFIX}/zero"))
    caches_made: dict[str, list[onnx.NodeProto]] = {}  # a cos or sin table -> the nodes making its cache
    producer_index = {o: i for i, n in enumerate(graph.node) for o in n.output}

    def cache(table: str) -> str:
        """``table`` [.., tokens, head size] (halves equal) as [tokens, head size / 2]: its first half, the
        leading axes (ones: the export's tables are a batch of one) flattened into the rows."""
        if table not in caches_made:
            p = f"{PREFIX}/{len(caches_made)}"
            caches_made[table] = [
                helper.make_node("Split", [table], [f"{p}/first_half", f"{p}/second_half"], name=f"{p}/halves",
                                 axis=-1, num_outputs=2),
                helper.make_node("Flatten", [f"{p}/first_half"], [f"{p}/cache"], name=f"{p}/cache", axis=-1),
            ]
        return caches_made[table][-1].output[0]

    replaced: dict[int, onnx.NodeProto] = {}
    for i, r in enumerate(rotations):
        replaced[producer_index[r.out]] = helper.make_node(
            # position ids [0]: the caches' rows are the tokens' positions from 0, as the export's tables
            "RotaryEmbedding", [r.x, f"{PREFIX}/zero", cache(r.cos), cache(r.sin)], [r.out],
            name=f"{PREFIX}/{i}", domain=MS_DOMAIN, interleaved=0)
    # each cache right after the node that computes its table (first when the table is a graph input or a
    # constant), so the node list stays in topological order
    nodes = [n for table, made in caches_made.items() if table not in producer_index for n in made]
    for i, n in enumerate(graph.node):
        nodes.append(replaced.get(i, n))
        nodes.extend(m for o in n.output for m in caches_made.get(o, []))
    del graph.node[:]
    graph.node.extend(nodes)
    use_contrib_ops(model)
    drop_dead_nodes(graph)
    return len(rotations)


class RotaryMismatch(ValueError):
    """The fused graph moved an output by more than :data:`TOLERANCE`: the converter keeps the export's."""


def _run(model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    """Every feed's outputs under the server's session settings, one thread."""
    session = proof_session(model, 1)
    return [session.run(None, f) for f in feeds]


def fuse_verified(model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]]) -> tuple[onnx.ModelProto, int, float]:
    """``model`` with its rotations fused (a copy; ``model`` itself when none matched), its largest output
    change on ``feeds`` and how many it fused. Raises RotaryMismatch past :data:`TOLERANCE`."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    count = fuse_rotary(fused)
    if not count:
        return model, 0, 0.0
    worst = 0.0
    for want, got in zip(_run(model, feeds), _run(fused, feeds)):
        for w, g in zip(want, got):
            if w.shape != g.shape:
                raise RotaryMismatch(f"the fused rotary changed an output's shape: {w.shape} -> {g.shape}")
            worst = max(worst, float(np.max(np.abs(w.astype(np.float64) - g), initial=0.0)))
    if not worst <= TOLERANCE:
        raise RotaryMismatch(f"the fused rotary moved an output by {worst:.3g} (at most {TOLERANCE} allowed)")
    return fused, count, worst


def fuse_file(graph: Path, rows: Sequence[Row], pad_id: int, work: Path,
              external_above: int = EXTERNAL_DATA_BYTES) -> tuple[Path, dict[str, Any]]:
    """The graph file with its rotations fused (saved under ``work``/rotary), or ``graph`` itself when
    none matched or the graph is past protobuf's cap for one serialization; and the card's record. Checked
    on the shape fold's proof batches of ``rows`` (alone and right-padded with ``pad_id``)."""
    model = onnx.load(str(graph))
    if model.ByteSize() > EXTERNAL_DATA_BYTES:
        return graph, {"rotations": 0, "why": "graph over protobuf's 2 GB cap"}
    feeds = proof_feeds(model, rows, pad_id)
    fused, count, worst = fuse_verified(model, feeds)
    if not count:
        return graph, {"rotations": 0}
    path = work / "rotary" / graph.name
    path.parent.mkdir(parents=True, exist_ok=True)
    save_graph(fused, path, external_above)
    return path, {"rotations": count, "kernel": "com.microsoft.RotaryEmbedding",
                  "max_abs_diff": float(f"{worst:.3g}"), "forwards": len(feeds)}

