"""A graph's picks of static dimensions out of a ``Shape`` written as the constants they always are.

TorchScript exports spell every ``x.size(-1)``, ``x.shape[-1] // 2`` and ``1 / sqrt(head_dim)`` as a
``Shape`` of a runtime tensor followed by ``Gather``/``Slice`` and arithmetic. ONNX Runtime folds none of
it on the CPU: a ``Shape`` of a tensor with a dynamic axis is no constant to it, even when the dimension
picked is one the graph fixes (a hidden size, a head size). ModernBERT's export runs ~21 such kernels a
layer (the rotary halves of Q and K, the attention scale, the MLP's chunk of its input projection): at
batch 1 a kernel costs about as much as its arithmetic. And the attention scale, applied to K after its
transpose, kept ONNX Runtime from folding that transpose into the MatMul: one more copy of K a layer
(8 % of a 307M int8 forward's kernel time at batch 8 on two threads).

:func:`fold_static_dims` replaces each pick whose dimensions ONNX shape inference proves static (the
same for every input) by an initializer of that value; ONNX Runtime's own constant folding then
evaluates what follows with the same kernels the forward ran. Picks of a dynamic dimension (batch,
sequence) stay. The converter proves the result bit-identical to the export before shipping it
(converters.attention_shapes.fold_verified).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from converters.graph_files import EXTERNAL_DATA_BYTES, drop_dead_nodes

#: Initializers this module adds start with this.
PREFIX = "er_static_dim"


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Every tensor whose value the graph fixes: initializers and Constant nodes' values."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.data_type == onnx.TensorProto.INT64}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            attr = next((a for a in n.attribute if a.name == "value"), None)
            if attr is not None and attr.t.data_type == onnx.TensorProto.INT64:
                values[n.output[0]] = numpy_helper.to_array(attr.t)
    return values


Dim = int | str | None


def _dims(model: onnx.ModelProto) -> dict[str, list[Dim]]:
    """Each tensor's dimensions as ONNX shape inference (with data propagation) knows them: a size, the
    name of a symbolic dimension, or None."""
    # the graph without its weights' values (a weight's dims infer its readers' shapes; its values are
    # never read): each large float initializer becomes an input of its type and shape
    light = helper.make_model(helper.make_graph(list(model.graph.node), model.graph.name, list(model.graph.input),
                                                list(model.graph.output)),
                              opset_imports=list(model.opset_import), ir_version=model.ir_version)
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.ByteSize() > 1024:
            light.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            light.graph.initializer.append(t)
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    dims: dict[str, list[Dim]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            dims[vi.name] = [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in t.shape.dim]
    for t in model.graph.initializer:
        dims[t.name] = list(t.dims)
    return dims


def _shape_range(node: onnx.NodeProto, rank: int) -> range:
    """The dimensions a Shape node returns (opset 15's start and end, clamped as the operator does)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = int(attrs.get("start", 0)), int(attrs.get("end", rank))
    start, end = (v + rank if v < 0 else v for v in (start, end))
    return range(min(max(start, 0), rank), min(max(end, 0), rank))


def _picked(reader: onnx.NodeProto, length: int, constants: dict[str, np.ndarray]) -> np.ndarray | None:
    """Which positions of a shape vector of ``length`` the Gather or Slice ``reader`` returns, shaped as
    its output; None when its indices are not constants or it is another op."""
    if reader.domain not in ("", "ai.onnx"):
        return None
    positions = np.arange(length, dtype=np.int64)
    if reader.op_type == "Gather" and reader.input[1] in constants:
        axis = next((helper.get_attribute_value(a) for a in reader.attribute if a.name == "axis"), 0)
        index = constants[reader.input[1]]
        if axis != 0 or np.any(index >= length) or np.any(index < -length):
            return None
        return positions[index]
    if reader.op_type == "Slice" and all(i in constants for i in reader.input[1:] if i):
        starts, ends, axes, steps = (constants[i] if i else np.array([d]) for i, d in
                                     zip([*reader.input[1:], "", ""][:4], (0, length, 0, 1)))
        if list(axes) not in ([0], [-1]):
            return None
        return positions[slice(int(starts[0]), int(ends[0]), int(steps[0]))]
    return None


def _static(d: Dim) -> bool:
    return isinstance(d, int)


def fold_static_dims(model: onnx.ModelProto) -> int:
    """Rewrite ``model`` in place: each Shape whose dimensions are all static, and each Gather or Slice of
    a Shape's output that picks only static ones, becomes an initializer of that value; a Reshape's
    target piece that picks the dimension its data already has at that position becomes 0 ("copy the
    input's"). Returns how many tensors became constants (0 for a graph past protobuf's 2 GB cap, which
    shape inference would have to serialize)."""
    graph = model.graph
    if sum(t.ByteSize() for t in graph.initializer) > EXTERNAL_DATA_BYTES:
        return 0
    dims = _dims(model)
    constants = _constants(graph)
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    values: dict[str, np.ndarray] = {}
    picks: dict[str, Dim] = {}  # a scalar pick of one dimension -> that dimension (its size or its name)
    for n in graph.node:
        if n.op_type != "Shape" or n.domain not in ("", "ai.onnx") or n.input[0] not in dims:
            continue
        shape = dims[n.input[0]]
        vector = [shape[i] for i in _shape_range(n, len(shape))]
        if all(map(_static, vector)):
            values[n.output[0]] = np.array(vector, np.int64)
            continue
        for reader in readers.get(n.output[0], []):
            picked = _picked(reader, len(vector), constants)
            if reader.input[0] != n.output[0] or picked is None:
                continue
            if all(_static(vector[i]) for i in picked.flat):
                values[reader.output[0]] = np.array([vector[i] for i in picked.flat], np.int64).reshape(picked.shape)
            elif picked.size == 1:
                picks[reader.output[0]] = vector[int(picked.flat[0])]
    for n in graph.node:
        if n.op_type == "Reshape" and n.domain in ("", "ai.onnx") and n.input[0] in dims:
            values.update(_copied_pieces(n, dims[n.input[0]], producer, picks, constants))
    outputs = {o.name for o in graph.output}
    values = {name: v for name, v in values.items() if name not in outputs}
    stored = {t.name for t in graph.initializer} | set(constants)
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in values.items())
    newly_constant = constant_closure(graph, stored | set(values)) - constant_closure(graph, stored)
    _keep_scales_apart(model, newly_constant, dims, readers)
    drop_dead_nodes(graph)
    return len(values)


