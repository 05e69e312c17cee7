"""Static dimension picks written as constants (converters.static_dims): the same bits, fewer kernels.

The graphs here are small hand-built ones in the form TorchScript exports ModernBERT's attention: an
SDPA scale computed from ``Shape`` of Q, a rotary half split at ``head size // 2``, and a Reshape whose
target takes the batch size from a ``Shape``.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters.static_dims import fold_static_dims

HEAD = 64  # sqrt(1 / sqrt(64)) is no power of two: a scale fused into the MatMul rounds differently


def _const(name: str, value: list[int] | int | float) -> onnx.NodeProto:
    array = np.array(value, np.float32 if isinstance(value, float) else np.int64)
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def _attention_like() -> onnx.ModelProto:
    """x [batch, seq, 2 * HEAD] -> Reshape to [batch, seq, 2, HEAD] (target from Shape), scaled q and k
    halves (scale from Shape of q, as SDPA's export computes it), q @ k^T, and the rotary split point
    ``Shape(q)[-1] // 2`` used by a Slice."""
    nodes = [
        _const("zero", [0]), _const("minus1", [-1]), _const("two_heads", [2, HEAD]), _const("last", [-1]),
        _const("end", [2**62]), _const("one", 1.0), _const("half", [2]), _const("start0", [0]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Gather", ["x_shape", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "minus1", "two_heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["split"]),
        helper.make_node("Split", ["split"], ["q4", "k4"], axis=2, num_outputs=2),
        helper.make_node("Squeeze", ["q4", "half_axis"], ["q"]),
        helper.make_node("Squeeze", ["k4", "half_axis"], ["k"]),
        helper.make_node("Shape", ["q"], ["q_shape"]),
        helper.make_node("Slice", ["q_shape", "last", "end"], ["head"]),
        helper.make_node("Cast", ["head"], ["head_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["head_f"], ["root"]),
        helper.make_node("Div", ["one", "root"], ["scale"]),
        helper.make_node("Sqrt", ["scale"], ["factor"]),
        helper.make_node("Mul", ["q", "factor"], ["q_scaled"]),
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 2, 1]),
        helper.make_node("Mul", ["k_t", "factor"], ["k_scaled"]),
        helper.make_node("MatMul", ["q_scaled", "k_scaled"], ["scores"]),
        helper.make_node("Div", ["head", "half"], ["mid"]),
        helper.make_node("Slice", ["q", "start0", "mid", "last"], ["q_half"]),
    ]
    graph = helper.make_graph(
        nodes, "attention_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 2 * HEAD])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("q_half", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([2], np.int64), "half_axis")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _kernels(model: onnx.ModelProto, tmp_path) -> list[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]


def test_static_picks_become_constants_with_the_same_bits(tmp_path) -> None:
    model = _attention_like()
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    assert fold_static_dims(folded) >= 2  # the head size (scale and split point); the batch piece becomes 0
    before, after = _kernels(model, tmp_path), _kernels(folded, tmp_path)
    assert "Shape" in before and after.count("Shape") == 0 and len(after) < len(before) - 5
    # K's scale moved before its transpose, which ONNX Runtime then folds into the MatMul
    assert "Transpose" in before and "Transpose" not in after and "FusedMatMul" in after
    assert "FusedMatMul" not in after or not any(  # a fused scale would show as FusedMatMul's alpha
        a.name == "alpha" and a.f != 1.0 for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node
        if n.op_type == "FusedMatMul" for a in n.attribute)
    want, got = _session(model), _session(folded)
    rng = np.random.default_rng(0)
    for batch, seq in ((1, 3), (2, 7), (5, 33)):
        x = rng.standard_normal((batch, seq, 2 * HEAD)).astype(np.float32) * 3
        for w, g in zip(want.run(None, {"x": x}), got.run(None, {"x": x})):
            assert w.shape == g.shape and w.tobytes() == g.tobytes()


def test_a_scale_onnx_runtime_may_fuse_would_change_bits() -> None:
    """Why the folded scale stays a vector: the same factor as a constant scalar is fused into the MatMul
    (alpha applied to the product) and the result rounds differently. If this ever stops holding, the
    vector is harmless; the test says so rather than pass silently."""
    model = _attention_like()
    scalar = onnx.ModelProto()
    scalar.CopyFrom(model)
    factor = np.sqrt(np.float32(1) / np.sqrt(np.float32(HEAD)))
    scalar.graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "factor_c"))
    for n in scalar.graph.node:
        for i, name in enumerate(n.input):
            if name == "factor":
                n.input[i] = "factor_c"
    x = np.random.default_rng(1).standard_normal((2, 9, 2 * HEAD)).astype(np.float32) * 3
    exported = _session(model).run(["scores"], {"x": x})[0]
    fused = _session(scalar).run(["scores"], {"x": x})[0]
    if exported.tobytes() == fused.tobytes():
        pytest.skip("this ONNX Runtime does not fuse a scalar scale here; the vector is a no-op")
    assert np.allclose(exported, fused, rtol=1e-5, atol=1e-5)


def test_dynamic_picks_stay() -> None:
    """The batch size taken for anything but a Reshape's own copy of it stays a runtime value."""
    model = _attention_like()
    model.graph.output.append(helper.make_tensor_value_info("batch", TensorProto.INT64, None))
    fold_static_dims(model)
    assert any(n.op_type == "Gather" and n.output[0] == "batch" for n in model.graph.node)
