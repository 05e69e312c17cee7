"""An exported encoder's attention with its shape arithmetic folded into constants, bit for bit.

Optimum's BERT-family exports spell each layer's self-attention with ~14 kernels of shape arithmetic
around the ~14 that compute: the reshapes to heads and back take their target shapes from
Shape/Gather/Unsqueeze/Concat chains, and the 1/sqrt(head size) factor applied to Q and K comes from a
Shape/Slice/Cast/Sqrt/Div/Sqrt chain; one more ~15-kernel chain builds the additive mask. ONNX
Runtime's ORT_ENABLE_ALL folds none of it on the CPU (a Shape of a tensor with a dynamic axis is no
constant), so every forward runs it, and at batch 1 a kernel costs about as much as its arithmetic.

:func:`fold_attention_shapes` rewrites each such attention with the same computing kernels on the same
values: ``Mul`` of Q and K by the export's own factor (its value as ONNX Runtime computes it, now a
constant, applied before the split into heads: the same elementwise product), ``Reshape`` to and from
heads with constant shapes (``[0, 0, heads, head size]``, ``[0, 0, hidden]``), the same transposes
but K's (the scores' MatMul reads K transposed: ``FusedMatMul`` with ``transB``), the same MatMuls, mask
Add and Softmax; and the mask as ``Where(attention_mask == 0, m, 0)`` over
``[batch, 1, 1, keys]`` (m: the export's own masked value; the same values the export's chain
broadcast). Anything the pattern does not match exactly (another export's attention, a causal mask,
a factor that is not one constant) stays as it was.

ONNX Runtime's fused MultiHeadAttention kernel was measured too and left out: it also computes the
same bits, and removes ~11 kernels a layer more, but it runs one small SGEMM call per (row, head)
where MatMul batches them, and was 4-7 % slower than the export at batch 32 (docs/benchmarks.md).

:func:`fold_verified` also writes every pick of a static dimension as its constant
(converters.static_dims: ModernBERT's rotary halves, attention scale and MLP chunk, which this attention
pattern does not cover), proves the folded graph bit-identical to the export on the rows it is given
(alone and in right-padded batches, with 1 and 2 intra-op threads) and refuses it otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from converters.graph_files import EXTERNAL_DATA_BYTES, MS_DOMAIN, drop_dead_nodes, save_graph, use_contrib_ops
from converters.static_dims import fold_static_dims
from converters.verify import Row, pad_batch

#: The graph inputs an encoder's attention reads (Optimum's BERT-family names).
MASK_INPUT = "attention_mask"
ENCODER_INPUTS = frozenset({"input_ids", MASK_INPUT, "token_type_ids"})
#: The export's additive mask must push a masked score at least this far down (it uses float32's lowest).
MASK_FLOOR = -1e4
NOT_AN_ENCODER = "not an encoder graph (input_ids, attention_mask, token_type_ids)"
#: Node and tensor names this module adds start with this.
PREFIX = "er_attention"
#: Graphs whose weights pass this are left alone: the proof serializes both graphs (protobuf's 2 GB cap).
MAX_WEIGHT_BYTES = 1_800_000_000
#: Intra-op thread counts the proof runs both graphs with (kernels split their work by thread).
PROOF_THREADS = (1, 2)
#: Rows per padded batch in the proof.
PROOF_BATCH = 8


class FoldingMismatch(ValueError):
    """The folded graph's outputs differ from the export's: the converter refuses to ship it."""


@dataclass(frozen=True)
class Folding:
    """How many attentions :func:`fold_attention_shapes` folded (0: ``why`` says why none), how many
    static dimension picks became constants (converters.static_dims), and how many forwards proved the
    folded graph bit-identical (:func:`fold_verified`)."""

    layers: int = 0
    why: str = ""
    forwards: int = 0
    static_dims: int = 0

    @property
    def changed(self) -> bool:
        """Whether the graph was rewritten at all."""
        return bool(self.layers or self.static_dims)

    def summary(self) -> str:
        """One line for the converter's log."""
        return (f"shape arithmetic folded: attention in {self.layers} layers, {self.static_dims} static dimension "
                f"picks" + (f" ({self.why})" if self.why and not self.layers else "")
                + (f"; bit-identical on {self.forwards} forwards" if self.forwards else ""))

    def describe(self) -> dict[str, Any]:
        """The card's record of the folding and its proof."""
        return {"layers": self.layers, "static_dims": self.static_dims, "bit_identical_forwards": self.forwards,
                "threads": list(PROOF_THREADS)}


