"""The exact int8 graph's two bodies (converters.small_forward): forwards of up to the recipe's token count
run the body built for small forwards (fewer, wider kernels), larger ones the other; the answers are the
same bits either way, alone and batched, so the join changes no output; bodies that differ are refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from converters import small_forward
from converters.quantize import CALIBRATED_RECIPE, Int8Recipe, quantize_int8_exact
from converters.verify import Row, pad_batch
from edge_runtime.engine.session import session_options

INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
LIMIT = CALIBRATED_RECIPE.small_forward_tokens


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny fixture encoder's exact int8 graph with both bodies ("joined") and with one ("one")."""
    from transformers import BertModel

    from converters import onnx_export
    from converters.encoder.fixture import build_source

    root = tmp_path_factory.mktemp("small-forward")
    model = BertModel.from_pretrained(build_source("embedding", root / "source")).eval()
    export = onnx_export.export_onnx(model, "embedding", root / "onnx", layers=[1])
    rows = _rows((3, 9, 17, 40, 100))
    one = dataclasses.replace(CALIBRATED_RECIPE, small_forward_tokens=0)
    return {"joined": quantize_int8_exact(export, root / "joined.onnx", CALIBRATED_RECIPE, rows),
            "one": quantize_int8_exact(export, root / "one.onnx", one, rows)}


def _rows(lengths: tuple[int, ...], seed: int = 3) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(5, 1000, n).astype(np.int64), "attention_mask": np.ones(n, np.int64),
             "token_type_ids": np.zeros(n, np.int64)} for n in lengths]


def _forwards() -> list[dict[str, np.ndarray]]:
    """Forwards on both sides of the limit: rows alone (3 to 100 tokens), two short rows together (small),
    and five rows padded to 100 (large)."""
    alone = [{n: r[n][None, :] for n in INPUTS} for r in _rows((2, 11, LIMIT, LIMIT + 1, 100), seed=7)]
    return [*alone, pad_batch(_rows((5, 17), seed=8), INPUTS, 0), pad_batch(_rows((4, 30, 51, 9, 100)), INPUTS, 0)]


def _run(graph: Path | bytes, threads: int) -> list[list[np.ndarray]]:
    source = str(graph) if isinstance(graph, Path) else graph
    session = ort.InferenceSession(source, session_options(threads), providers=["CPUExecutionProvider"])
    return [session.run(None, feeds) for feeds in _forwards()]


def test_the_joined_graph_answers_as_one_body_does(graphs: dict[str, Path]) -> None:
    for threads in (1, 2):
        for joined, one in zip(_run(graphs["joined"], threads), _run(graphs["one"], threads)):
            assert all(a.tobytes() == b.tobytes() for a, b in zip(joined, one))


def test_the_small_body_runs_fewer_kernels(graphs: dict[str, Path], tmp_path: Path) -> None:
    """Each body as ONNX Runtime optimises it: the one for small forwards has fewer kernels; the other is
    the one-body graph itself."""
    large, small = small_forward.bodies(onnx.load(str(graphs["joined"])))
    one = onnx.load(str(graphs["one"]))
    assert [n.SerializeToString() for n in large.graph.node] == [n.SerializeToString() for n in one.graph.node]

    def kernels(model: onnx.ModelProto) -> int:
        options = session_options(1)
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return len(onnx.load(str(tmp_path / "optimized.onnx")).graph.node)

    assert kernels(small) < kernels(large)
    ops = [n.op_type for n in small.graph.node]
    assert "TokenScale" not in " ".join(n.name for n in small.graph.node) and "ReduceMin" not in ops


def _tampered(small: onnx.ModelProto) -> onnx.ModelProto:
    """``small`` with the channel scale of its first integer GEMM doubled."""
    tampered = onnx.ModelProto()
    tampered.CopyFrom(small)
    name = next(n.input[3] for n in tampered.graph.node if n.op_type == "MatMulIntegerToFloat")
    init = next(t for t in tampered.graph.initializer if t.name == name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(2), name))
    return tampered


def test_each_forward_takes_the_body_its_size_picks(graphs: dict[str, Path]) -> None:
    """With a small body that answers otherwise (joined without the check), exactly the forwards of at most
    the limit's tokens change."""
    large, small = small_forward.bodies(onnx.load(str(graphs["joined"])))
    joined = small_forward.join(large, _tampered(small), LIMIT)
    for feeds, got, want in zip(_forwards(), _run(joined.SerializeToString(), 1), _run(graphs["one"], 1)):
        same = all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
        assert same == (feeds["input_ids"].size > LIMIT), feeds["input_ids"].shape


def test_bodies_that_differ_are_refused(graphs: dict[str, Path]) -> None:
    large, small = small_forward.bodies(onnx.load(str(graphs["joined"])))
    rows = _rows((3, 9, 17))
    assert small_forward.check_same_bits(large, small, rows) == len(rows) + 2  # the batch at 1 and 2 threads
    with pytest.raises(small_forward.BodiesDiffer):
        small_forward.check_same_bits(large, _tampered(small), rows)


def test_the_recipe_records_the_limit() -> None:
    assert Int8Recipe.from_card(CALIBRATED_RECIPE.describe()) == CALIBRATED_RECIPE
    assert CALIBRATED_RECIPE.describe()["small_forward_tokens"] == LIMIT > 0
    with pytest.raises(ValueError, match="small_forward_tokens"):
        Int8Recipe(small_forward_tokens=-1).check()
