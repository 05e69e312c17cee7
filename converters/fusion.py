"""ONNX Runtime's fused attention kernel in place of an exported encoder's attention subgraph, bit for bit.

Optimum's BERT-family exports spell self-attention as ~26 small ops a layer: reshapes to heads whose
shapes come from Shape/Gather/Unsqueeze/Concat chains, the 1/sqrt(head size) factor from a
Shape/Slice/Cast/Sqrt/Div chain, transposes and a Mul for Q and K, the QK MatMul, the additive mask,
Softmax, the PV MatMul, the transpose and the reshape back; and one ~15-op chain builds the mask.
ORT_ENABLE_ALL folds none of it on the CPU: a Shape of a tensor with a dynamic axis is no constant,
and its own attention fusion wants an older export's pattern.

:func:`fuse_encoder` rewrites each such attention as
``com.microsoft.MultiHeadAttention(q * a, k * a, v, key_padding_mask)`` with ``scale`` 1: the same
Mul by the export's own factor a (read from the graph as ONNX Runtime computes it), then the same MLAS
SGEMM per (row, head), the same softmax (MlasComputeSoftmax) and PV product, without the reshapes,
transposes and shape chains. The mask is the attention mask cast to int32 once, with
``mask_filter_value`` the export's own additive value. Nothing else is touched, and anything the
pattern does not match exactly (another export's attention, a causal mask) stays as it was.

:func:`fuse_verified` proves the fused graph bit-identical to the unfused one on the rows it is given
(alone and in right-padded batches, with 1 and 2 intra-op threads) and refuses it otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from converters.verify import Row, pad_batch

MS_DOMAIN = "com.microsoft"
FUSED_OP = "MultiHeadAttention"
#: The graph inputs an encoder's fusion reads (Optimum's BERT-family names).
MASK_INPUT = "attention_mask"
ENCODER_INPUTS = frozenset({"input_ids", MASK_INPUT, "token_type_ids"})
#: The export's additive mask must push a masked score at least this far down: far below MLAS's exp
#: range (-88.4), so a masked key's weight is the same clamped value whatever the mask value was.
MASK_FLOOR = -1e4
#: Node and tensor names this module adds start with this.
PREFIX = "er_fuse"
#: Graphs whose weights pass this are left alone: the proof serializes both graphs (protobuf's 2 GB cap).
MAX_WEIGHT_BYTES = 1_800_000_000
#: Intra-op thread counts the proof runs both graphs with (kernels split their work by thread).
PROOF_THREADS = (1, 2)
#: Rows per padded batch in the proof.
PROOF_BATCH = 8


class FusionMismatch(ValueError):
    """The fused graph's outputs differ from the unfused graph's: the converter refuses to ship it."""


@dataclass(frozen=True)
class Fusions:
    """How many attentions :func:`fuse_encoder` fused (0: ``why`` says why none), and how many forwards
    proved the fused graph bit-identical (:func:`fuse_verified`)."""

    attention: int = 0
    why: str = ""
    forwards: int = 0

    def describe(self) -> dict[str, Any]:
        """The card's record of the fusion and its proof."""
        return {"kernels": {FUSED_OP: self.attention}, "bit_identical_forwards": self.forwards,
                "threads": list(PROOF_THREADS)}


@dataclass(frozen=True)
class _Attention:
    """One matched self-attention: its three [B, S, hidden] inputs, the tensors whose values the
    rewrite needs (the Q and K factors, the additive mask, Q split into heads) and its last node."""

    q: str
    k: str
    v: str
    q_factor: str
    k_factor: str
    mask: str
    q_heads: str
    out: onnx.NodeProto


class _Index:
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


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _heads(ix: _Index, name: str, perm: list[int]) -> tuple[str, str] | None:
    """(x, heads) when ``name`` is Transpose(perm) of heads = Reshape(x, [B, S, H, D])."""
    t = ix.made_by(name, "Transpose")
    if t is None or list(_attr(t, "perm", [])) != perm:
        return None
    r = ix.made_by(t.input[0], "Reshape")
    return (r.input[0], r.output[0]) if r is not None else None