@dataclass(frozen=True)
class _Attention:
    """One matched self-attention: its [B, S, hidden] Q, K and V, the tensors whose values the rewrite
    needs (the Q and K factors, the additive mask, Q split into heads) and its last node (the merge of
    the heads back to [B, S, hidden])."""

    q: str
    k: str
    v: str
    q_factor: str
    k_factor: str
    mask: str
    q_heads: str
    out: onnx.NodeProto


class GraphIndex:
    """Who produces and who reads each tensor of a graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for i in n.input:
                self.readers.setdefault(i, []).append(n)
        self.outputs = {o.name for o in graph.output}

    def made_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node of standard op ``op_type`` that produces ``name``, if that is what produces it."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The one node reading ``name`` when it is of ``op_type`` and ``name`` is no graph output."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.outputs or readers[0].op_type != op_type:
            return None
        return readers[0]


def attribute(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """``node``'s attribute ``name`` as a Python value, or ``default`` when it has none."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _heads(ix: GraphIndex, name: str, perm: list[int]) -> tuple[str, str] | None:
    """(x, heads) when ``name`` is Transpose(perm) of heads = Reshape(x, [B, S, H, D])."""
    t = ix.made_by(name, "Transpose")
    if t is None or list(attribute(t, "perm", [])) != perm:
        return None
    r = ix.made_by(t.input[0], "Reshape")
    return (r.input[0], r.output[0]) if r is not None else None


def _scaled_heads(ix: GraphIndex, name: str, perm: list[int]) -> tuple[str, str, str] | None:
    """(x, factor, heads) when ``name`` is Mul(Transpose(perm) of Reshape(x), factor)."""
    m = ix.made_by(name, "Mul")
    if m is None:
        return None
    for split, factor in ((m.input[0], m.input[1]), (m.input[1], m.input[0])):
        found = _heads(ix, split, perm)
        if found is not None:
            return found[0], factor, found[1]
    return None


def _match_attention(ix: GraphIndex, softmax: onnx.NodeProto) -> _Attention | None:
    """The export's attention around ``softmax``, or None where any piece differs."""
    add = ix.made_by(softmax.input[0], "Add")
    if attribute(softmax, "axis", -1) != -1 or add is None:
        return None
    scores, mask = add.input
    if ix.made_by(scores, "MatMul") is None:
        scores, mask = mask, scores
    qk = ix.made_by(scores, "MatMul")
    if qk is None:
        return None
    q = _scaled_heads(ix, qk.input[0], [0, 2, 1, 3])
    k = _scaled_heads(ix, qk.input[1], [0, 2, 3, 1])
    pv = ix.only_reader(softmax.output[0], "MatMul")
    if q is None or k is None or pv is None or pv.input[0] != softmax.output[0]:
        return None
    v = _heads(ix, pv.input[1], [0, 2, 1, 3])
    back = ix.only_reader(pv.output[0], "Transpose")
    if v is None or back is None or list(attribute(back, "perm", [])) != [0, 2, 1, 3]:
        return None
    out = ix.only_reader(back.output[0], "Reshape")
    if out is None:
        return None
    return _Attention(q=q[0], k=k[0], v=v[0], q_factor=q[1], k_factor=k[1], mask=mask, q_heads=q[2], out=out)


