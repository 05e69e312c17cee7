"""Exact (per-token) int8: every variant the converters write is batch-invariant, bit for bit.

The fixtures go through the same converter path as real models; the probe is the server's own
load-time probe over the family's forward, at two intra-op threads so that the int8 kernels split
work across threads as they do in service.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from converters.quantize import (
    DEFAULT_RECIPE,
    INT16_MAX,
    Int8Recipe,
    check_integer_products,
    quantize_int8_exact,
    quantize_weight,
    real_sentences,
)
from edge_runtime.config import ModelConfig
from edge_runtime.engine import create_session, probe_grouping
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.registry import build_family, read_package
from edge_runtime.loading import PROBE_LENGTHS

EXACT_KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank",
               "decision-codes")


def _served(path: Path, variant: str) -> Any:
    """The family the server would build for ``variant`` of the package at ``path`` (2 threads)."""
    package = read_package(path)
    session = create_session(package.graph(variant), "cpu", 2)
    return build_family(package, session, ModelConfig(name="m", package=path, variant=variant, device="cpu"))[0]


def _probe(family: Any) -> str:
    cap = int(getattr(family, "max_input_tokens", 512))
    return probe_grouping(family.forward, family.probe_row, lengths=tuple(min(n, cap) for n in PROBE_LENGTHS))


@pytest.mark.parametrize("kind", EXACT_KINDS)
def test_exact_int8_variant_is_batch_invariant(kind: str, fixture_package: Callable[..., Path]) -> None:
    path = fixture_package(kind, quantize=True)
    card = read_package(path).card.raw
    entry = card["variants"]["int8"]
    assert (entry["quantization"], entry["numerics"]) == ("per-token", "exact")
    graph = onnx.load(str(Path(path) / entry["file"]))
    weights = {t.name for t in graph.graph.initializer if len(t.dims) == 2}
    ops = [n.op_type for n in graph.graph.node]
    assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops
    # no float MatMul/Gemm against a constant weight is left behind
    assert not [n.name for n in graph.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
    # one quantization per distinct activation: Q, K and V share theirs
    assert ops.count("ReduceMax") < ops.count("MatMulIntegerToFloat")
    assert _probe(_served(path, "int8")) == "padded"


def test_dynamic_int8_is_kept_by_name_and_is_not_batch_invariant(fixture_package: Callable[..., Path]) -> None:
    """The old variant is there only under its own name, says it is approximate, and the probe agrees."""
    path = fixture_package("embedding", quantize="int8-dynamic")
    entry = read_package(path).card.raw["variants"]["int8-dynamic"]
    assert (entry["file"], entry["quantization"], entry["numerics"]) == (
        "model.int8-dynamic.onnx", "dynamic", "approximate")
    assert "int8" not in read_package(path).card.variants
    assert _probe(_served(path, "int8-dynamic")) == "alone"


def test_exact_int8_rows_alone_equal_rows_in_a_padded_batch(fixture_package: Callable[..., Path]) -> None:
    """Beyond the probe's lengths: random rows of every length up to 64 inside one padded batch."""
    family = _served(fixture_package("embedding", quantize=True), "int8")
    rng = np.random.default_rng(7)
    rows = [family.probe_row(int(n)) for n in rng.integers(1, 64, size=12)]
    batched = family.forward(rows)
    for row, got in zip(rows, batched):
        (alone,) = family.forward([row])
        assert bitwise_equal(alone, got)


@pytest.mark.parametrize("max_code", [127, 64])
def test_quantize_weight_is_symmetric_per_channel(max_code: int) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(48, 5)).astype(np.float32) * np.array([1, 10, 0.01, 1e3, 0], np.float32)
    q, scale = quantize_weight(w, max_code)
    assert q.dtype == np.int8 and scale.shape == (5,) and np.all(np.abs(q) <= max_code)
    assert np.all(q[:, 4] == 0) and scale[4] == 1.0  # a zero channel neither divides by zero nor moves
    # each channel's largest weight maps to +-max_code and no weight is off by more than half a step
    assert np.all(np.abs(q[:, :4]).max(axis=0) == max_code)
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-6 * np.abs(w))


