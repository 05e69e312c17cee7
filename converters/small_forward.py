"""One exact int8 graph with two bodies: one built for small forwards, one for large, the same bits.

A small forward (one sentence: ~20 tokens) spends most of its time launching kernels, not in them; a
large one (32 sentences) spends it in passes over wide outputs. The two want different graphs:
fewer, wider kernels (Q, K and V as one GEMM; max|x| from |x|; the token scale inside the integer
GEMM) make MiniLM's int8 forward 1.04-1.06x faster on one sentence (12-22 tokens, one thread) and
0.92x as fast on 32 (docs/benchmarks.md, session 22). So the exact int8 rewriter builds both bodies
(converters.quantize ``small``) and this module joins them under one If on the forward's token count
(rows x length of the first input): a package keeps one graph file, the weights both bodies read are
stored once, and the server needs nothing new.

The bodies compute every element with the same operations in the same order, so their outputs are
the same bits (:func:`check_same_bits` refuses the join otherwise); a row therefore gets the same
answer alone as in any batch, whichever body each forward takes, and the server's load-time probe
still proves that on the CPU it runs on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from converters.verify import Row
from edge_runtime.engine.session import session_options

#: Names the join adds to the outer graph.
TOKENS = "er_small/tokens"
LIMIT = "er_small/limit"
SMALL = "er_small/is_small"
SWITCH = "er_small/If"
#: Suffix of every tensor the small body makes (the bodies share the outer graph's names).
SMALL_SUFFIX = "/small"
#: Suffix of the large body's results (its other tensors keep their names).
LARGE_SUFFIX = "/large"
#: The most rows, and tokens, of the padded batch :func:`check_same_bits` compares besides each row alone.
BATCH_ROWS = 16
BATCH_TOKENS = 2048


class BodiesDiffer(ValueError):
    """The two bodies gave different bits on this CPU: the converter refuses to join them."""


def join(large: onnx.ModelProto, small: onnx.ModelProto, tokens: int) -> onnx.ModelProto:
    """One graph that runs ``small``'s nodes for forwards of at most ``tokens`` tokens and ``large``'s
    for the rest. Both have the same inputs and outputs; initializers of the same name and bytes are
    stored once (those that differ are renamed in the small body)."""
    stored = {t.name: t for t in large.graph.initializer}
    renamed: dict[str, str] = {}
    for t in small.graph.initializer:
        if t.name in stored and stored[t.name].SerializeToString() != t.SerializeToString():
            renamed[t.name] = t.name + SMALL_SUFFIX
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            copy.name = renamed[t.name]
            t = copy
        stored.setdefault(t.name, t)
    outputs = [o.name for o in large.graph.output]
    made = {o for n in small.graph.node for o in n.output if o}
    # the small body's tensors all take its suffix; the large body's only where they are the graph's
    # outputs: each branch names its own results, and the If gives them the graph's output names
    small_names = {**renamed, **{t: t + SMALL_SUFFIX for t in made}}
    large_names = {o: o + LARGE_SUFFIX for o in outputs}

    def branch(name: str, graph: onnx.GraphProto, names: dict[str, str], suffix: str) -> onnx.GraphProto:
        nodes = [_renamed(n, names, n.name + suffix) for n in graph.node]
        results = [helper.make_tensor_value_info(names[o.name], o.type.tensor_type.elem_type, None)
                   for o in graph.output]
        return helper.make_graph(nodes, name, [], results)

    switch = [helper.make_node("Size", [large.graph.input[0].name], [TOKENS], name="er_small/Size"),
              helper.make_node("LessOrEqual", [TOKENS, LIMIT], [SMALL], name="er_small/LessOrEqual"),
              helper.make_node("If", [SMALL], outputs, name=SWITCH,
                               then_branch=branch("small_forward", small.graph, small_names, SMALL_SUFFIX),
                               else_branch=branch("large_forward", large.graph, large_names, ""))]
    opsets = [*large.opset_import, *(o for o in small.opset_import
                                      if all(o.domain != mine.domain for mine in large.opset_import))]
    # no value_info: the bodies' tensors live in the branches now
    return _model(large, switch, [*stored.values(), numpy_helper.from_array(np.array(tokens, np.int64), LIMIT)],
                  opsets)


def bodies(model: onnx.ModelProto) -> list[onnx.ModelProto]:
    """Each body of a joined graph as a graph of its own (the large one first); [model] when not joined."""
    switch = next((n for n in model.graph.node if n.name == SWITCH), None)
    if switch is None:
        return [model]
    out = []
    for attr, suffix in (("else_branch", LARGE_SUFFIX), ("then_branch", SMALL_SUFFIX)):
        branch = next(a.g for a in switch.attribute if a.name == attr)
        results = {o.name + suffix: o.name for o in model.graph.output}
        nodes = [_renamed(n, results, name=n.name.removesuffix(suffix)) for n in branch.node]
        read = {i for n in nodes for i in n.input}
        out.append(_model(model, nodes, [t for t in model.graph.initializer if t.name in read], model.opset_import))
    return out


def _model(like: onnx.ModelProto, nodes: Sequence[onnx.NodeProto], initializers: Sequence[onnx.TensorProto],
           opsets: Sequence[onnx.OperatorSetIdProto]) -> onnx.ModelProto:
    """``like`` (every model field but the graph and opsets; the graph's inputs and outputs) around ``nodes``,
    ``initializers`` and ``opsets``: each tensor copied once, where a CopyFrom of ``like`` would copy all its
    weights before dropping them (a 307M graph's gigabyte)."""
    out = onnx.ModelProto(graph=helper.make_graph(nodes, like.graph.name, like.graph.input, like.graph.output,
                                                  initializers))
    for field, value in like.ListFields():
        if field.name in ("graph", "opset_import"):
            continue
        if field.is_repeated:
            getattr(out, field.name).extend(value)
        elif field.message_type is not None:
            getattr(out, field.name).CopyFrom(value)
        else:
            setattr(out, field.name, value)
    out.opset_import.extend(opsets)
    return out


def _renamed(node: onnx.NodeProto, names: dict[str, str], name: str) -> onnx.NodeProto:
    """A copy of ``node`` named ``name``, its inputs and outputs renamed by ``names``."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = name
    copy.input[:] = [names.get(i, i) for i in node.input]
    copy.output[:] = [names.get(o, o) for o in node.output]
    return copy


def check_same_bits(large: onnx.ModelProto, small: onnx.ModelProto, rows: Sequence[Row]) -> int:
    """Raise BodiesDiffer unless both graphs give the same bits on ``rows``, each alone (one thread) and the
    shortest of them as one right-padded batch (one and two threads); returns how many forwards were compared."""
    one, two = ([ort.InferenceSession(model.SerializeToString(), session_options(threads),
                                      providers=["CPUExecutionProvider"]) for model in (large, small)]
                for threads in (1, 2))
    names = [i.name for i in one[0].get_inputs()]
    forwards = [(one, {n: row[n][None, :] for n in names}) for row in rows]
    # the batch: the shortest rows, as many as fit BATCH_ROWS and BATCH_TOKENS (attention is quadratic)
    shortest = sorted(rows, key=lambda row: len(row[names[0]]))[:BATCH_ROWS]
    while len(shortest) > 1 and len(shortest) * len(shortest[-1][names[0]]) > BATCH_TOKENS:
        shortest.pop()
    if len(shortest) > 1:
        width = len(shortest[-1][names[0]])
        batch = {n: np.stack([np.pad(row[n], (0, width - len(row[n]))) for row in shortest]) for n in names}
        forwards += [(one, batch), (two, batch)]
    for (large_session, small_session), feed in forwards:
        if not all(np.array_equal(a, b) for a, b in zip(large_session.run(None, feed), small_session.run(None, feed))):
            raise BodiesDiffer(f"the small-forward body differs from the large one on a forward of "
                               f"{feed[names[0]].shape} ({large_session.get_session_options().intra_op_num_threads}"
                               f" thread(s))")
    return len(forwards)
