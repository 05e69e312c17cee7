"""Matmul outputs read only in pieces, quantized one piece at a time (converters.matmul_pieces): the same bits.

Small hand-built graphs in the forms ModernBERT's export takes: GeGLU's two Slices of Wi's output, and
Wqkv's output reshaped to [batch, seq, 3, heads, head size], transposed, split and squeezed into Q, K, V.
The exact int8 of each is compared with the same quantization done without pieces.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from converters import quantize
from converters.matmul_pieces import Plan, plan_pieces
from converters.quantize import Int8Recipe, quantize_int8_exact

K, HEADS, HEAD = 16, 2, 4
WIDTH = HEADS * HEAD
RECIPES = {"plain": Int8Recipe(weight_max=64),
           "smoothed, outliers": Int8Recipe(weight_max=64, smooth_alpha=0.6, outliers=2)}


def _ints(name: str, value: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.int64), name)


def _model(nodes: list[onnx.NodeProto], outputs: list[str], weights: dict[str, np.ndarray],
           ints: dict[str, list[int]]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "pieces", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", K])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [*(numpy_helper.from_array(w, n) for n, w in weights.items()), *(_ints(n, v) for n, v in ints.items())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def geglu(step: int = 1) -> onnx.ModelProto:
    """x @ Wi, cut into halves by two Slices of the last axis (``step`` 2: every other column instead)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "wi"], ["y"]),
             helper.make_node("Slice", ["y", "zero", "half", "last", "step"], ["gate"]),
             helper.make_node("Slice", ["y", "half", "end", "last", "step"], ["up"]),
             helper.make_node("Erf", ["gate"], ["act"]),
             helper.make_node("Mul", ["act", "up"], ["h"]),
             helper.make_node("MatMul", ["h", "wo"], ["out"])]
    return _model(nodes, ["out"], {"wi": rng.normal(size=(K, 2 * WIDTH)).astype(np.float32),
                                   "wo": rng.normal(size=(WIDTH, K)).astype(np.float32)},
                  {"zero": [0], "half": [WIDTH], "end": [2**62], "last": [-1], "step": [step]})


def qkv() -> onnx.ModelProto:
    """x @ Wqkv viewed as [batch, seq, 3, heads, head], transposed to [batch, heads, 3, seq, head], split
    on the 3 and squeezed: Q, K, V as [batch, heads, seq, head]."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "wqkv"], ["y"]),
             helper.make_node("Reshape", ["y", "target"], ["y5"]),
             helper.make_node("Transpose", ["y5"], ["t"], perm=[0, 3, 2, 1, 4]),
             helper.make_node("Split", ["t", "ones"], ["q3", "k3", "v3"], axis=2),
             *(helper.make_node("Squeeze", [f"{n}3", "axis2"], [n]) for n in "qkv"),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("MatMul", ["scores", "v"], ["out"])]
    return _model(nodes, ["out"], {"wqkv": rng.normal(size=(K, 3 * WIDTH)).astype(np.float32)},
                  {"target": [0, -1, 3, HEADS, HEAD], "ones": [1, 1, 1], "axis2": [2]})


def _rows(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(int(rng.integers(3, 9)), K)).astype(np.float32)} for _ in range(count)]


def _quantized(model: onnx.ModelProto, tmp: Path, name: str, recipe: Int8Recipe) -> ort.InferenceSession:
    src = tmp / f"{name}.fp32.onnx"
    onnx.save(model, src)
    dst = quantize_int8_exact(src, tmp / f"{name}.int8.onnx", recipe, _rows(6, 2))
    return ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("recipe", RECIPES, ids=list(RECIPES))
@pytest.mark.parametrize("build, pieces", [(geglu, 2), (qkv, 3)], ids=["geglu slices", "qkv unbind"])
def test_pieces_give_the_same_bits(build, pieces, recipe, tmp_path, monkeypatch) -> None:
    model = build()
    plan = plan_pieces(model, {"y": int(model.graph.initializer[0].dims[1])})
    assert [len(p) for p in plan.pieces.values()] == [pieces]
    pieced = _quantized(model, tmp_path, "pieced", RECIPES[recipe])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "pieced.int8.onnx")).graph.node]
    assert "Slice" not in ops and "Split" not in ops and "Squeeze" not in ops
    assert ops.count("MatMulIntegerToFloat") == pieces + (build is geglu)
    monkeypatch.setattr(quantize, "plan_pieces", lambda model, matmuls: Plan())
    whole = _quantized(model, tmp_path, "whole", RECIPES[recipe])
    x = np.random.default_rng(3).normal(size=(3, 7, K)).astype(np.float32)
    x[1, 5:] = 0.0  # a padded row's zeros take the eps scale
    a, b = pieced.run(None, {"x": x})[0], whole.run(None, {"x": x})[0]
    assert a.shape == b.shape and np.array_equal(a, b)


def test_slices_not_of_constant_unit_steps_stay_whole() -> None:
    model = geglu(step=2)
    assert plan_pieces(model, {"y": 2 * WIDTH}).pieces == {}
    shared = qkv()
    shared.graph.output.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, None))  # read whole too
    assert plan_pieces(shared, {"y": 3 * WIDTH}).pieces == {}