def test_recipes_that_could_saturate_16_bit_pair_sums_are_refused(tmp_path: Path) -> None:
    """u8 x s8 pair sums must fit int16 whatever the data (AVX2's vpmaddubsw saturates beyond)."""
    assert DEFAULT_RECIPE.pair_sum_bound == 2 * 255 * 64 <= INT16_MAX
    assert Int8Recipe(weight_max=127, activation_max=63).pair_sum_bound == 2 * 127 * 127 <= INT16_MAX
    for bad in (Int8Recipe(weight_max=127), Int8Recipe(weight_max=65), Int8Recipe(smooth_alpha=1.5)):
        with pytest.raises(ValueError):
            bad.check()
    with pytest.raises(ValueError, match="saturate"):
        quantize_int8_exact(tmp_path / "unused.onnx", tmp_path / "out.onnx", Int8Recipe(weight_max=127))


def test_integer_products_are_exact_and_cannot_saturate(fixture_package: Callable[..., Path]) -> None:
    """Every integer GEMM of an exact int8 graph computes the exact product of its own operands on this
    CPU, and its operand ranges make that so on every CPU class (the 16-bit pair-sum bound)."""
    package = read_package(fixture_package("embedding", quantize=True))
    recipe = Int8Recipe(**{k: v for k, v in package.card.raw["variants"]["int8"]["recipe"].items()
                           if k in ("weight_max", "activation_max", "smooth_alpha")})
    assert check_integer_products(package.graph("int8"), package.file("tokenizer.json"), recipe)["gemms"] > 0


@pytest.mark.minilm
def test_default_minilm_serves_exact_int8_within_its_floor(minilm_package: Path) -> None:
    """The default package's int8 is the exact one, meets the card's floor, and the probe batches it."""
    from converters.default import MINILM_INT8_MIN_COSINE

    entry = read_package(minilm_package).card.raw["variants"]["int8"]
    assert (entry["quantization"], entry["numerics"]) == ("per-token", "exact")
    agreement = entry["agreement"]
    assert agreement["floor"] == {"min_cosine": MINILM_INT8_MIN_COSINE, "met": True}
    assert MINILM_INT8_MIN_COSINE <= agreement["min_cosine"] <= agreement["p1_cosine"] <= agreement["mean_cosine"] < 1
    # measured on the shipped real sentences, and says so
    assert agreement["cases"] == len(real_sentences()) >= 2000 and "STS Benchmark" in agreement["corpus"]
    assert 0.9 <= agreement["nearest_neighbour_agreement"] <= 1.0
    assert _probe(_served(minilm_package, "int8")) == "padded"


@pytest.mark.minilm
def test_default_minilm_integer_products_are_exact_and_cannot_saturate(minilm_package: Path) -> None:
    """The same proof on the real MiniLM: its 36 integer GEMMs on real sentences, exact and bounded."""
    from converters.quantize import CALIBRATED_RECIPE

    package = read_package(minilm_package)
    assert package.card.raw["variants"]["int8"]["recipe"] == CALIBRATED_RECIPE.describe()
    report = check_integer_products(package.graph("int8"), package.file("tokenizer.json"), CALIBRATED_RECIPE)
    assert report["gemms"] == 36


def test_state_once_int8_branches_equal_each_question_alone(tmp_path: Path) -> None:
    """Decision-codes state-once on the int8 backbone: questions branched from one state in one forward
    answer exactly as each question run alone over the whole prompt (as fp32 does)."""
    from converters.decision_codes.fixture import build_decision_codes_fixture
    from edge_runtime.engine.causal import CausalForward, branch_row, causal_row

    path = build_decision_codes_fixture(tmp_path / "once", attention_mode="prefix_causal", quantize="int8")
    package = read_package(path)
    entry = package.card.raw["variants"]["int8"]
    assert entry["quantization"] == "per-token" and 0 < entry["agreement"]["top_label_agreement"] <= 1
    forward = CausalForward(create_session(package.graph("int8"), "cpu", 2), pad_id=0)
    rng = np.random.default_rng(3)
    state = rng.integers(5, 500, size=40).tolist()
    questions = [rng.integers(5, 500, size=n).tolist() for n in (7, 12, 3)]
    (branched,) = forward([branch_row(state, questions)])
    for j, q in enumerate(questions):
        (alone,) = forward([causal_row(state + q)])
        assert bitwise_equal(np.asarray(branched[j]), np.asarray(alone))


