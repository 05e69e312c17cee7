"""Matmul outputs that are only ever read in pieces of their last axis, as one matmul per piece.

ModernBERT's layers cut two products apart right after computing them: Wqkv's output is reshaped to
[..., 3, heads, head size], transposed and split into Q, K and V; Wi's is sliced into GeGLU's two halves.
The split and the slices copy the whole output. Computing each piece as its own, narrower matmul (that
piece's weight columns) writes each piece where its readers want it, and the copies go. The exact int8
rewriter (converters.quantize) does this on the activation codes it has already made, so the pieces share
one quantization: the integer products, scales and outlier products of a column do not depend on which
other columns are computed beside it, so the outputs are the same bits.

Two ways of reading in pieces are recognised, each with every bound a constant of the graph (after
converters.static_dims has folded the export's picks of static dimensions):

- Slices of the last axis (``chunk``): each Slice is a piece;
- a Reshape [..., P, rest...] of the last axis (entries before P: 0 or -1, so they keep the leading
  dimensions), a Transpose, a Split of P's axis into ones and a Squeeze of that axis after each (``unbind``):
  piece j is columns j*N/P to (j+1)*N/P, reshaped to [..., rest...] and transposed as the rest was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.attention_shapes import GraphIndex, attribute
from converters.static_dims import constant_closure, evaluate_constant

STANDARD = ("", "ai.onnx")


@dataclass(frozen=True)
class Piece:
    """Columns [start, stop) of a matmul's output, written to ``output``; ``tail`` (nodes reading
    ``output``) then makes ``made``, the tensor the replaced readers made."""

    start: int
    stop: int
    output: str
    made: str
    tail: tuple[onnx.NodeProto, ...] = ()


@dataclass
class Plan:
    """Each pieced matmul output's pieces, the readers they replace, and the constants their tails read."""

    pieces: dict[str, list[Piece]] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)  # first outputs of the readers the pieces replace
    constants: list[onnx.TensorProto] = field(default_factory=list)


class _Graph(GraphIndex):
    """The index of who reads what, plus which int tensors the graph's constants fix."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model.graph)
        self.model = model
        self.stored = {t.name: t for t in model.graph.initializer}
        self.constant = constant_closure(model.graph, set(self.stored))

    def only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The one node reading ``name``, of the standard op ``op_type``, when ``name`` is no graph output."""
        reader = super().only_reader(name, op_type)
        return reader if reader is not None and reader.domain in STANDARD else None

    def value(self, tensor: str) -> list[int] | None:
        """A constant int tensor's entries, or None when the graph does not fix it."""
        if not tensor or tensor not in self.constant:
            return None
        value = numpy_helper.to_array(self.stored[tensor]) if tensor in self.stored else \
            evaluate_constant(self.model, tensor)
        return [int(v) for v in np.asarray(value).reshape(-1)]


def _clamp(v: int, n: int) -> int:
    """An ONNX Slice bound on an axis of ``n``: negative counts from the end, then clamped to [0, n]."""
    return max(0, min(n, v + n if v < 0 else v))


def _slices(g: _Graph, y: str, n: int) -> list[Piece] | None:
    readers = g.readers.get(y, [])
    pieces = []
    for r in readers:
        if r.op_type != "Slice" or r.domain not in STANDARD or list(r.input[:1]) != [y] or len(r.input) < 4:
            return None
        starts, ends, axes = (g.value(t) for t in r.input[1:4])
        steps = g.value(r.input[4]) if len(r.input) > 4 and r.input[4] else [1]
        if starts is None or ends is None or axes != [-1] or steps != [1] or len(starts) != 1 or len(ends) != 1:
            return None
        start, stop = _clamp(starts[0], n), _clamp(ends[0], n)
        if start >= stop:
            return None
        pieces.append(Piece(start, stop, r.output[0], r.output[0]))
    return pieces or None


def _unbound(g: _Graph, y: str, n: int, plan: Plan) -> list[Piece] | None:
    reshape = g.only_reader(y, "Reshape")
    shape = g.value(reshape.input[1]) if reshape is not None and list(reshape.input[:1]) == [y] else None
    if reshape is None or shape is None or attribute(reshape, "allowzero"):
        return None
    lead = next((i for i, v in enumerate(shape) if v > 0), len(shape))
    if lead == len(shape) or any(v not in (0, -1) for v in shape[:lead]) or shape[:lead].count(-1) > 1:
        return None
    parts, rest = shape[lead], shape[lead + 1:]
    if int(np.prod(shape[lead:])) != n or any(v <= 0 for v in rest):
        return None
    transpose = g.only_reader(reshape.output[0], "Transpose")
    perm = list(attribute(transpose, "perm") or []) if transpose is not None else []
    if transpose is None or sorted(perm) != list(range(len(shape))):
        return None
    axis = perm.index(lead)
    split = g.only_reader(transpose.output[0], "Split")
    if split is None or len(split.output) != parts or attribute(split, "axis") not in (axis, axis - len(shape)):
        return None
    sizes = g.value(split.input[1]) if len(split.input) > 1 and split.input[1] else [1] * parts
    squeezes = [g.only_reader(o, "Squeeze") for o in split.output]
    if sizes != [1] * parts or any(s is None or len(s.input) < 2 for s in squeezes):
        return None
    if any(g.value(s.input[1]) not in ([axis], [axis - len(shape)]) for s in squeezes if s is not None):
        return None
    piece_shape = numpy_helper.from_array(np.array(shape[:lead] + rest, np.int64), f"er_pieces/{y}/shape")
    plan.constants.append(piece_shape)
    plan.replaced.update([reshape.output[0], transpose.output[0], split.output[0]])
    piece_perm = [p - (p > lead) for p in perm if p != lead]
    width = n // parts
    pieces = []
    for j, squeeze in enumerate(squeezes):
        assert squeeze is not None
        out = f"er_pieces/{y}/{j}"
        tail = (helper.make_node("Reshape", [out, piece_shape.name], [f"{out}/reshaped"], name=f"{out}/Reshape"),
                helper.make_node("Transpose", [f"{out}/reshaped"], [squeeze.output[0]], name=f"{out}/Transpose",
                                 perm=piece_perm))
        pieces.append(Piece(j * width, (j + 1) * width, out, squeeze.output[0], tail))
    return pieces


def plan_pieces(model: onnx.ModelProto, matmuls: Mapping[str, int]) -> Plan:
    """The pieces of each output in ``matmuls`` (a MatMul's output -> its columns N) that is read only in
    pieces of its last axis, as the module's docstring says; the others are left out."""
    g = _Graph(model)
    plan = Plan()
    for y, n in matmuls.items():
        if y in g.outputs:
            continue
        pieces = _slices(g, y, n) or _unbound(g, y, n, plan)
        if pieces:
            plan.pieces[y] = pieces
            plan.replaced.update(p.made for p in pieces)
    return plan