def probe_feeds(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """Two small encoder batches: one row of 4 tokens, then rows of 7 and 3 tokens (right-padded)."""
    names = [i.name for i in model.graph.input]
    feeds = []
    for mask in (np.ones((1, 4), np.int64), np.array([[1] * 7, [1] * 3 + [0] * 4], np.int64)):
        ids = (np.arange(mask.size, dtype=np.int64).reshape(mask.shape) % 7 + 1) * mask
        values = {"input_ids": ids, MASK_INPUT: mask, "token_type_ids": np.zeros_like(mask)}
        feeds.append({n: values[n] for n in names})
    return feeds


def proof_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    """A CPU session with the server's pinned settings (the optimisation level is part of the numerics)."""
    from edge_runtime.engine.session import session_options

    # no spinning: the proof runs beside other work, and spin-waits change timing, never numbers
    return ort.InferenceSession(model.SerializeToString(), session_options(threads, spinning=False),
                                providers=["CPUExecutionProvider"])


def _evaluate(model: onnx.ModelProto, names: Sequence[str], feeds: Sequence[dict[str, np.ndarray]]
              ) -> list[dict[str, np.ndarray]]:
    """The values of the tensors ``names`` on each of ``feeds``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    wanted = list(dict.fromkeys(names))
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in wanted if n not in have)
    session = proof_session(probe, 1)
    return [dict(zip(wanted, session.run(wanted, f))) for f in feeds]


def _mask_value(mask: np.ndarray, attention_mask: np.ndarray) -> float | None:
    """The export's additive value for masked keys when ``mask`` ([B, 1, 1 or S, T], every query row
    alike) is exactly +0.0 at the attention mask's ones and one value (at most MASK_FLOOR) at its
    zeros; 0.0 when nothing is masked; None when it is anything else (a causal mask, a bias)."""
    b, t = attention_mask.shape
    if mask.ndim != 4 or mask.shape[:2] != (b, 1) or mask.shape[3] != t or mask.dtype != np.float32:
        return None
    if not np.all(mask == mask[:, :, :1, :]):
        return None
    row = mask[:, 0, 0, :]
    real, masked = row[attention_mask != 0], row[attention_mask == 0]
    if real.tobytes() != np.zeros_like(real).tobytes():  # +0.0 bit for bit, as Where(.., 0.0) writes
        return None
    if not masked.size:
        return 0.0
    return float(masked[0]) if np.all(masked == masked[0]) and masked[0] <= MASK_FLOOR else None


def _constant(values: Sequence[np.ndarray]) -> np.ndarray | None:
    """The one float32 scalar every evaluation gave, bit for bit (as a 0-d array), or None."""
    first = values[0]
    if first.dtype != np.float32 or first.size != 1 or any(v.tobytes() != first.tobytes() for v in values):
        return None
    return first.reshape(())


def _mask_nodes(graph: onnx.GraphProto, value: float) -> tuple[str, list[onnx.NodeProto]]:
    """The additive mask [B, 1, 1, T]: ``value`` where attention_mask is 0, +0.0 elsewhere (3 kernels)."""
    p = f"{PREFIX}/mask"
    graph.initializer.extend([numpy_helper.from_array(np.array([1, 2], np.int64), f"{p}/axes"),
                              numpy_helper.from_array(np.array(0, np.int64), f"{p}/zero_id"),
                              numpy_helper.from_array(np.array(value, np.float32), f"{p}/masked"),
                              numpy_helper.from_array(np.array(0.0, np.float32), f"{p}/kept")])
    return f"{p}/additive", [
        helper.make_node("Unsqueeze", [MASK_INPUT, f"{p}/axes"], [f"{p}/mask4"], name=f"{p}/Unsqueeze"),
        helper.make_node("Equal", [f"{p}/mask4", f"{p}/zero_id"], [f"{p}/padded"], name=f"{p}/Equal"),
        helper.make_node("Where", [f"{p}/padded", f"{p}/masked", f"{p}/kept"], [f"{p}/additive"], name=f"{p}/Where")]


def _folded_nodes(graph: onnx.GraphProto, a: _Attention, i: int, factors: tuple[np.ndarray, np.ndarray],
                  heads: tuple[int, int], mask: str) -> list[onnx.NodeProto]:
    """Attention ``a`` with constant factors and shapes: the export's computing kernels, in its order."""
    p = f"{PREFIX}/{i}"
    n_heads, size = heads
    graph.initializer.extend([numpy_helper.from_array(factors[0], f"{p}/q_factor"),
                              numpy_helper.from_array(factors[1], f"{p}/k_factor"),
                              numpy_helper.from_array(np.array([0, 0, n_heads, size], np.int64), f"{p}/heads"),
                              numpy_helper.from_array(np.array([0, 0, n_heads * size], np.int64), f"{p}/merged")])

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
        return helper.make_node(op, inputs, [output], name=f"{p}/{output.rsplit('/', 1)[-1]}", **attrs)

    return [node("Mul", [a.q, f"{p}/q_factor"], f"{p}/q"), node("Mul", [a.k, f"{p}/k_factor"], f"{p}/k"),
            node("Reshape", [f"{p}/q", f"{p}/heads"], f"{p}/q_split"),
            node("Transpose", [f"{p}/q_split"], f"{p}/q_heads", perm=[0, 2, 1, 3]),
            node("Reshape", [f"{p}/k", f"{p}/heads"], f"{p}/k_split"),
            node("Transpose", [f"{p}/k_split"], f"{p}/k_heads", perm=[0, 2, 1, 3]),
            node("Reshape", [a.v, f"{p}/heads"], f"{p}/v_split"),
            node("Transpose", [f"{p}/v_split"], f"{p}/v_heads", perm=[0, 2, 1, 3]),
            # K^T read by the MatMul (transB) rather than copied: the export's [0, 2, 3, 1] transpose
            # moved every element apart where [0, 2, 1, 3] moves rows of head size
            node("FusedMatMul", [f"{p}/q_heads", f"{p}/k_heads"], f"{p}/scores", domain=MS_DOMAIN, transB=1),
            node("Add", [f"{p}/scores", mask], f"{p}/masked_scores"),
            node("Softmax", [f"{p}/masked_scores"], f"{p}/weights", axis=-1),
            node("MatMul", [f"{p}/weights", f"{p}/v_heads"], f"{p}/context_heads"),
            node("Transpose", [f"{p}/context_heads"], f"{p}/context_split", perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [f"{p}/context_split", f"{p}/merged"], list(a.out.output),
                             name=f"{p}/context")]


