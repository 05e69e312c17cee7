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

from converters.quantize import quantize_weight
from edge_runtime.config import ModelConfig
from edge_runtime.engine import create_session, probe_grouping
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.registry import build_family
from edge_runtime.loading import PROBE_LENGTHS
from edge_runtime.packages import read_package

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


def test_quantize_weight_is_symmetric_per_channel() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(48, 5)).astype(np.float32) * np.array([1, 10, 0.01, 1e3, 0], np.float32)
    q, scale = quantize_weight(w)
    assert q.dtype == np.int8 and scale.shape == (5,) and np.all(np.abs(q) <= 127)
    assert np.all(q[:, 4] == 0) and scale[4] == 1.0  # a zero channel neither divides by zero nor moves
    # each channel's largest weight maps to +-127 and no weight is off by more than half a step
    assert np.all(np.abs(q[:, :4]).max(axis=0) == 127)
    assert np.all(np.abs(q * scale - w) <= scale / 2 + 1e-6 * np.abs(w))


@pytest.mark.minilm
def test_default_minilm_serves_exact_int8_within_its_floor(minilm_package: Path) -> None:
    """The default package's int8 is the exact one, meets the card's floor, and the probe batches it."""
    from converters.default import MINILM_INT8_MIN_COSINE

    entry = read_package(minilm_package).card.raw["variants"]["int8"]
    assert (entry["quantization"], entry["numerics"]) == ("per-token", "exact")
    agreement = entry["agreement"]
    assert agreement["floor"] == {"min_cosine": MINILM_INT8_MIN_COSINE, "met": True}
    assert MINILM_INT8_MIN_COSINE <= agreement["min_cosine"] <= agreement["mean_cosine"] < 1.0
    assert _probe(_served(minilm_package, "int8")) == "padded"


def test_state_once_int8_branches_equal_each_question_alone(tmp_path: Path) -> None:
    """Decision-codes state-once on the int8 backbone: questions branched from one state in one forward
    answer exactly as each question run alone over the whole prompt (as fp32 does)."""
    from converters.decision_codes import build_decision_codes_fixture
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
