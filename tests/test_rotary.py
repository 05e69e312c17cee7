"""ModernBERT's rotary embedding as ONNX Runtime's RotaryEmbedding kernel (converters.rotary).

The graphs here are small hand-built ones in the form TorchScript exports ModernBERT's rotation of Q:
``q * cos + cat(-q[..., h:], q[..., :h]) * sin`` with cos and sin computed once from the positions (the
halves of each table equal), q in [batch, heads, tokens, head size].
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.rotary import TOLERANCE, RotaryMismatch, fuse_rotary, fuse_verified

HEADS, HEAD = 2, 8


def _rotation_graph(swap_halves: bool = False) -> onnx.ModelProto:
    """q [batch, HEADS, tokens, HEAD] rotated by tables built from the token count, as the export does;
    ``swap_halves`` builds a rotation the kernel does not compute (rotate_half with the halves swapped)."""
    half = HEAD // 2
    freqs = (1.0 / 10000 ** (np.arange(0, HEAD, 2) / HEAD)).astype(np.float32)
    first, second = ("q_hi", "q_lo") if swap_halves else ("q_lo", "q_hi")
    nodes = [
        helper.make_node("Shape", ["q"], ["q_shape"], start=2, end=3),
        helper.make_node("Squeeze", ["q_shape"], ["tokens"]),
        helper.make_node("Cast", ["tokens"], ["tokens_f"], to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero_f", "tokens_f", "one_f"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "axis1"], ["pos_col"]),
        helper.make_node("Mul", ["pos_col", "freqs"], ["angles"]),  # [tokens, HEAD / 2]
        helper.make_node("Concat", ["angles", "angles"], ["emb"], axis=-1),
        helper.make_node("Cos", ["emb"], ["cos2"]), helper.make_node("Sin", ["emb"], ["sin2"]),
        helper.make_node("Unsqueeze", ["cos2", "axes01"], ["cos"]),
        helper.make_node("Unsqueeze", ["sin2", "axes01"], ["sin"]),
        helper.make_node("Slice", ["q", "start0", "mid", "last"], ["q_lo"]),
        helper.make_node("Slice", ["q", "mid", "end", "last"], ["q_hi"]),
        helper.make_node("Neg", [second], ["neg"]),
        helper.make_node("Concat", ["neg", first], ["rotated"], axis=-1),
        helper.make_node("Mul", ["q", "cos"], ["direct"]),
        helper.make_node("Mul", ["rotated", "sin"], ["turned"]),
        helper.make_node("Add", ["direct", "turned"], ["out"]),
    ]
    consts = {"zero_f": np.array(0, np.float32), "one_f": np.array(1, np.float32), "freqs": freqs,
              "axis1": np.array([1], np.int64), "axes01": np.array([0, 1], np.int64),
              "start0": np.array([0], np.int64), "mid": np.array([half], np.int64),
              "end": np.array([2**62], np.int64), "last": np.array([-1], np.int64)}
    graph = helper.make_graph(
        nodes, "rotation", [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", HEADS, "tokens", HEAD])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{"q": (rng.standard_normal((b, HEADS, t, HEAD)) * 3).astype(np.float32)} for b, t in ((1, 5), (3, 17))]


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]


def test_the_rotation_becomes_one_kernel_within_an_ulp() -> None:
    model = _rotation_graph()
    fused, count, worst = fuse_verified(model, _feeds())
    assert count == 1 and worst <= TOLERANCE
    ops = [n.op_type for n in fused.graph.node]
    assert "RotaryEmbedding" in ops and not {"Neg", "Add"} & set(ops)
    for feed in _feeds():
        want, got = _run(model, feed), _run(fused, feed)
        assert want.shape == got.shape and np.allclose(want, got, rtol=0, atol=1e-5)
    # each element from its own token: a row batched equals the row alone
    feed = _feeds()[1]
    alone = _run(fused, {"q": feed["q"][1:2]})
    assert np.array_equal(alone, _run(fused, feed)[1:2])


def test_a_rotation_the_kernel_does_not_compute_is_refused() -> None:
    """The match is structural; the check against the export is what keeps a look-alike out."""
    with pytest.raises(RotaryMismatch):
        fuse_verified(_rotation_graph(swap_halves=True), _feeds())


def test_a_graph_without_rotations_is_left_alone() -> None:
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert fuse_rotary(model) == 0 and [n.op_type for n in model.graph.node] == ["Neg"]
