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

from converters import small_forward
from converters.quantize import (
    CALIBRATED_RECIPE,
    DEFAULT_RECIPE,
    INT16_MAX,
    Int8Recipe,
    check_integer_products,
    quantize_int8_exact,
    quantize_weight,
    real_sentences,
    split_weight,
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
    joined = onnx.load(str(Path(path) / entry["file"]))
    graphs = small_forward.bodies(joined)
    assert len(graphs) == (2 if entry["recipe"].get("small_forward_tokens") else 1)
    for graph in graphs:
        weights = {t.name for t in graph.graph.initializer if len(t.dims) == 2}
        ops = [n.op_type for n in graph.graph.node]
        assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops
        # no float MatMul/Gemm against a constant weight is left behind, but those of the outlier channels
        dims = {t.name: list(t.dims) for t in graph.graph.initializer}
        floats = [n for n in graph.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
        outliers = entry["recipe"].get("fp32_outlier_channels", 0)
        assert all(n.name.endswith("/OutlierGemm") and dims[n.input[1]][0] == outliers for n in floats)
        # one quantization per distinct activation: Q, K and V share theirs (in the small-forward body
        # they are one integer GEMM)
        quantizations, gemms = ops.count("ReduceMax"), ops.count("MatMulIntegerToFloat")
        assert quantizations < gemms if graph is graphs[0] else quantizations == gemms
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


def test_split_weight_terms_rebuild_wide_codes_within_each_terms_bound() -> None:
    """W = R*h + l with h, l inside +-64: about 14-bit weights from two int8 terms that cannot saturate."""
    rng = np.random.default_rng(1)
    w = rng.standard_t(3, size=(64, 6)).astype(np.float32) * np.array([1, 10, 0.01, 1e3, 0, 1], np.float32)
    high, low, scale = split_weight(w, 64)
    radix = DEFAULT_RECIPE.split_radix
    assert high.dtype == low.dtype == np.int8 and np.abs(high).max() <= 64 and np.abs(low).max() <= 64
    codes = radix * high.astype(np.int64) + low
    assert np.all(np.abs(codes).max(axis=0)[[0, 1, 2, 3, 5]] == (radix + 1) * 64)  # the full range is used
    assert np.all(codes[:, 4] == 0) and scale[4] == 1.0
    assert np.all(np.abs(codes * scale - w) <= scale / 2 + 1e-6 * np.abs(w))
    single, single_scale = quantize_weight(w, 64)
    assert np.abs(codes * scale - w).max() < np.abs(single * single_scale - w).max() / 50


@pytest.mark.parametrize("variant", ["split", "outliers"])
def test_recipe_options_are_exact_batch_invariant_and_closer_to_fp32(variant: str, tmp_path: Path,
                                                                     fixture_package: Callable[..., Path]) -> None:
    """Two-term weights (two integer GEMMs per matmul) and fp32 outlier channels (a Gather and a small fp32
    Gemm adding to each GEMM's output): every GEMM exact on this CPU, rows alone equal to rows in a padded
    batch bit for bit, and the embedding closer to fp32's than without."""
    from tokenizers import Tokenizer

    package = read_package(fixture_package("embedding", quantize=True))
    recipe = {"split": Int8Recipe(weight_max=64, split=(".",)),
              "outliers": Int8Recipe(weight_max=64, outliers=4)}[variant]
    tokenizer = package.file("tokenizer.json")
    tok = Tokenizer.from_file(str(tokenizer))
    calibration = [{"input_ids": np.array(e.ids, np.int64), "attention_mask": np.ones(len(e.ids), np.int64),
                    "token_type_ids": np.zeros(len(e.ids), np.int64)}
                   for e in tok.encode_batch(real_sentences()[::100])]
    graphs = {name: quantize_int8_exact(package.graph("fp32"), tmp_path / f"{name}.onnx", r, calibration)
              for name, r in (("one", DEFAULT_RECIPE), (variant, recipe))}
    one = check_integer_products(graphs["one"], tokenizer, DEFAULT_RECIPE)
    gemms = check_integer_products(graphs[variant], tokenizer, recipe)["gemms"]
    assert gemms == (2 if variant == "split" else 1) * one["gemms"]
    names = [n.name for n in onnx.load(str(graphs[variant])).graph.node]
    if variant == "outliers":
        # one Gather per quantized activation (Q, K and V share theirs), one fp32 MatMul per weight
        gathers = sum(n.endswith("/outliers/Gather") for n in names)
        assert 0 < gathers < gemms == sum(n.endswith("/OutlierGemm") for n in names)

    encs = [tok.encode(t) for t in real_sentences()[::400]]
    width = max(len(e.ids) for e in encs)
    ids = np.zeros((len(encs), width), np.int64)
    for r, e in enumerate(encs):
        ids[r, :len(e.ids)] = e.ids
    mask = (np.arange(width)[None, :] < np.array([len(e.ids) for e in encs])[:, None]).astype(np.int64)
    sessions = {name: create_session(g, "cpu", 2) for name, g in {**graphs, "fp32": package.graph("fp32")}.items()}
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    out = {name: s.run(feeds, ["last_hidden_state"])["last_hidden_state"] for name, s in sessions.items()}
    for r, e in enumerate(encs):
        n = len(e.ids)
        alone = sessions[variant].run({k: v[r:r + 1, :n] for k, v in feeds.items()},
                                      ["last_hidden_state"])["last_hidden_state"]
        assert bitwise_equal(alone[0], out[variant][r, :n])
    valid = mask.astype(bool)
    err = {name: np.abs(out[name] - out["fp32"])[valid].max() for name in ("one", variant)}
    assert err[variant] < err["one"] * (0.5 if variant == "split" else 1.0)


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
    recipe = Int8Recipe.from_card(package.card.raw["variants"]["int8"]["recipe"])
    assert recipe == CALIBRATED_RECIPE  # the card records every field of the recipe it was built with
    assert check_integer_products(package.graph("int8"), package.file("tokenizer.json"), recipe)["gemms"] > 0
    for other in (Int8Recipe(weight_max=32, activation_max=63, fp32=("a",), smooth_alpha=0.3, split=("b",),
                             outliers=2), DEFAULT_RECIPE):
        assert Int8Recipe.from_card(other.describe()) == other


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
    """The same proof on the real MiniLM: its integer GEMMs on real sentences, exact and bounded: 36 in the
    body for large forwards, 24 in the one for small forwards (each layer's Q, K and V as one)."""
    package = read_package(minilm_package)
    assert package.card.raw["variants"]["int8"]["recipe"] == CALIBRATED_RECIPE.describe()
    report = check_integer_products(package.graph("int8"), package.file("tokenizer.json"), CALIBRATED_RECIPE)
    assert report["gemms"] == 36 + 24


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


def test_exported_encoder_quantizes_against_one_zero_point(fixture_package: Callable[..., Path]) -> None:
    """On a real BERT export (the embedding fixture) every activation runs over the same tokens, so one
    Shape/Expand builds the zero point for all of them."""
    path = fixture_package("embedding", quantize=True)
    joined = onnx.load(str(Path(path) / read_package(path).card.raw["variants"]["int8"]["file"]))
    for graph in small_forward.bodies(joined):
        names = [n.name for n in graph.graph.node]
        assert sum(n.endswith("/ZeroPoints") for n in names) == 1
        assert sum(n.endswith("/QuantizeLinear") for n in names) > 1
