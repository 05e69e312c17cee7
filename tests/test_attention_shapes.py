"""An encoder export's attention with its shape arithmetic folded into constants (converters.attention_shapes):
the folded graph answers bit for bit as the export does, alone and batched, fp32 and exact int8, with fewer
kernels per forward; a folding that would change a bit is refused, and an attention of another form is left
alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from converters import attention_shapes as folding
from converters.quantize import CALIBRATED_RECIPE, check_integer_products_on, quantize_int8_exact
from converters.small_forward import bodies
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
    """The tiny fixture encoder as Optimum exports it, before any folding, with its first layer's hidden
    state exposed as an output as the fixture package does (a graph output that later layers read)."""
    from transformers import BertModel

    from converters import onnx_export
    from converters.encoder.fixture import build_source

    root = tmp_path_factory.mktemp("attention-export")
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


def test_folded_fp32_is_bit_identical_and_runs_fewer_kernels(export: Path, tmp_path: Path) -> None:
    model = onnx.load(str(export))
    folded, found = folding.fold_verified(model, _rows())
    assert found.layers == LAYERS and found.forwards > 0
    ops = [n.op_type for n in folded.graph.node]
    assert ops.count("Softmax") == LAYERS and "Sqrt" not in ops
    # each layer's ~14 shape and factor kernels go, and the mask's ~15-kernel chain becomes 3
    before, after = _kernels(model, tmp_path), _kernels(folded, tmp_path)
    assert after <= before - 10 * LAYERS - 10, (before, after)
    # the same answers through the server's session factory, and rows alone equal rows batched
    old_alone, old_batched = _alone_and_batched(export, _rows())
    new_alone, new_batched = _alone_and_batched(_save(folded, tmp_path / "folded.onnx"), _rows())
    for a, b, c, d in zip(old_alone, new_alone, old_batched, new_batched):
        assert a.tobytes() == b.tobytes() and c.tobytes() == d.tobytes() and b.tobytes() == d.tobytes()


def test_folded_exact_int8_is_bit_identical_and_its_products_exact(export: Path, tmp_path: Path) -> None:
    """The int8 rewriter's graph with and without the folding: same bits, every integer GEMM exact."""
    rows = _rows()
    recipe = dataclasses.replace(CALIBRATED_RECIPE, small_forward_tokens=0)  # one body, to count its kernels
    unfolded_recipe = dataclasses.replace(recipe, fold_attention=False)
    folded = quantize_int8_exact(export, tmp_path / "folded.onnx", recipe, rows)
    unfolded = quantize_int8_exact(export, tmp_path / "unfolded.onnx", unfolded_recipe, rows)
    ops = [n.op_type for n in onnx.load(str(folded)).graph.node]
    assert ops.count("Softmax") == LAYERS and "Sqrt" not in ops
    assert _kernels(onnx.load(str(folded)), tmp_path) <= _kernels(onnx.load(str(unfolded)), tmp_path) - 10 * LAYERS - 10
    for got, want in zip(_alone_and_batched(folded, rows), _alone_and_batched(unfolded, rows)):
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
    assert check_integer_products_on(folded, pad_batch(rows, INPUTS, 0), CALIBRATED_RECIPE)["gemms"] > 0


def test_a_folding_that_changes_a_bit_is_refused(export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof can fail: Q's factor one ulp off is caught, and nothing is returned."""
    exact = folding._constant

    def off_by_an_ulp(values: list[np.ndarray]) -> np.ndarray | None:
        value = exact(values)
        return None if value is None else np.nextafter(value, np.float32(1)).reshape(())

    monkeypatch.setattr(folding, "_constant", off_by_an_ulp)
    with pytest.raises(folding.FoldingMismatch, match="differs from the export"):
        folding.fold_verified(onnx.load(str(export)), _rows())


def test_an_attention_of_another_form_is_left_alone(export: Path) -> None:
    """A mask that is not the export's padding mask (its masked value made mild, as a bias would be) and a
    graph with inputs no encoder has: nothing folded, the graph unchanged."""
    model = onnx.load(str(export))
    lowest = np.finfo(np.float32).min
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and value is not None and np.array_equal(onnx.numpy_helper.to_array(value),
                                                                                np.array(lowest, np.float32)):
            value.CopyFrom(onnx.numpy_helper.from_array(np.array(-1.0, np.float32)))
    nodes = len(model.graph.node)
    found = folding.fold_attention_shapes(model)
    assert found.layers == 0 and "constants" in found.why and len(model.graph.node) == nodes
    other = onnx.load(str(export))
    other.graph.input[0].name = "pixel_values"
    assert folding.fold_attention_shapes(other).why.startswith("not an encoder graph")


def test_packages_ship_the_folded_graphs_and_say_so(fixture_package: Callable[..., Path]) -> None:
    """The converter's fixture package: fp32 and int8 graphs folded, the card's record of each."""
    package = read_package(fixture_package("embedding", quantize=True))
    card = package.card.raw
    assert card["verification"]["shape_folding"]["layers"] == LAYERS
    assert card["variants"]["int8"]["recipe"]["attention_shapes"] == "constant"
    for variant in ("fp32", "int8"):
        for body in bodies(onnx.load(str(package.graph(variant)))):
            ops = [n.op_type for n in body.graph.node]
            assert ops.count("Softmax") == LAYERS and "Sqrt" not in ops, variant


def test_the_identity_bench_finds_any_differing_forward(export: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.graph_identity: the folded graph differs from the export in no forward; a graph one ulp off does."""
    from bench.graph_identity import differing

    feeds = folding.proof_feeds(onnx.load(str(export)), _rows())
    folded, _ = folding.fold_verified(onnx.load(str(export)))
    assert differing(export, _save(folded, tmp_path / "folded.onnx"), feeds, 2) == 0
    exact = folding._constant
    monkeypatch.setattr(folding, "_constant", lambda values: np.nextafter(exact(values), np.float32(1)).reshape(()))
    off = onnx.load(str(export))
    folding.fold_attention_shapes(off)
    assert differing(export, _save(off, tmp_path / "off.onnx"), feeds, 1) > 0