def constant_closure(graph: onnx.GraphProto, known: set[str]) -> set[str]:
    """The tensors whose values follow from ``known`` alone (ONNX Runtime folds them at session creation)."""
    found = set(known)
    for n in graph.node:  # topological order
        standard = n.domain in ("", "ai.onnx") and (n.input or n.op_type == "Constant")
        if standard and all(i in found for i in n.input if i):
            found.update(n.output)
    return found


def _keep_scales_apart(model: onnx.ModelProto, folded: set[str], dims: dict[str, list[Dim]],
                       readers: dict[str, list[onnx.NodeProto]]) -> None:
    """Give each Mul by a newly constant scalar that feeds a MatMul (directly or through a Transpose) that
    scalar as a tensor over one of its operand's static dimensions.

    ONNX Runtime fuses a Mul by a constant scalar into the MatMul it feeds (MatMulScaleFusion: the factor
    applied once to the product), which rounds differently from scaling an operand, as the export does
    (SDPA multiplies Q and K each by sqrt(1 / sqrt(head size))). The same value broadcast from a vector is
    the same elementwise product, and no fusion takes a vector. Where that operand is a Transpose of its
    last two axes (SDPA's K^T), the Mul moves before it (:func:`_scale_before`)."""
    graph = model.graph

    def feeds_matmul(name: str) -> bool:
        return any(r.op_type == "MatMul" or (r.op_type == "Transpose" and feeds_matmul(r.output[0]))
                   for r in readers.get(name, []))

    producer = {o: n for n in graph.node for o in n.output}
    position = {n.output[0]: i for i, n in enumerate(graph.node) if n.output}
    scales: dict[str, np.ndarray] = {}
    moves: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []
    for n in graph.node:
        if n.op_type != "Mul" or len(n.input) != 2 or not feeds_matmul(n.output[0]):
            continue
        for k, (c, x) in enumerate(((n.input[0], n.input[1]), (n.input[1], n.input[0]))):
            transpose = _last_axes_swap(producer.get(x), readers)
            operand = transpose.input[0] if transpose is not None else x
            shape = _broadcast_shape(dims.get(operand) or [])
            if c not in folded or x in folded or shape is None:
                continue
            if c not in scales:
                scales[c] = evaluate_constant(model, c)
            if scales[c].size == 1:
                name = f"{PREFIX}/{c}/{'x'.join(map(str, shape))}"
                if all(t.name != name for t in graph.initializer):
                    graph.initializer.append(numpy_helper.from_array(
                        np.full(shape, scales[c].reshape(()), scales[c].dtype), name))
                n.input[k] = name
                if transpose is not None:
                    moves.append((transpose, n))
            break
    for transpose, mul in moves:
        _scale_before(graph, transpose, mul, position)