def fold_attention_shapes(model: onnx.ModelProto) -> Folding:
    """Rewrite ``model`` in place where the export's attention pattern matches exactly and the values it
    depends on (one constant Q and one K factor, one head count, a padding-only mask with one masked
    value) check out on :func:`probe_feeds`. A graph that is not an encoder is left alone."""
    graph = model.graph
    if not _is_encoder(graph):
        return Folding(why=NOT_AN_ENCODER)
    if sum(t.ByteSize() for t in graph.initializer) > MAX_WEIGHT_BYTES:
        return Folding(why="weights over protobuf's 2 GB cap")
    ix = GraphIndex(graph)
    attentions = [a for n in graph.node if n.op_type == "Softmax" and (a := _match_attention(ix, n)) is not None]
    if not attentions:
        return Folding(why="no attention of the export's form")
    feeds = probe_feeds(model)
    values = _evaluate(model, [x for a in attentions for x in (a.q_factor, a.k_factor, a.mask, a.q_heads)], feeds)
    found: list[tuple[_Attention, tuple[np.ndarray, np.ndarray], tuple[int, int], float]] = []
    for a in attentions:
        q_factor = _constant([v[a.q_factor] for v in values])
        k_factor = _constant([v[a.k_factor] for v in values])
        masks = {_mask_value(v[a.mask], f[MASK_INPUT]) for v, f in zip(values, feeds)} - {0.0}
        heads = {v[a.q_heads].shape[2:] for v in values}
        # the padded probe batch gives the masked value; the export's layers share one
        masked = masks.pop() if len(masks) == 1 else None
        if q_factor is not None and k_factor is not None and masked is not None and len(heads) == 1:
            found.append((a, (q_factor, k_factor), heads.pop(), masked))
    if not found or len({m for *_, m in found}) != 1:
        return Folding(why="attention found, but its factors, heads or mask are not the export's constants")
    mask, nodes = _mask_nodes(graph, found[0][3])
    replace = {id(a.out): _folded_nodes(graph, a, i, factors, shape, mask)
               for i, (a, factors, shape, _) in enumerate(found)}
    for n in graph.node:
        nodes.extend(replace.get(id(n), [n]))
    del graph.node[:]
    graph.node.extend(nodes)
    use_contrib_ops(model)
    drop_dead_nodes(graph)
    _unname_read_outputs(graph)
    return Folding(layers=len(found))