def _scaled_heads(ix: _Index, name: str, perm: list[int]) -> tuple[str, str, str] | None:
    """(x, factor, heads) when ``name`` is Mul(Transpose(perm) of Reshape(x), factor)."""
    m = ix.made_by(name, "Mul")
    if m is None:
        return None
    for split, factor in ((m.input[0], m.input[1]), (m.input[1], m.input[0])):
        found = _heads(ix, split, perm)
        if found is not None:
            return found[0], factor, found[1]
    return None


def _match_attention(ix: _Index, softmax: onnx.NodeProto) -> _Attention | None:
    """The export's attention around ``softmax``, or None where any piece differs."""
    add = ix.made_by(softmax.input[0], "Add")
    if _attr(softmax, "axis", -1) != -1 or add is None:
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
    if v is None or back is None or list(_attr(back, "perm", [])) != [0, 2, 1, 3]:
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


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
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
    session = _session(probe, 1)
    return [dict(zip(wanted, session.run(wanted, f))) for f in feeds]


def _mask_value(mask: np.ndarray, attention_mask: np.ndarray) -> float | None:
    """The export's additive value for masked keys when ``mask`` ([B, 1, 1 or S, T], every query row
    alike) is exactly 0 at the attention mask's ones and one value (at most MASK_FLOOR) at its zeros;
    0.0 when nothing is masked; None when it is anything else (a causal mask, a bias, another layout)."""
    b, t = attention_mask.shape
    if mask.ndim != 4 or mask.shape[:2] != (b, 1) or mask.shape[3] != t or mask.dtype != np.float32:
        return None
    if not np.all(mask == mask[:, :, :1, :]):
        return None
    row = mask[:, 0, 0, :]
    real, masked = row[attention_mask != 0], row[attention_mask == 0]
    if not np.all(real == 0):
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


