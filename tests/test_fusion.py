"""Encoder attention as ONNX Runtime's MultiHeadAttention kernel (converters.fusion): the fused graph answers
bit for bit as the export does, alone and batched, fp32 and exact int8, with fewer kernels per forward; a
fusion that would change a bit is refused, and an attention of another form is left alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from converters import fusion
from converters.quantize import CALIBRATED_RECIPE, check_integer_products_on, quantize_int8_exact
from converters.verify import Row, pad_batch
from edge_runtime.engine import create_session
from edge_runtime.engine.session import session_options
from edge_runtime.families.registry import read_package

LAYERS = 2  # the fixture encoder's
LENGTHS = (3, 9, 17, 40, 100)
INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
OUTPUT = "last_hidden_state"


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny fixture encoder as Optimum exports it, before any fusion, with its first layer's hidden
    state exposed as an output as the fixture package does (a graph output that later layers read)."""
    from transformers import BertModel

    from converters import onnx_export
    from converters.encoder.fixture import build_source

    root = tmp_path_factory.mktemp("fusion-export")
    model = BertModel.from_pretrained(build_source("embedding", root / "source")).eval()
    return onnx_export.export_onnx(model, "embedding", root / "onnx", layers=[1])


def _rows() -> list[Row]:
    rng = np.random.default_rng(3)
    return [{"input_ids": rng.integers(5, 1000, n).astype(np.int64), "attention_mask": np.ones(n, np.int64),
             "token_type_ids": np.zeros(n, np.int64)} for n in LENGTHS]


def _kernels(model: onnx.ModelProto, tmp: Path) -> int:
    """Nodes left after ONNX Runtime's session-time optimisation (the server's pinned level)."""
    options = session_options(1)
    options.optimized_model_filepath = str(tmp / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return len(onnx.load(str(tmp / "optimized.onnx")).graph.node)


def _alone_and_batched(path: Path, rows: list[Row]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each row's last hidden state alone, and the same rows' real positions in one padded batch (2 threads)."""
    session = create_session(path, "cpu", 2)
    alone = [session.run({n: r[n][None, :] for n in INPUTS})[OUTPUT][0] for r in rows]
    batch = session.run(pad_batch(rows, INPUTS, 0))[OUTPUT]
    return alone, [batch[i, :len(r["input_ids"])] for i, r in enumerate(rows)]


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def test_fused_fp32_is_bit_identical_and_runs_fewer_kernels(export: Path, tmp_path: Path) -> None:
    model = onnx.load(str(export))
    fused, found = fusion.fuse_verified(model, _rows())
    assert found.attention == LAYERS and found.forwards > 0
    assert [n.op_type for n in fused.graph.node].count(fusion.FUSED_OP) == LAYERS
    assert "Softmax" not in [n.op_type for n in fused.graph.node]
    # each layer's ~27 attention and shape kernels become 3 (two Muls and the fused kernel), the mask's
    # chain one Cast
    before, after = _kernels(model, tmp_path), _kernels(fused, tmp_path)
    assert after <= before - 20 * LAYERS, (before, after)
    # the same answers through the server's session factory, and rows alone equal rows batched
    old_alone, old_batched = _alone_and_batched(export, _rows())
    new_alone, new_batched = _alone_and_batched(_save(fused, tmp_path / "fused.onnx"), _rows())
    for a, b, c, d in zip(old_alone, new_alone, old_batched, new_batched):
        assert a.tobytes() == b.tobytes() and c.tobytes() == d.tobytes() and b.tobytes() == d.tobytes()


def test_fused_exact_int8_is_bit_identical_and_its_products_exact(export: Path, tmp_path: Path) -> None:
    """The int8 rewriter's graph with and without the fusion: same bits, every integer GEMM exact."""
    rows = _rows()
    unfused_recipe = dataclasses.replace(CALIBRATED_RECIPE, fuse_attention=False)
    fused = quantize_int8_exact(export, tmp_path / "fused.onnx", CALIBRATED_RECIPE, rows)
    unfused = quantize_int8_exact(export, tmp_path / "unfused.onnx", unfused_recipe, rows)
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    assert ops.count(fusion.FUSED_OP) == LAYERS and "Softmax" not in ops
    assert _kernels(onnx.load(str(fused)), tmp_path) <= _kernels(onnx.load(str(unfused)), tmp_path) - 20 * LAYERS
    for got, want in zip(_alone_and_batched(fused, rows), _alone_and_batched(unfused, rows)):
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    assert check_integer_products_on(fused, pad_batch(rows, INPUTS, 0), CALIBRATED_RECIPE)["gemms"] > 0


def test_a_fusion_that_changes_a_bit_is_refused(export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof can fail: Q's factor one ulp off is caught, and nothing is returned."""
    exact = fusion._constant

    def off_by_an_ulp(values: list[np.ndarray]) -> np.ndarray | None:
        value = exact(values)
        return None if value is None else np.nextafter(value, np.float32(1)).reshape(())

    monkeypatch.setattr(fusion, "_constant", off_by_an_ulp)
    with pytest.raises(fusion.FusionMismatch, match="differs from the unfused"):
        fusion.fuse_verified(onnx.load(str(export)), _rows())


def test_an_attention_of_another_form_is_left_alone(export: Path) -> None:
    """A mask that is not the export's padding mask (its masked value made mild, as a bias would be) and a
    graph with inputs no encoder has: nothing fused, the graph unchanged."""
    model = onnx.load(str(export))
    lowest = np.finfo(np.float32).min
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and np.array_equal(onnx.numpy_helper.to_array(value),
                                                                                np.array(lowest, np.float32)):
            value.CopyFrom(onnx.numpy_helper.from_array(np.array(-1.0, np.float32)))
    nodes = len(model.graph.node)
    found = fusion.fuse_encoder(model)
    assert found.attention == 0 and "constants" in found.why and len(model.graph.node) == nodes
    other = onnx.load(str(export))
    other.graph.input[0].name = "pixel_values"
    assert fusion.fuse_encoder(other).why.startswith("not an encoder graph")


def test_packages_ship_the_fused_graphs_and_say_so(fixture_package: Callable[..., Path]) -> None:
    """The converter's fixture package: fp32 and int8 graphs fused, the card's record of each."""
    package = read_package(fixture_package("embedding", quantize=True))
    card = package.card.raw
    assert card["verification"]["fusion"]["kernels"] == {fusion.FUSED_OP: LAYERS}
    assert card["variants"]["int8"]["recipe"]["fused_kernels"] == [fusion.FUSED_OP]
    for variant in ("fp32", "int8"):
        ops = [n.op_type for n in onnx.load(str(package.graph(variant))).graph.node]
        assert ops.count(fusion.FUSED_OP) == LAYERS, variant
