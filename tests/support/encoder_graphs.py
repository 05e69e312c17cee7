"""Tiny ONNX encoder graphs built with onnx.helper, and their rows: the engine's test subjects.

``encoder_graph`` is batch-invariant unless ``mix`` makes it depend on the batch, on padding or on the
batch's shape (as a GPU's kernels may); ``reference`` is the invariant graph's answer in numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB = 50
HIDDEN = 8


@dataclass
class Row:
    ids: np.ndarray
    type_ids: np.ndarray


def random_rows(seed: int) -> Callable[[int], Row]:
    """A make_row for the probe: a new random row on every call."""
    rng = np.random.default_rng(seed)

    def make(n: int) -> Row:
        return Row(rng.integers(1, VOCAB, size=n, dtype=np.int64), (np.arange(n) >= n // 2).astype(np.int64))

    return make


def make_row(n: int, seed: int = 0, first: int | None = None) -> Row:
    rng = np.random.default_rng(seed * 1000 + n)
    ids = rng.integers(1, VOCAB, size=n, dtype=np.int64)
    if first is not None:
        ids[0] = first
    type_ids = np.zeros(n, dtype=np.int64)
    type_ids[n // 2 :] = 1
    return Row(ids, type_ids)


# ---- graphs ------------------------------------------------------------------------------------


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "emb": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
        "temb": rng.standard_normal((2, HIDDEN)).astype(np.float32),
        "w": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32),
    }


def encoder_graph(path: Path, *, mix: str | None = None, type_ids: bool = True) -> Path:
    """Embedding Gather (+ type embedding) -> MatMul -> Tanh -> masked, plus h[:, 0] as pooler_output.

    mix="batch" adds the mean over the batch axis (answers depend on the batch: probe says alone);
    mix="padding" adds a term of the padded width (padding changes rows, equal lengths do not:
    equal_length). (An unmasked ReduceMean over the sequence axis is no good here: ORT's result
    for a row already differs in the last bit between batch 1 and batch 2.)
    mix="tail" adds a term of the padded width modulo 8, as ONNX Runtime's softmax on ARM cores without
    SVE rounds by how a row's tail falls against its 8-wide blocks: rows padded to a multiple of 8 agree.
    mix="shape" adds a term of the batch's rows and width, as a GPU whose kernels choose by shape
    can: only forwards of one fixed shape agree (the probe's fixed-row buckets, tests/test_gpu_batching.py).
    """
    w = _weights()
    inits = [numpy_helper.from_array(w["emb"], "emb"), numpy_helper.from_array(w["w"], "w")]
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "last_axis"))
    inits.append(numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"))
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["e"])]
    if type_ids:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", "sequence"]))
        inits.append(numpy_helper.from_array(w["temb"], "temb"))
        nodes += [
            helper.make_node("Gather", ["temb", "token_type_ids"], ["t"]),
            helper.make_node("Add", ["e", "t"], ["x"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["e"], ["x"]))
    nodes += [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Tanh", ["y"], ["h"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "last_axis"], ["m"]),
        helper.make_node("Mul", ["h", "m"], ["z"]),
    ]
    if mix == "batch":
        nodes += [
            helper.make_node("ReduceMean", ["z"], ["bm"], axes=[0], keepdims=1),
            helper.make_node("Add", ["z", "bm"], ["out"]),
        ]
    elif mix == "shape":
        # adds 1e-3 x (rows x 1000 + width): equal for two forwards of one shape only
        inits += [numpy_helper.from_array(np.array([0], dtype=np.int64), "first"),
                  numpy_helper.from_array(np.array([1], dtype=np.int64), "second"),
                  numpy_helper.from_array(np.array(1000.0, dtype=np.float32), "per_row"),
                  numpy_helper.from_array(np.array(1e-3, dtype=np.float32), "step")]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "first"], ["rows"]),
            helper.make_node("Gather", ["shape", "second"], ["width"]),
            helper.make_node("Cast", ["rows"], ["rows_f"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["rows_f", "per_row"], ["rows_term"]),
            helper.make_node("Add", ["rows_term", "width_f"], ["code"]),
            helper.make_node("Mul", ["code", "step"], ["shift"]),
            helper.make_node("Add", ["z", "shift"], ["out"]),
        ]
    elif mix == "tail":
        # adds 0.01 x (padded width mod 8): zero whenever the width is a multiple of 8
        inits += [numpy_helper.from_array(np.array([1], dtype=np.int64), "one"),
                  numpy_helper.from_array(np.array([8], dtype=np.int64), "block"),
                  numpy_helper.from_array(np.array(0.01, dtype=np.float32), "scale")]
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["width"]),
            helper.make_node("Mod", ["width", "block"], ["tail"]),
            helper.make_node("Cast", ["tail"], ["tail_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["tail_f", "scale"], ["shift"]),
            helper.make_node("Add", ["z", "shift"], ["out"]),
        ]
    elif mix == "padding":
        # adds 0.01 x the padded width: the same for rows of equal length, shifted by any padding
        inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "one"))
        inits.append(numpy_helper.from_array(np.array(0.01, dtype=np.float32), "scale"))
        nodes += [
            helper.make_node("Shape", ["input_ids"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["width"]),
            helper.make_node("Cast", ["width"], ["width_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["width_f", "scale"], ["shift"]),
            helper.make_node("Add", ["z", "shift"], ["out"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["z"], ["out"]))
    nodes += [
        helper.make_node("Identity", ["out"], ["last_hidden_state"]),
        helper.make_node("Gather", ["out", "zero"], ["pooler_output"], axis=1),
    ]
    outputs = [
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]),
        helper.make_tensor_value_info("pooler_output", TensorProto.FLOAT, ["batch", HIDDEN]),
    ]
    graph = helper.make_graph(nodes, "tiny_encoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def failing_graph(path: Path) -> Path:
    """Reshapes the ids to [1, 3]: runs for one row of 3 tokens, fails for anything else."""
    inits = [numpy_helper.from_array(np.array([1, 3], dtype=np.int64), "shape")]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"]),
    ]
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Reshape", ["f", "shape"], ["logits"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])]
    graph = helper.make_graph(nodes, "fails", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, path)
    return path


def reference(row: Row, *, type_ids: bool = True) -> np.ndarray:
    """The invariant graph's last_hidden_state for one row, in numpy."""
    w = _weights()
    x = w["emb"][row.ids] + (w["temb"][row.type_ids] if type_ids else 0)
    return np.tanh(x @ w["w"])
