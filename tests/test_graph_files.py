"""converters.graph_files: a graph's weights gathered into one ``.onnx.data`` file, streamed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from converters.graph_files import ALIGNMENT, data_file, gather_graph


def _graph() -> onnx.ModelProto:
    """y = relu(x @ w1 + b) @ w2 with weights of a few KB each and one tiny bias (stays inline)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 48)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((48, 8)).astype(np.float32), "w2")
    b = numpy_helper.from_array(rng.standard_normal(48).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 8])], [w1, w2, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    return session.run(["y"], {"x": x})[0]


def _locations(path: Path) -> dict[str, tuple[str, int]]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: (ExternalDataInfo(t).location, int(ExternalDataInfo(t).offset or 0))
            for t in model.graph.initializer if uses_external_data(t)}


def test_one_file_per_weight_becomes_one_data_file(tmp_path) -> None:
    """What torch.onnx writes past 2 GB (a file per weight) is gathered, byte for byte, into one."""
    single = tmp_path / "single" / "model.onnx"
    single.parent.mkdir()
    onnx.save(_graph(), str(single))
    spread = tmp_path / "spread" / "model.onnx"
    spread.parent.mkdir()
    onnx.save(_graph(), str(spread), save_as_external_data=True, all_tensors_to_one_file=False,
              size_threshold=1024)
    assert {p.name for p in spread.parent.iterdir()} == {"model.onnx", "w1", "w2"}

    files = gather_graph(spread, external_above=1 << 40)  # spread files are gathered at any threshold
    assert files == [spread, data_file(spread)]
    assert {p.name for p in spread.parent.iterdir()} == {"model.onnx", "model.onnx.data"}
    located = _locations(spread)
    assert set(located) == {"w1", "w2"} and all(loc == "model.onnx.data" for loc, _ in located.values())
    assert all(offset % ALIGNMENT == 0 for _, offset in located.values())
    assert np.array_equal(_run(spread), _run(single))


def test_inline_weights_move_out_above_the_threshold_and_stay_below_it(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(_graph(), str(path))
    want = _run(path)
    assert gather_graph(path) == [path] and not data_file(path).exists()  # a small graph stays one file
    assert gather_graph(path, external_above=0) == [path, data_file(path)]
    assert set(_locations(path)) == {"w1", "w2"}  # the 192-byte bias stays inside the graph
    assert np.array_equal(_run(path), want)
    assert gather_graph(path, external_above=0) == [path, data_file(path)]  # again: the same files
    assert np.array_equal(_run(path), want)


def test_constants_written_as_external_data_move_too(tmp_path: Path) -> None:
    """An exporter may write a large Constant node's value to the data file too (Optimum does for
    Qwen3-Embedding-0.6B); it moves with the weights, so no tensor points at a removed file."""
    model = _graph()
    value = numpy_helper.from_array(np.random.default_rng(2).standard_normal((48, 8)).astype(np.float32), "c")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["w2c"], value=value))
    model.graph.node[-1].input[1] = "w2c"
    del model.graph.initializer[1]  # w2 now comes from the Constant node
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx_data", size_threshold=1024, convert_attribute=True)
    expected = _run(path)
    assert gather_graph(path, external_above=1 << 40) == [path, data_file(path)]
    assert {p.name for p in tmp_path.iterdir()} == {"model.onnx", "model.onnx.data"}
    assert np.array_equal(_run(path), expected)
