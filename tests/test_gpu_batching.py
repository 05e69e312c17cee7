"""Batching for devices whose kernels choose by shape (issue 28, item 3), proven on the CPU.

A GPU's matmuls pick their kernels by the batch's shape, so a row's answer can change with the rows
beside it even with right padding. The graphs and fakes here do that on purpose (a term of the
batch's shape); the probe must then find fixed-shape buckets where they are exact, fall back as today
where they are not, and `batching: padded` must say by how much it moves answers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import ModelConfig
from edge_runtime.engine import (
    BatchLimits,
    Buckets,
    EncoderForward,
    ModelExecutor,
    ProbeResult,
    bucket_candidates,
    create_session,
    max_abs_diff,
    plan_batch,
    probe,
    probe_grouping,
)
from edge_runtime.engine.batching import power_of_two_widths
from edge_runtime.engine.probe import Trial, bitwise_equal
from edge_runtime.loading import Batching, ServedModel, batching, load_model
from tests.support.encoder_graphs import HIDDEN, Row, encoder_graph, random_rows, reference
from tests.support.server_harness import Server, write_models_file

# ---- the planner -------------------------------------------------------------------------------


def test_widths_and_candidates() -> None:
    assert power_of_two_widths(256) == (16, 32, 64, 128, 256)
    assert power_of_two_widths(100) == (16, 32, 64, 100)
    assert power_of_two_widths(8) == (8,)
    free, fixed = bucket_candidates(256, BatchLimits())
    assert free == Buckets((16, 32, 64, 128, 256)) and fixed == Buckets((16, 32, 64, 128, 256), 32)
    # the fixed shape stays within the token budget of one forward
    assert bucket_candidates(512, BatchLimits(max_tokens=4096))[1].rows == 8
    assert Buckets((16, 32)).width(1) == 16 and Buckets((16, 32)).width(17) == 32
    with pytest.raises(ValueError, match="longer than the widest bucket"):
        Buckets((16, 32)).width(33)
    for bad in ((), (32, 16), (16, 16), (0, 16)):
        with pytest.raises(ValueError, match="ascending"):
            Buckets(bad)
    with pytest.raises(ValueError, match="rows"):
        Buckets((16,), rows=0)


def test_plan_buckets_takes_row_zeros_bucket_in_arrival_order() -> None:
    free = Buckets((16, 32, 64))
    assert plan_batch([20, 5, 30, 17, 40, 32], "buckets", BatchLimits(), buckets=free) == [0, 2, 3, 5]
    assert plan_batch([5, 20, 16, 1], "buckets", BatchLimits(), buckets=free) == [0, 2, 3]
    # any row count: the token budget counts the bucket's width per row
    assert plan_batch([20] * 5, "buckets", BatchLimits(max_tokens=100), buckets=free) == [0, 1, 2]
    # a fixed row count caps the batch; its shape is fixed, so only the count limits it
    fixed = Buckets((16, 32, 64), rows=2)
    assert plan_batch([20] * 5, "buckets", BatchLimits(max_tokens=10), buckets=fixed) == [0, 1]
    assert plan_batch([9, 3, 4], "buckets", BatchLimits(max_rows=1), buckets=fixed) == [0]
    # a row no bucket holds runs alone (its forward fails that job only); others skip past it
    assert plan_batch([70, 5], "buckets", BatchLimits(), buckets=free) == [0]
    assert plan_batch([5, 70, 6], "buckets", BatchLimits(), buckets=free) == [0, 2]
    with pytest.raises(ValueError, match="needs the forward's buckets"):
        plan_batch([5], "buckets", BatchLimits())


# ---- fakes: kernels that choose by shape -------------------------------------------------------


class ShapeForward:
    """Rows of ids in, ``ids + shift`` out, where the shift depends on the batch as ``depends`` says:
    "shape" (rows and width, like a GPU's kernel choice), "width" (width only) or "content" (the
    batch's mean, like dynamic int8's batch-wide scale). Pads and fills exactly as EncoderForward."""

    def __init__(self, depends: str, buckets: Buckets | None = None) -> None:
        self.depends = depends
        self.buckets = buckets
        self.shapes: list[tuple[int, int]] = []

    def bucketed(self, buckets: Buckets) -> ShapeForward:
        return ShapeForward(self.depends, buckets)

    def length(self, row: Row) -> int:
        return len(row.ids)

    def __call__(self, rows: Sequence[Row]) -> list[np.ndarray]:
        real = len(rows)
        width = max(len(r.ids) for r in rows)
        if self.buckets is not None:
            width = self.buckets.width(width)
            if self.buckets.rows is not None:
                rows = [*rows, *[rows[0]] * (self.buckets.rows - real)]
        self.shapes.append((len(rows), width))
        if self.depends == "shape":
            shift = 1e-3 * (len(rows) * 1000 + width)
        elif self.depends == "width":
            shift = 1e-3 * width
        else:
            shift = 1e-3 * float(np.mean([r.ids.mean() for r in rows]))
        return [r.ids.astype(np.float32) + np.float32(shift) for r in rows[:real]]


CANDIDATES = bucket_candidates(64, BatchLimits())


def test_probe_finds_fixed_row_buckets_when_kernels_choose_by_shape() -> None:
    forward = ShapeForward("shape")
    result = probe(forward, random_rows(3), lengths=(3, 9, 9, 17, 40, 64), buckets=CANDIDATES)
    assert result.grouping == "buckets" and result.buckets == CANDIDATES[1] and result.buckets.rows == 32
    assert [(t.grouping, t.exact, t.buckets) for t in result.trials] == [
        ("equal_length", False, None), ("padded", False, None),
        ("buckets", False, CANDIDATES[0]), ("buckets", True, CANDIDATES[1])]
    equal, padded, free, fixed = result.trials
    # every difference is the shift between two shapes, measured, never guessed
    assert padded.max_abs_diff is not None and 0 < padded.max_abs_diff < 10
    assert fixed.max_abs_diff == 0.0 and fixed.vs_own_length is not None and fixed.vs_own_length > 0
    assert free.max_abs_diff is not None and free.max_abs_diff > 0
    described = result.describe()
    assert described[3] == {"grouping": "buckets", "exact": True, "max_abs_diff": 0.0,
                            "widths": [16, 32, 64], "rows": 32,
                            "max_abs_diff_vs_own_length": fixed.vs_own_length}


def test_probe_runs_every_bucket_width_at_its_shape() -> None:
    shapes: list[tuple[int, int]] = []

    class Recording(ShapeForward):
        def bucketed(self, buckets: Buckets) -> ShapeForward:
            view = Recording(self.depends, buckets)
            view.shapes = shapes
            return view

    probe(Recording("shape"), random_rows(3), buckets=CANDIDATES)
    fixed = {width for rows, width in shapes if rows == 32}
    assert fixed == {16, 32, 64}  # every width, and only the fixed row count in that trial
    assert {rows for rows, width in shapes} == {1, 2, 4, 32}  # the free trial: alone, pairs, all four


def test_probe_takes_free_buckets_when_only_the_width_matters() -> None:
    result = probe(ShapeForward("width"), random_rows(4), buckets=CANDIDATES)
    # equal lengths agree (same width), padding does not: equal_length is proven first, as today
    assert result.grouping == "equal_length" and len(result.trials) == 2
    # with equal lengths changing too (no distinct rows to prove them), buckets of any row count do
    result = probe(ShapeForward("width"), lambda n: Row(np.arange(1, n + 1), np.zeros(n, np.int64)),
                   buckets=CANDIDATES)
    assert result.grouping == "buckets" and result.buckets == CANDIDATES[0]


def test_probe_stays_alone_when_content_mixes_and_without_candidates() -> None:
    result = probe(ShapeForward("content"), random_rows(5), buckets=CANDIDATES)
    assert result.grouping == "alone" and result.buckets is None
    assert [t.exact for t in result.trials] == [False, False, False, False]
    # no candidates (every caller but the loader on a GPU): today's answer, no bucket trial run
    result = probe(ShapeForward("shape"), random_rows(5))
    assert result.grouping == "alone" and len(result.trials) == 2
    assert probe_grouping(ShapeForward("shape"), random_rows(5)) == "alone"

    def plain(rows: Sequence[Row]) -> list[np.ndarray]:  # no bucketed(): candidates are skipped
        return ShapeForward("shape")(rows)

    assert len(probe(plain, random_rows(5), buckets=CANDIDATES).trials) == 2


def test_a_bucket_shape_the_device_cannot_run_is_no_grouping_not_a_failed_load() -> None:
    class OutOfMemory(ShapeForward):
        def bucketed(self, buckets: Buckets) -> ShapeForward:
            return OutOfMemory(self.depends, buckets)

        def __call__(self, rows: Sequence[Row]) -> list[np.ndarray]:
            if self.buckets is not None and self.buckets.rows is not None:
                raise MemoryError("32 rows x 64 tokens")
            return super().__call__(rows)

    result = probe(OutOfMemory("shape"), random_rows(6), buckets=CANDIDATES)
    assert result.grouping == "alone"
    assert result.describe()[3] == {"grouping": "buckets", "exact": False, "max_abs_diff": None,
                                    "widths": [16, 32, 64], "rows": 32, "max_abs_diff_vs_own_length": None}


def test_probe_records_a_batch_that_cannot_run() -> None:
    def forward(rows: Sequence[Row]) -> list[Any]:
        if len(rows) > 1:
            raise RuntimeError("batch dimension fixed at 1")
        return [rows[0].ids]

    result = probe(forward, random_rows(2))
    assert result.grouping == "alone"
    assert [t.describe() for t in result.trials] == [
        {"grouping": "equal_length", "exact": False, "max_abs_diff": None},
        {"grouping": "padded", "exact": False, "max_abs_diff": None}]


def test_max_abs_diff() -> None:
    a = np.array([1.0, 2.0, np.nan, np.inf], np.float32)
    assert max_abs_diff(a, a.copy()) == 0.0
    assert max_abs_diff({"x": a, "y": [np.float32(1.0)]}, {"x": a + np.array([0, 0.5, 0, 0], np.float32),
                                                           "y": [np.float32(1.25)]}) == 0.5
    assert max_abs_diff(a, a[:2]) == math.inf
    assert max_abs_diff(np.array([1.0]), np.array([np.nan])) == math.inf
    assert max_abs_diff({"x": a}, {"z": a}) == math.inf
    assert max_abs_diff("a", "a") == 0.0 and max_abs_diff("a", "b") == math.inf
    assert max_abs_diff(np.array([3], np.int64), np.array([1], np.int64)) == 2.0
    assert Trial("padded", False, math.inf).describe()["max_abs_diff"] is None  # JSON has no inf


# ---- ONNX Runtime: a graph whose rows change with the batch's shape ----------------------------


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu-graphs")
    return {mix or "invariant": encoder_graph(root / f"{mix}.onnx", mix=mix)
            for mix in (None, "shape", "padding", "batch")}


def _forward(graphs: dict[str, Path], name: str) -> EncoderForward:
    return EncoderForward(create_session(graphs[name], "cpu", threads=1))


def test_bucketed_encoder_forward_pads_to_the_bucket_and_fills_rows(graphs: dict[str, Path]) -> None:
    plain = _forward(graphs, "invariant")
    bucketed = plain.bucketed(Buckets((4, 8), rows=3))
    assert bucketed.buckets == Buckets((4, 8), rows=3) and plain.buckets is None
    rows = [random_rows(1)(n) for n in (5, 7)]
    assert bucketed.feeds(rows, 8)["input_ids"].shape == (2, 8)
    out = bucketed(rows)
    assert len(out) == 2  # the filler row's outputs are dropped
    for row, result in zip(rows, out):
        assert result["last_hidden_state"].shape == (len(row.ids), HIDDEN)
        np.testing.assert_allclose(result["last_hidden_state"], reference(row), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit a bucket of 3 rows"):
        bucketed([rows[0]] * 4)
    with pytest.raises(ValueError, match="longer than the widest bucket"):
        bucketed([random_rows(1)(9)])


def test_probe_over_onnx_graphs(graphs: dict[str, Path]) -> None:
    candidates = bucket_candidates(64, BatchLimits())

    def grouping(name: str) -> ProbeResult:
        return probe(_forward(graphs, name), random_rows(7), buckets=candidates)

    # what the CPU proves today is kept with candidates offered: they are tried only after it fails
    assert grouping("invariant").grouping == "padded" and len(grouping("invariant").trials) == 2
    assert grouping("padding").grouping == "equal_length"
    assert grouping("batch").grouping == "alone"
    shaped = grouping("shape")
    assert shaped.grouping == "buckets" and shaped.buckets == candidates[1]


def test_executor_answers_bucketed_rows_as_they_answer_alone(graphs: dict[str, Path]) -> None:
    bucketed = _forward(graphs, "shape").bucketed(Buckets((16, 32, 64), rows=4))
    make = random_rows(11)
    rows = [make(int(n)) for n in np.random.default_rng(3).integers(1, 64, size=10)]
    alone = [bucketed([row])[0] for row in rows]

    async def main() -> list[Any]:
        ex = ModelExecutor("m", bucketed, "buckets", max_queue=16)
        try:
            results = await asyncio.gather(*(ex.submit(rows[i:i + 3]) for i in range(0, len(rows), 3)))
        finally:
            ex.close()
        return [out for r in results for out in r.outputs]

    outputs = asyncio.run(main())
    assert all(bitwise_equal(out, ref) for out, ref in zip(outputs, alone, strict=True))
    # at its own length (no bucket), the shape term differs: buckets are exact, not unpadded
    assert not bitwise_equal(_forward(graphs, "shape")([rows[0]])[0], alone[0])
    with pytest.raises(ValueError, match="needs a bucketed forward"):
        ModelExecutor("m", _forward(graphs, "shape"), "buckets", max_queue=1)


class _Family:
    """The loader's view of a family, over one graph."""

    batchable = True
    max_input_tokens = 64

    def __init__(self, forward: EncoderForward) -> None:
        self.forward = forward
        self.probe_row = random_rows(5)