def fuse_encoder(model: onnx.ModelProto) -> Fusions:
    """Rewrite ``model`` in place with MultiHeadAttention where the export's attention pattern matches
    exactly and the values it depends on (constant Q and K factors, one head count, a padding-only
    mask) check out on :func:`probe_feeds`. A graph that is not an encoder is left alone."""
    graph = model.graph
    inputs = {i.name for i in graph.input}
    if MASK_INPUT not in inputs or not inputs <= ENCODER_INPUTS:
        return Fusions(why="not an encoder graph (input_ids, attention_mask, token_type_ids)")
    if sum(t.ByteSize() for t in graph.initializer) > MAX_WEIGHT_BYTES:
        return Fusions(why="weights over protobuf's 2 GB cap")
    ix = _Index(graph)
    attentions = [a for n in graph.node if n.op_type == "Softmax" and (a := _match_attention(ix, n)) is not None]
    if not attentions:
        return Fusions(why="no attention of the export's form")
    feeds = probe_feeds(model)
    values = _evaluate(model, [x for a in attentions for x in (a.q_factor, a.k_factor, a.mask, a.q_heads)], feeds)
    key_mask = f"{PREFIX}/key_padding_mask"
    replace: dict[int, list[onnx.NodeProto]] = {}
    for i, a in enumerate(attentions):
        q_factor = _constant([v[a.q_factor] for v in values])
        k_factor = _constant([v[a.k_factor] for v in values])
        masks = [_mask_value(v[a.mask], f[MASK_INPUT]) for v, f in zip(values, feeds)]
        heads = {v[a.q_heads].shape[2] for v in values}
        # the last probe batch is padded: its masked value is the one the kernel must write
        if q_factor is None or k_factor is None or None in masks or masks[-1] == 0.0 or len(heads) != 1:
            continue
        p = f"{PREFIX}/attention_{i}"
        graph.initializer.extend([numpy_helper.from_array(q_factor, f"{p}/q_factor"),
                                  numpy_helper.from_array(k_factor, f"{p}/k_factor")])
        replace[id(a.out)] = [
            helper.make_node("Mul", [a.q, f"{p}/q_factor"], [f"{p}/q"], name=f"{p}/QFactor"),
            helper.make_node("Mul", [a.k, f"{p}/k_factor"], [f"{p}/k"], name=f"{p}/KFactor"),
            helper.make_node(FUSED_OP, [f"{p}/q", f"{p}/k", a.v, "", key_mask], list(a.out.output),
                             name=f"{p}/{FUSED_OP}", domain=MS_DOMAIN, num_heads=heads.pop(), scale=1.0,
                             mask_filter_value=masks[-1])]
    if not replace:
        return Fusions(why="attention found, but its factors, heads or mask are not the export's constants")
    nodes = [helper.make_node("Cast", [MASK_INPUT], [key_mask], name=f"{key_mask}/Cast", to=TensorProto.INT32)]
    for n in graph.node:
        nodes.extend(replace.get(id(n), [n]))
    del graph.node[:]
    graph.node.extend(nodes)
    drop_dead_nodes(graph)
    _unname_read_outputs(graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return Fusions(attention=len(replace))


def _unname_read_outputs(graph: onnx.GraphProto) -> None:
    """Drop the symbolic dim names of graph outputs that nodes also read (exposed hidden states).

    ONNX Runtime's session-time SkipLayerNormalization fusion, whose kernel rounds differently from Add +
    LayerNormalization, fires on a residual Add whose two inputs carry the same named batch and sequence
    dims. In the export the attention's closing Reshape hid those names from the attention branch; the
    fused kernel passes them through, so a hidden state declared with named dims would tie the two.
    """
    read = {i for n in graph.node for i in n.input}
    for output in graph.output:
        if output.name in read:
            for dim in output.type.tensor_type.shape.dim:
                if dim.HasField("dim_param"):
                    dim.ClearField("dim_param")


def drop_dead_nodes(graph: onnx.GraphProto) -> None:
    """Remove the nodes no graph output depends on, then the initializers nothing reads."""
    needed = {o.name for o in graph.output}
    live: list[onnx.NodeProto] = []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output):
            live.append(n)
            needed.update(i for i in n.input if i)
    del graph.node[:]
    graph.node.extend(reversed(live))
    keep = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def proof_feeds(model: onnx.ModelProto, rows: Sequence[Row], pad_id: int = 0) -> list[dict[str, np.ndarray]]:
    """The probe batches, then ``rows`` each alone, then the rows in right-padded batches of PROOF_BATCH
    (sorted by length, as the server groups them)."""
    names = [i.name for i in model.graph.input]
    ordered = sorted(rows, key=lambda r: len(r["input_ids"]))
    return (probe_feeds(model) + [{n: r[n][None, :] for n in names} for r in rows]
            + [pad_batch(ordered[i:i + PROOF_BATCH], names, pad_id) for i in range(0, len(ordered), PROOF_BATCH)])


def fuse_verified(model: onnx.ModelProto, rows: Sequence[Row] = (), pad_id: int = 0) -> tuple[onnx.ModelProto, Fusions]:
    """``model`` fused by :func:`fuse_encoder` (a copy; ``model`` itself when nothing matched), proven
    bit-identical to ``model`` on :func:`proof_feeds` with every PROOF_THREADS count. Raises
    FusionMismatch when any output differs in any bit."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    found = fuse_encoder(fused)
    if not found.attention:
        return model, found
    feeds = proof_feeds(model, rows, pad_id)
    for threads in PROOF_THREADS:
        want, got = _session(model, threads), _session(fused, threads)
        for i, f in enumerate(feeds):
            pairs = zip(want.run(None, f), got.run(None, f))
            if any(w.shape != g.shape or w.tobytes() != g.tobytes() for w, g in pairs):
                raise FusionMismatch(f"the graph with {found.attention} fused attentions differs from the unfused "
                                     f"one on proof batch {i} with {threads} thread(s)")
    return fused, Fusions(attention=found.attention, forwards=len(feeds) * len(PROOF_THREADS))