def _two_matmuls(path: Path, mix_channels: bool) -> Path:
    """x [B, T, 8] -> MatMul W1 -> + b1 -> (optionally a head split whose transpose mixes channels) ->
    MatMul W2: the second matmul's input is produced by the first."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    w1 = rng.normal(size=(8, 8)).astype(np.float32) * np.array([1, 8, 1, 1, 0.2, 1, 4, 1], np.float32)
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(rng.normal(size=8).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([0, 0, 2, 4], np.int64), "heads"),
             numpy_helper.from_array(np.array([0, 0, 8], np.int64), "merged")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="first"),
             helper.make_node("Add", ["b1", "h1"], ["h"], name="first_bias")]
    if mix_channels:
        nodes += [helper.make_node("Reshape", ["h", "heads"], ["split"]),
                  helper.make_node("Transpose", ["split"], ["swapped"], perm=[0, 1, 3, 2]),
                  helper.make_node("Reshape", ["swapped", "merged"], ["h2"])]
    else:
        nodes.append(helper.make_node("Identity", ["h"], ["h2"]))
    nodes.append(helper.make_node("MatMul", ["h2", "w2"], ["y"], name="second"))
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.mark.parametrize("mix_channels", [False, True])
def test_smoothing_folds_upstream_only_where_the_numbers_allow(tmp_path: Path, mix_channels: bool) -> None:
    """A smoothed activation made by a matmul (through its bias and channel-keeping ops) takes 1/s in that
    matmul's weight scale and bias instead of a Mul; a path that mixes channels keeps its Mul. Either
    way the int8 graph follows fp32, rows alone equal rows in a batch, and the tokens share one zero point."""
    import onnxruntime as ort

    src = _two_matmuls(tmp_path / "src.onnx", mix_channels)
    rng = np.random.default_rng(9)
    calibration = [{"x": rng.normal(size=(int(n), 8)).astype(np.float32)} for n in rng.integers(2, 9, size=6)]
    dst = quantize_int8_exact(src, tmp_path / "int8.onnx", Int8Recipe(weight_max=64, smooth_alpha=0.6), calibration)
    nodes = onnx.load(str(dst)).graph.node
    smooths = [n.name for n in nodes if n.name.endswith("/Smooth")]
    # x (a graph input) has nothing upstream to fold into; h does unless its channels are mixed
    assert len(smooths) == (2 if mix_channels else 1)
    assert sum(n.op_type == "Expand" for n in nodes) == 1
    fp32 = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    int8 = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    x = rng.normal(size=(3, 7, 8)).astype(np.float32)
    want, (got,) = fp32.run(None, {"x": x})[0], int8.run(None, {"x": x})
    assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))
    for r in range(3):
        assert bitwise_equal(int8.run(None, {"x": x[r:r + 1]})[0][0], got[r])


def test_exported_encoder_quantizes_against_one_zero_point_and_folds_attention_smoothing(
        fixture_package: Callable[..., Path]) -> None:
    """On a real BERT export (the embedding fixture): every activation runs over the same tokens, so one
    Shape/Expand builds the zero point for all; the attention output's smoothing went into V (one Mul
    fewer per layer than activations smoothed)."""
    path = fixture_package("embedding", quantize=True)
    graph = onnx.load(str(Path(path) / read_package(path).card.raw["variants"]["int8"]["file"])).graph
    names = [n.name for n in graph.node]
    assert sum(n.endswith("/ZeroPoints") for n in names) == 1
    layers = sum(n.endswith("/attention/output/dense/MatMul/MatMulIntegerToFloat") for n in names)
    quantized = sum(n.endswith("/QuantizeLinear") for n in names)
    assert layers > 0 and sum(n.endswith("/Smooth") for n in names) == quantized - layers
    assert not any("attention/self/Reshape_3" in n and n.endswith("/Smooth") for n in names)