def _model(graphs: dict[str, Path], name: str, mode: str = "exact") -> ServedModel:
    forward = _forward(graphs, name)
    model = ServedModel(ModelConfig(name="m", package=graphs[name], device="cpu", batching=mode))
    model.family, model.session = _Family(forward), forward.session  # type: ignore[assignment]
    return model


def test_loader_tries_buckets_on_bucket_devices_only(graphs: dict[str, Path],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert batching(_model(graphs, "shape")).grouping == "alone"  # the CPU tries no buckets
    assert batching(_model(graphs, "invariant")).grouping == "padded"
    monkeypatch.setattr("edge_runtime.loading.BUCKET_DEVICES", frozenset({"cpu"}))  # as on CUDA
    chosen = batching(_model(graphs, "shape"))
    assert (chosen.grouping, chosen.numerics, chosen.max_abs_diff) == ("buckets", "exact", None)
    assert chosen.probe is not None and chosen.probe.buckets == bucket_candidates(64, BatchLimits())[1]
    # padded asked for: padded it is, approximate, with the probe's measured difference
    padded = batching(_model(graphs, "shape", "padded"))
    assert (padded.grouping, padded.numerics) == ("padded", "approximate")
    assert padded.probe is not None and padded.max_abs_diff == padded.probe.trials[1].max_abs_diff > 0
    exact = batching(_model(graphs, "invariant", "padded"))
    assert (exact.grouping, exact.numerics, exact.max_abs_diff) == ("padded", "exact", None)


def test_load_model_serves_buckets_with_the_bucketed_forward(fixture_package: Callable[..., Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The wiring once the probe has chosen buckets (a GPU's answer): the executor runs the bucketed
    forward, the card shows the buckets and the trials, and rows answer as they do alone."""
    buckets = Buckets((16, 32, 64, 128), rows=4)
    trials = (Trial("equal_length", False, 1e-7), Trial("padded", False, 2e-7),
              Trial("buckets", True, 0.0, buckets, 3e-7))
    monkeypatch.setattr("edge_runtime.loading.batching",
                        lambda model: Batching("buckets", "exact", ProbeResult("buckets", buckets, trials)))
    model = ServedModel(ModelConfig(name="emb", package=fixture_package("embedding"), device="cpu", threads=1))
    load_model(model)
    assert model.status == "ready", model.reason
    assert model.executor is not None and model.executor.buckets == buckets
    try:
        entry = model.info()
        assert entry["engine_args"]["grouping"] == "buckets" and entry["numerics"] == "exact"
        assert entry["engine_args"]["buckets"] == {"widths": [16, 32, 64, 128], "rows": 4}
        assert [t["grouping"] for t in entry["engine_args"]["probe"]] == ["equal_length", "padded", "buckets"]
        assert "numerics_max_abs_diff" not in entry["engine_args"]
        assert model.family is not None
        rows = [model.family.probe_row(n) for n in (3, 12, 20, 5, 30)]
        batched = asyncio.run(model.executor.submit(rows)).outputs
        alone = [model.executor.forward([row])[0] for row in rows]
        assert all(bitwise_equal(a, b) for a, b in zip(batched, alone, strict=True))
    finally:
        model.executor.close()


# ---- over HTTP: the card of an exact and of an approximate model -------------------------------


def test_models_card_shows_probe_and_approximate_difference(fixture_package: Callable[..., Path],
                                                            tmp_path: Path) -> None:
    models = [
        {"name": "exact", "package": str(fixture_package("embedding")), "device": "cpu", "threads": 1},
        {"name": "dynamic", "package": str(fixture_package("embedding", quantize="int8-dynamic")),
         "variant": "int8-dynamic", "device": "cpu", "threads": 1, "batching": "padded"},
    ]
    server = Server(write_models_file(tmp_path / "models.yaml", models))
    try:
        server.wait()
        by_id = {m["id"]: m for m in server.client.get("/v1/models").json()["data"]}
    finally:
        server.stop()
    exact, dynamic = by_id["exact"], by_id["dynamic"]
    assert exact["numerics"] == "exact" and exact["engine_args"]["grouping"] == "padded"
    assert [(t["grouping"], t["exact"], t["max_abs_diff"]) for t in exact["engine_args"]["probe"]] == [
        ("equal_length", True, 0.0), ("padded", True, 0.0)]
    assert "numerics_max_abs_diff" not in exact["engine_args"]
    # dynamic int8 quantizes over the whole batch: padded batches are approximate, and by how much
    assert dynamic["numerics"] == "approximate" and dynamic["engine_args"]["grouping"] == "padded"
    trials = {t["grouping"]: t for t in dynamic["engine_args"]["probe"]}
    assert trials["padded"]["exact"] is False
    assert dynamic["engine_args"]["numerics_max_abs_diff"] == trials["padded"]["max_abs_diff"] > 0