def _last_axes_swap(node: onnx.NodeProto | None, readers: dict[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    """``node`` when it is a Transpose that swaps only its last two axes and has one reader, else None."""
    if node is None or node.op_type != "Transpose" or len(readers.get(node.output[0], [])) != 1:
        return None
    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
    if not perm or len(perm[0]) < 2:
        return None
    rank = len(perm[0])
    return node if perm[0] == [*range(rank - 2), rank - 1, rank - 2] else None


def _scale_before(graph: onnx.GraphProto, transpose: onnx.NodeProto, mul: onnx.NodeProto,
                  position: dict[str, int]) -> None:
    """``Transpose -> Mul`` (a constant factor over the operand's last axis) rewritten as ``Mul ->
    Transpose``: the same elementwise product, and ONNX Runtime then fuses the Transpose into the MatMul
    that reads it (MatMulTransposeFusion: K^T packed straight from K), one copy of K less a layer.
    The two nodes swap places in the node list, which keeps it in topological order."""
    scaled = f"{PREFIX}/{transpose.output[0]}/scaled"
    factor = next(i for i in mul.input if i != transpose.output[0])
    out = mul.output[0]
    moved_mul = helper.make_node("Mul", [transpose.input[0], factor], [scaled], name=mul.name)
    moved_transpose = onnx.NodeProto()
    moved_transpose.CopyFrom(transpose)
    moved_transpose.input[0], moved_transpose.output[0] = scaled, out
    at_transpose, at_mul = position[transpose.output[0]], position[out]
    graph.node[at_transpose].CopyFrom(moved_mul)
    graph.node[at_mul].CopyFrom(moved_transpose)


def _broadcast_shape(dims: list[Dim]) -> tuple[int, ...] | None:
    """A shape over the operand's last static dimension (more than one element, broadcast to the operand:
    [d, 1, ..., 1]), or None when it has none."""
    for j in range(len(dims) - 1, -1, -1):
        d = dims[j]
        if isinstance(d, int) and d > 1:
            return (d,) + (1,) * (len(dims) - 1 - j)
    return None


def evaluate_constant(model: onnx.ModelProto, name: str) -> np.ndarray:
    """The value of ``name``, which follows from the graph's constants alone, as ONNX Runtime computes it."""
    import onnxruntime as ort

    graph = model.graph
    stored = {t.name for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o not in stored}
    needed: set[str] = set()
    stack = [name]
    while stack:
        t = stack.pop()
        if t in needed or t not in producer:
            continue
        needed.add(t)
        stack.extend(i for i in producer[t].input if i)
    nodes = [n for n in graph.node if any(o in needed for o in n.output)]
    read = {i for n in nodes for i in n.input}
    sub = helper.make_graph(nodes, "er_static_dim_value", [], [helper.make_empty_tensor_value_info(name)],
                            [t for t in graph.initializer if t.name in read])
    probe = helper.make_model(sub, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"]).run([name], {})[0]


def _copied_pieces(reshape: onnx.NodeProto, data: list[Dim], producer: dict[str, onnx.NodeProto],
                   picks: dict[str, Dim], constants: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """For a Reshape whose target is a Concat: each piece that is one pick of a named dimension (or its
    Unsqueeze) equal to the data's dimension at the same position, as 0 (Reshape copies it). Only when
    every other piece is a constant, so the whole target becomes one."""
    concat = producer.get(reshape.input[1])
    if concat is None or concat.op_type != "Concat" or any(a.name == "allowzero" and a.i for a in reshape.attribute):
        return {}
    pieces: dict[str, np.ndarray] = {}
    position = 0  # where the piece lands in the target
    for piece in concat.input:
        if piece in constants:
            position += constants[piece].size
            continue
        unsqueeze = producer.get(piece)
        dim = picks.get(unsqueeze.input[0]) if unsqueeze is not None and unsqueeze.op_type == "Unsqueeze" \
            else picks.get(piece)
        if not isinstance(dim, str) or position >= len(data) or data[position] != dim:
            return {}
        pieces[piece] = np.zeros(1, np.int64)
        position += 1
    return pieces