def _is_encoder(graph: onnx.GraphProto) -> bool:
    inputs = {i.name for i in graph.input}
    return MASK_INPUT in inputs and inputs <= ENCODER_INPUTS


def _unname_read_outputs(graph: onnx.GraphProto) -> None:
    """Drop the symbolic dim names of graph outputs that nodes also read (exposed hidden states).

    ONNX Runtime's session-time SkipLayerNormalization fusion, whose kernel rounds differently from Add +
    LayerNormalization, fires on a residual Add whose two inputs carry the same named batch and sequence
    dims. In the export the attention's closing Reshape to a computed shape hid those names from the
    attention branch; a constant shape passes them through, so a hidden state declared with named dims
    would tie the two.
    """
    read = {i for n in graph.node for i in n.input}
    for output in graph.output:
        if output.name in read:
            for dim in output.type.tensor_type.shape.dim:
                if dim.HasField("dim_param"):
                    dim.ClearField("dim_param")


def proof_feeds(model: onnx.ModelProto, rows: Sequence[Row], pad_id: int = 0) -> list[dict[str, np.ndarray]]:
    """The probe batches, then ``rows`` each alone, then the rows in right-padded batches of PROOF_BATCH
    (sorted by length, as the server groups them)."""
    names = [i.name for i in model.graph.input]
    ordered = sorted(rows, key=lambda r: len(r["input_ids"]))
    return (probe_feeds(model) + [{n: r[n][None, :] for n in names} for r in rows]
            + [pad_batch(ordered[i:i + PROOF_BATCH], names, pad_id) for i in range(0, len(ordered), PROOF_BATCH)])


def fold(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Folding]:
    """``model`` folded by :func:`fold_attention_shapes` and converters.static_dims (a copy; ``model``
    itself when nothing changed or it is no encoder graph), not proven: :func:`fold_verified` proves it,
    or the caller compares it with a graph that was."""
    if not _is_encoder(model.graph):
        return model, Folding(why=NOT_AN_ENCODER)
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    found = fold_attention_shapes(folded)
    found = Folding(layers=found.layers, why=found.why, static_dims=fold_static_dims(folded))
    return (folded if found.changed else model), found


def fold_verified(model: onnx.ModelProto, rows: Sequence[Row] = (), pad_id: int = 0) -> tuple[onnx.ModelProto, Folding]:
    """:func:`fold`, proven bit-identical to ``model`` on :func:`proof_feeds` with every PROOF_THREADS count.
    Raises FoldingMismatch when any output differs in any bit."""
    folded, found = fold(model)
    if not found.changed:
        return model, found
    feeds = proof_feeds(model, rows, pad_id)
    for threads in PROOF_THREADS:
        want, got = proof_session(model, threads), proof_session(folded, threads)
        for i, f in enumerate(feeds):
            pairs = zip(want.run(None, f), got.run(None, f))
            if any(w.shape != g.shape or w.tobytes() != g.tobytes() for w, g in pairs):
                raise FoldingMismatch(f"the graph with {found.layers} attentions and {found.static_dims} static "
                                      f"dimensions folded differs from the export on proof batch {i} with "
                                      f"{threads} thread(s)")
    return folded, Folding(layers=found.layers, why=found.why, forwards=len(feeds) * len(PROOF_THREADS),
                           static_dims=found.static_dims)


def fold_file(graph: Path, rows: Sequence[Row], pad_id: int, work: Path,
              external_above: int = EXTERNAL_DATA_BYTES) -> tuple[Path, Folding]:
    """The graph file a package ships: ``graph`` folded by :func:`fold_verified` and saved under
    ``work``/folded (weights beside it past ``external_above`` bytes, as the export was), or ``graph``
    itself when nothing folded."""
    folded, found = fold_verified(onnx.load(str(graph)), rows, pad_id)
    if not found.changed:
        return graph, found
    path = work / "folded" / graph.name
    path.parent.mkdir(parents=True, exist_ok=True)
    save_graph(folded, path, external_above)
    return path, found
