"""Engine tests: sessions, the encoder forward, the grouping probe, batch planning and the executor.

Tiny ONNX graphs are built here with onnx.helper; queue behaviour uses a Python forward that can be
held at a gate, so every interleaving the tests rely on is forced, never timed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

from edge_runtime.engine import (
    BatchLimits,
    DeadlineExceeded,
    EncoderForward,
    ExecutorClosed,
    ForwardError,
    ModelExecutor,
    Overloaded,
    RequestTooLarge,
    SessionError,
    create_session,
    default_threads,
    is_out_of_memory,
    plan_batch,
    probe_grouping,
)
from edge_runtime.engine.batching import bucket_ceiling
from edge_runtime.engine.executor import QUEUE_MEAN_TAU_S, ExecutorLoad
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.engine.session import cgroup_cpu_limit
from tests.support.encoder_graphs import (
    HIDDEN,
    Row,
    encoder_graph,
    failing_graph,
    make_row,
    random_rows,
    reference,
)

WAIT_S = 10.0  # upper bound for a condition that is about to hold; never a timing assertion


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("graphs")
    return {
        "invariant": encoder_graph(root / "invariant.onnx"),
        "no_types": encoder_graph(root / "no_types.onnx", type_ids=False),
        "batch_mix": encoder_graph(root / "batch_mix.onnx", mix="batch"),
        "padding_mix": encoder_graph(root / "padding_mix.onnx", mix="padding"),
        "failing": failing_graph(root / "failing.onnx"),
    }


# ---- fake forward ------------------------------------------------------------------------------


class FakeForward:
    """Records each batch; can be held at a gate; answers each row with a function of its ids."""

    def __init__(self, fail: Callable[[Sequence[Row]], Exception | None] | None = None) -> None:
        self.batches: list[list[Row]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail = fail

    def length(self, row: Row) -> int:
        return len(row.ids)

    def __call__(self, rows: Sequence[Row]) -> list[Any]:
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never opened the gate"
        self.batches.append(list(rows))
        if self.fail is not None and (exc := self.fail(rows)) is not None:
            raise exc
        return [row.ids * 2 for row in rows]

    def ran(self, row: Row) -> bool:
        return any(r is row for batch in self.batches for r in batch)


class RecordingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def _record(self, name: str, *args: Any) -> None:
        with self.lock:
            self.calls.append((name, args))

    def observe_queue(self, model: str, seconds: float) -> None:
        self._record("observe_queue", model, seconds)

    def observe_forward(self, model: str, seconds: float, rows: int, tokens: int) -> None:
        self._record("observe_forward", model, seconds, rows, tokens)

    def set_queue_depth(self, model: str, n: int) -> None:
        self._record("set_queue_depth", model, n)

    def on_dropped(self, model: str, n: int) -> None:
        self._record("on_dropped", model, n)

    def watch(self, model: str, load: Callable[[], Any]) -> None:
        self._record("watch", model, load)

    def named(self, name: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [args for n, args in self.calls if n == name]


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until `condition` holds (bounded so a bug fails instead of hanging)."""
    end = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < end, "condition never held"
        await asyncio.sleep(0.001)


async def hold(ex: ModelExecutor, fake: FakeForward) -> asyncio.Task[Any]:
    """Close the gate and start a blocker job; returns once its forward is in flight."""
    fake.gate.clear()
    fake.entered.clear()
    task = asyncio.create_task(ex.submit([make_row(2, seed=99)]))
    await until(fake.entered.is_set)
    return task


# ---- batch planning ----------------------------------------------------------------------------


def test_plan_padded_takes_the_oldest_rows_length_bucket() -> None:
    limits = BatchLimits()
    assert plan_batch([10, 100, 12, 11, 200], "padded", limits) == [0, 3, 2]
    # 100 opens a bucket up to 125: 110 joins, 130 does not, 10 is in the bucket below.
    assert bucket_ceiling(100) == 125
    assert plan_batch([100, 10, 110, 130], "padded", limits) == [0, 2]


def test_plan_for_a_forward_that_pads_nothing_takes_rows_in_arrival_order() -> None:
    # no length buckets: 10 and 200 share a batch; the caps count real tokens, not rows x longest
    assert plan_batch([10, 200, 12, 11], "padded", BatchLimits(), pads=False) == [0, 1, 2, 3]
    assert plan_batch([60, 30, 20, 5], "padded", BatchLimits(max_tokens=100), pads=False) == [0, 1]
    assert plan_batch([5] * 9, "padded", BatchLimits(max_rows=4), pads=False) == [0, 1, 2, 3]
    assert plan_batch([500, 3], "padded", BatchLimits(max_tokens=100), pads=False) == [0]  # too long: alone
    assert plan_batch([5, 7, 5], "equal_length", BatchLimits(), pads=False) == [0, 2]  # only padded changes


def test_plan_respects_token_and_row_caps() -> None:
    assert plan_batch([30] * 5, "padded", BatchLimits(max_tokens=100)) == [0, 1, 2]
    assert plan_batch([5] * 9, "padded", BatchLimits(max_rows=4)) == [0, 1, 2, 3]
    assert plan_batch([500, 3], "padded", BatchLimits(max_tokens=100)) == [0]  # too long: alone
    assert plan_batch([30] * 5, "equal_length", BatchLimits(max_tokens=100)) == [0, 1, 2]


def test_plan_equal_length_and_alone() -> None:
    assert plan_batch([5, 7, 5, 5, 6], "equal_length", BatchLimits()) == [0, 2, 3]
    assert plan_batch([5, 5, 5], "alone", BatchLimits()) == [0]
    assert plan_batch([], "padded", BatchLimits()) == []
    with pytest.raises(ValueError):
        plan_batch([1], "sideways", BatchLimits())  # type: ignore[arg-type]


# ---- sessions ----------------------------------------------------------------------------------


def test_create_session_pins_settings(graphs: dict[str, Path]) -> None:
    session = create_session(graphs["invariant"], "cpu", threads=1)
    assert session.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert session.output_names == ["last_hidden_state", "pooler_output"]
    assert session.device == "cpu"
    assert session.providers == ["CPUExecutionProvider"]
    assert session.engine_args == {
        "threads": 1,
        "inter_op_threads": 1,
        "graph_optimization_level": "ORT_ENABLE_ALL",
        "providers": ["CPUExecutionProvider"],
        "row_multiple": 1,  # x86: ONNX Runtime's softmax is batch-invariant without padding to a multiple
        "provider_options": {},
    }
    options = session.session.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)

    row = make_row(4)
    feeds = {
        "input_ids": row.ids[None],
        "attention_mask": np.ones((1, 4), np.int64),
        "token_type_ids": row.type_ids[None],
    }
    out = session.run(feeds, ["pooler_output"])
    assert list(out) == ["pooler_output"] and out["pooler_output"].shape == (1, HIDDEN)
    assert set(session.run(feeds)) == {"last_hidden_state", "pooler_output"}
    assert create_session(graphs["invariant"], "auto", threads=None).engine_args["threads"] == default_threads()


def test_cuda_sessions_run_without_tf32_unless_asked_and_say_so(graphs: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: ONNX Runtime is stood in for, to see what the CUDA provider is given and shown."""
    made: list[Any] = []

    class FakeSession:
        def __init__(self, path: str, sess_options: Any, providers: list[Any]) -> None:
            self.providers = providers
            made.append(self)

        def get_providers(self) -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

        def get_provider_options(self) -> dict[str, dict[str, str]]:
            return {"CUDAExecutionProvider": {"device_id": "0", **self.providers[0][1]}, "CPUExecutionProvider": {}}

        def get_inputs(self) -> list[Any]:
            return []

        get_outputs = get_inputs

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", FakeSession)
    plain = create_session(graphs["invariant"], "cuda", threads=1)
    assert made[-1].providers == [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
    assert plain.device == "cuda"
    assert plain.engine_args["provider_options"] == {"CUDAExecutionProvider": {"device_id": "0", "use_tf32": "0"}}
    asked = create_session(graphs["invariant"], "auto", threads=1, tf32=True)
    assert made[-1].providers[0] == ("CUDAExecutionProvider", {"use_tf32": "1"}) and asked.tf32
    sibling = asked.sibling(graphs["invariant"])  # another graph of the package: opened the same way
    assert made[-1].providers[0] == ("CUDAExecutionProvider", {"use_tf32": "1"}) and sibling.device == "cuda"


def test_create_session_errors(graphs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="device"):
        create_session(graphs["invariant"], "tpu", threads=1)
    with pytest.raises(SessionError, match="not found"):
        create_session(tmp_path / "absent.onnx", "cpu", threads=1)
    (tmp_path / "junk.onnx").write_bytes(b"not a graph")
    with pytest.raises(SessionError, match="cannot load"):
        create_session(tmp_path / "junk.onnx", "cpu", threads=1)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(SessionError, match="CUDAExecutionProvider"):
            create_session(graphs["invariant"], "cuda", threads=1)
        assert create_session(graphs["invariant"], "auto", threads=1).device == "cpu"


def test_cgroup_quota_and_default_threads(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "a" / "b").mkdir(parents=True)
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/a/b\n")
    assert cgroup_cpu_limit(root, proc) is None
    (root / "a" / "b" / "cpu.max").write_text("max 100000\n")
    (root / "a" / "cpu.max").write_text("150000 100000\n")  # an ancestor's limit applies too
    assert cgroup_cpu_limit(root, proc) == 1.5
    (root / "a" / "b" / "cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_limit(root, proc) == 0.5

    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "docker" / "x").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:cpu,cpuacct:/docker/x\n1:name=systemd:/docker/x\n")
    assert cgroup_cpu_limit(v1, proc) == 3.0
    (v1 / "cpu,cpuacct" / "docker" / "x" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(v1, proc) is None

    assert 1 <= default_threads() <= len(os.sched_getaffinity(0))


# ---- encoder forward ---------------------------------------------------------------------------


def test_encoder_forward_slices_rows_and_matches_numpy(graphs: dict[str, Path]) -> None:
    forward = EncoderForward(create_session(graphs["invariant"], "cpu", threads=1))
    rows = [make_row(3), make_row(7), make_row(5)]
    feeds = forward.feeds(rows)
    assert set(feeds) == {"input_ids", "attention_mask", "token_type_ids"}
    assert feeds["input_ids"].shape == (3, 7) and feeds["attention_mask"][0].tolist() == [1, 1, 1, 0, 0, 0, 0]
    results = forward(rows)
    for row, result in zip(rows, results):
        assert set(result) == {"last_hidden_state", "pooler_output"}
        assert result["last_hidden_state"].shape == (len(row.ids), HIDDEN)
        assert result["pooler_output"].shape == (HIDDEN,)
        np.testing.assert_allclose(result["last_hidden_state"], reference(row), rtol=1e-5, atol=1e-6)
        assert bitwise_equal(result, forward([row])[0])  # right padding leaves the row untouched
    assert forward.length(rows[1]) == 7

    only = EncoderForward(forward.session, outputs=["pooler_output"])
    assert list(only(rows)[0]) == ["pooler_output"]
    with pytest.raises(ValueError, match="no output"):
        EncoderForward(forward.session, outputs=["logits"])


def test_encoder_forward_without_token_type_ids(graphs: dict[str, Path]) -> None:
    forward = EncoderForward(create_session(graphs["no_types"], "cpu", threads=1))
    rows = [make_row(4), make_row(2)]
    assert set(forward.feeds(rows)) == {"input_ids", "attention_mask"}
    result = forward(rows)[1]
    np.testing.assert_allclose(result["last_hidden_state"], reference(rows[1], type_ids=False), rtol=1e-5, atol=1e-6)


# ---- probe -------------------------------------------------------------------------------------


def test_probe_grouping_per_graph(graphs: dict[str, Path]) -> None:
    def probe(name: str, max_tokens: int | None = None) -> str:
        forward = EncoderForward(create_session(graphs[name], "cpu", threads=1))
        return probe_grouping(forward, random_rows(7), max_tokens=max_tokens)

    assert probe("invariant") == "padded"
    assert probe("batch_mix") == "alone"
    assert probe("padding_mix") == "equal_length"
    assert probe("invariant", max_tokens=16) == "padded"


def test_probe_with_identical_rows_never_claims_equal_length(graphs: dict[str, Path]) -> None:
    # make_row gives the same row for the same length: an equal-length batch of two identical rows
    # cannot show batch mixing, so only the padded batch (distinct rows) can prove anything.
    def probe(name: str) -> str:
        return probe_grouping(EncoderForward(create_session(graphs[name], "cpu", threads=1)), make_row)

    assert probe("invariant") == "padded"
    assert probe("batch_mix") == "alone"
    assert probe("padding_mix") == "alone"


def test_probe_caps_lengths_and_ensures_an_equal_length_group() -> None:
    seen: list[list[int]] = []

    def forward(rows: Sequence[Row]) -> list[Any]:
        seen.append([len(r.ids) for r in rows])
        return [r.ids.astype(np.float32) for r in rows]

    assert probe_grouping(forward, random_rows(1), lengths=(3, 50, 9), max_tokens=20) == "padded"
    assert seen[:4] == [[3], [20], [9], [3]]  # alone, capped, plus a second row of 3
    assert [3, 3] in seen and max(max(b) for b in seen) == 20


def test_probe_says_alone_when_batching_raises() -> None:
    def forward(rows: Sequence[Row]) -> list[Any]:
        if len(rows) > 1:
            raise RuntimeError("batch dimension fixed at 1")
        return [rows[0].ids]

    assert probe_grouping(forward, random_rows(2)) == "alone"


def test_bitwise_equal_is_strict() -> None:
    a = np.array([0.0, 1.0], np.float32)
    assert bitwise_equal({"x": a, "y": [a]}, {"x": a.copy(), "y": [a.copy()]})
    assert not bitwise_equal(a, np.array([-0.0, 1.0], np.float32))
    assert not bitwise_equal(a, a.astype(np.float64))
    assert not bitwise_equal(a, np.nextafter(a, 2, dtype=np.float32))
    assert bitwise_equal(np.array([np.nan]), np.array([np.nan]))


# ---- executor ----------------------------------------------------------------------------------


def test_executor_answers_in_order_with_timings() -> None:
    async def main() -> None:
        fake = FakeForward()
        metrics = RecordingMetrics()
        ex = ModelExecutor("m", fake, "padded", max_queue=4, metrics=metrics)
        rows = [make_row(3), make_row(30), make_row(4)]
        result = await ex.submit(rows, deadline=time.monotonic() + WAIT_S)
        assert [o.tolist() for o in result.outputs] == [(r.ids * 2).tolist() for r in rows]
        assert result.batches == 2  # 3 and 4 share a bucket, 30 does not
        assert result.queue_s >= 0 and result.forward_s >= 0
        assert (await ex.submit([])).outputs == []
        forwards = metrics.named("observe_forward")
        assert sorted((rows_, tokens) for _, _, rows_, tokens in forwards) == [(1, 30), (2, 7)]
        assert len(metrics.named("observe_queue")) == 1
        assert metrics.named("set_queue_depth")[-1] == ("m", 0)
        ex.close()

    asyncio.run(main())


def test_overloaded_when_queue_full() -> None:
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=2)
        blocker = await hold(ex, fake)  # in flight: not waiting
        waiting = [asyncio.create_task(ex.submit([make_row(3, seed=i)])) for i in range(2)]
        await until(lambda: ex.queue_depth == 2)
        with pytest.raises(Overloaded):
            await ex.submit([make_row(3, seed=9)])
        fake.gate.set()
        await blocker
        assert all(len(r.outputs) == 1 for r in await asyncio.gather(*waiting))
        assert len(fake.batches) == 2  # the two waiting jobs shared one forward
        ex.close()

    asyncio.run(main())


def test_deadline_already_passed_never_runs() -> None:
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        with pytest.raises(DeadlineExceeded):
            await ex.submit([make_row(3)], deadline=time.monotonic() - 0.001)
        assert fake.batches == [] and ex.queue_depth == 0
        ex.close()

    asyncio.run(main())


def test_deadline_passing_while_queued_drops_the_job() -> None:
    async def main() -> None:
        fake = FakeForward()
        metrics = RecordingMetrics()
        ex = ModelExecutor("m", fake, "padded", max_queue=4, metrics=metrics)
        blocker = await hold(ex, fake)
        late = [make_row(3, seed=1), make_row(4, seed=1)]
        with pytest.raises(DeadlineExceeded) as info:
            await ex.submit(late, deadline=time.monotonic() + 0.02)  # answered while the forward is held
        assert info.value.outputs == [None, None]
        fake.gate.set()
        await blocker
        assert (await ex.submit([make_row(5)])).outputs[0].shape == (5,)
        assert not any(fake.ran(r) for r in late)
        assert ex.dropped_rows == 2 and metrics.named("on_dropped") == [("m", 2)]
        ex.close()

    asyncio.run(main())


def test_worker_skips_a_job_that_expired_in_the_queue() -> None:
    # The event loop is blocked (time.sleep) so the submitter's own timer cannot fire: the worker
    # must notice the expired deadline itself and never run the rows.
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        blocker = await hold(ex, fake)
        late = [make_row(3, seed=2)]
        task = asyncio.create_task(ex.submit(late, deadline=time.monotonic() + 0.01))
        await asyncio.sleep(0)  # the task enqueues its job; from here on the loop stays blocked
        assert ex.queue_depth == 1
        time.sleep(0.02)  # past the deadline
        fake.gate.set()
        end = time.monotonic() + WAIT_S
        while ex.queue_depth:  # only the worker can empty the queue while the loop is blocked
            assert time.monotonic() < end
            time.sleep(0.001)
        with pytest.raises(DeadlineExceeded):
            await task
        await blocker
        assert not fake.ran(late[0]) and ex.dropped_rows == 1
        ex.close()

    asyncio.run(main())


def test_cancelled_job_drops_rows_before_they_run() -> None:
    async def main() -> None:
        fake = FakeForward()
        metrics = RecordingMetrics()
        ex = ModelExecutor("m", fake, "padded", max_queue=4, metrics=metrics)
        blocker = await hold(ex, fake)
        gone = [make_row(3, seed=3), make_row(3, seed=4), make_row(8, seed=3)]
        task = asyncio.create_task(ex.submit(gone))
        await until(lambda: ex.queue_depth == 1)
        task.cancel()  # the client disconnected
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ex.dropped_rows == 3 and metrics.named("on_dropped") == [("m", 3)]
        assert ex.queue_depth == 0
        fake.gate.set()
        await blocker
        assert (await ex.submit([make_row(6)])).outputs[0].shape == (6,)
        assert not any(fake.ran(r) for r in gone)
        ex.close()

    asyncio.run(main())


def test_concurrent_jobs_batch_and_match_rows_run_alone(graphs: dict[str, Path]) -> None:
    forward = EncoderForward(create_session(graphs["invariant"], "cpu", threads=1))
    job_lengths = [(3, 9), (9,), (17, 4, 40), (5,), (9, 9)]
    jobs = [[make_row(n, seed=j) for n in lengths] for j, lengths in enumerate(job_lengths)]
    alone = [[forward([row])[0] for row in job] for job in jobs]

    class Gated:
        def __init__(self) -> None:
            self.gate = threading.Event()
            self.entered = threading.Event()
            self.batch_jobs: list[set[int]] = []

        def length(self, row: Row) -> int:
            return forward.length(row)

        def __call__(self, rows: Sequence[Row]) -> list[Any]:
            self.entered.set()
            assert self.gate.wait(WAIT_S)
            self.batch_jobs.append({j for r in rows for j, job in enumerate(jobs) if any(r is x for x in job)})
            return forward(rows)

    async def main() -> None:
        gated = Gated()
        ex = ModelExecutor("enc", gated, "padded", max_queue=16)
        blocker = asyncio.create_task(ex.submit([make_row(2, seed=50)]))
        await until(gated.entered.is_set)
        tasks = [asyncio.create_task(ex.submit(job)) for job in jobs]
        await until(lambda: ex.queue_depth == len(jobs))
        gated.gate.set()
        await blocker
        results = await asyncio.gather(*tasks)
        assert any(len(js) > 1 for js in gated.batch_jobs), gated.batch_jobs
        for result, expected in zip(results, alone):
            assert len(result.outputs) == len(expected)
            assert all(bitwise_equal(got, want) for got, want in zip(result.outputs, expected))
        ex.close()

    asyncio.run(main())


def _oom(rows: Sequence[Row]) -> Exception | None:
    if any(int(r.ids[0]) == 0 for r in rows):  # rows marked to "need too much memory"
        return RuntimeException(
            "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer of size 1234"
        )
    return None


def test_out_of_memory_alone_is_request_too_large() -> None:
    async def main() -> None:
        fake = FakeForward(fail=_oom)
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        with pytest.raises(RequestTooLarge) as info:
            await ex.submit([make_row(4, first=0), make_row(4)])
        assert isinstance(info.value.__cause__, RuntimeException)
        assert (await ex.submit([make_row(4)])).outputs[0].shape == (4,)  # still serving
        ex.close()

    asyncio.run(main())


def test_out_of_memory_shared_is_overloaded_for_every_job() -> None:
    async def main() -> None:
        fake = FakeForward(fail=_oom)
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        blocker = await hold(ex, fake)
        tasks = [
            asyncio.create_task(ex.submit([make_row(4, seed=5, first=0)])),
            asyncio.create_task(ex.submit([make_row(4, seed=6)])),
        ]
        await until(lambda: ex.queue_depth == 2)
        fake.gate.set()
        await blocker
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert [type(o) for o in outcomes] == [Overloaded, Overloaded]
        assert len(fake.batches[-1]) == 2  # they did share the forward
        assert (await ex.submit([make_row(4, seed=6)])).outputs[0].shape == (4,)
        ex.close()

    asyncio.run(main())


def test_forward_error_fails_only_its_batch(graphs: dict[str, Path]) -> None:
    async def main() -> None:
        failing = EncoderForward(create_session(graphs["failing"], "cpu", threads=1))
        ex = ModelExecutor("bad", failing, "alone", max_queue=4)
        ok = await ex.submit([make_row(3)])
        assert ok.outputs[0]["logits"].shape == (3,)
        with pytest.raises(ForwardError) as info:
            await ex.submit([make_row(4)])
        assert info.value.__cause__ is not None and not is_out_of_memory(info.value.__cause__)
        again = await ex.submit([make_row(3, seed=1)])
        assert again.outputs[0]["logits"].tolist() == make_row(3, seed=1).ids.astype(np.float32).tolist()
        ex.close()

    asyncio.run(main())


def test_stall_reported_while_a_forward_runs() -> None:
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        assert ex.stalled(0) is None
        blocker = await hold(ex, fake)
        reason = ex.stalled(0)
        assert reason is not None and "m" in reason and "forward" in reason
        assert ex.stalled(3600) is None
        fake.gate.set()
        await blocker
        assert ex.stalled(0) is None and ex.forward_started_at is None
        ex.close()

    asyncio.run(main())


def test_close_fails_waiting_jobs() -> None:
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        blocker = await hold(ex, fake)
        waiting = asyncio.create_task(ex.submit([make_row(3)]))
        await until(lambda: ex.queue_depth == 1)
        closer = threading.Thread(target=ex.close)
        closer.start()
        with pytest.raises(ExecutorClosed):
            await waiting
        fake.gate.set()
        assert len((await blocker).outputs) == 1  # the forward in flight still answers
        closer.join(WAIT_S)
        with pytest.raises(ExecutorClosed):
            await ex.submit([make_row(3)])
        assert ex.stalled(0) is None

    asyncio.run(main())


def test_is_out_of_memory_markers() -> None:
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeException("std::bad_alloc"))
    assert is_out_of_memory(RuntimeError("CUDA failure 2: out of memory"))
    assert not is_out_of_memory(RuntimeException("Invalid rank for input: input_ids"))


def test_executor_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        ModelExecutor("m", FakeForward(), "sideways", max_queue=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ModelExecutor("m", FakeForward(), "alone", max_queue=0)


def test_a_shared_forward_failure_is_logged_once_per_request_with_its_id(caplog: pytest.LogCaptureFixture) -> None:
    """The worker thread logs a failed forward in each submitting request's context (its request id)."""
    from edge_runtime.api.request_ids import RequestIdFilter, current

    async def submit_as(ex: ModelExecutor, rid: str, row: Row) -> Any:
        current.set(rid)  # a task's own context copy: as Sanic's middleware sets it per request
        return await ex.submit([row])

    async def main() -> None:
        fake = FakeForward(fail=lambda rows: ValueError("broken") if len(rows) == 2 else None)
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        blocker = await hold(ex, fake)
        tasks = [asyncio.create_task(submit_as(ex, rid, make_row(4, seed=s)))
                 for rid, s in (("req-a", 5), ("req-b", 6))]
        await until(lambda: ex.queue_depth == 2)
        fake.gate.set()
        await blocker
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert [type(o) for o in outcomes] == [ForwardError, ForwardError]
        ex.close()

    caplog.handler.addFilter(RequestIdFilter())
    with caplog.at_level(logging.ERROR, logger="edge_runtime.engine.executor"):
        asyncio.run(main())
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert sorted(r.request_id for r in failed) == ["req-a", "req-b"]  # type: ignore[attr-defined]
    assert all(r.threadName == "engine-m" for r in failed)


def test_models_file_tf32_is_a_boolean_off_by_default(tmp_path: Path) -> None:
    from edge_runtime.config import ConfigError
    from edge_runtime.models_file import load_models_file
    from tests.support.server_harness import write_models_file

    loaded = load_models_file(write_models_file(tmp_path / "a.yaml", [
        {"name": "a", "package": "p"}, {"name": "b", "package": "p", "tf32": True}]))
    assert [m.tf32 for m in loaded] == [False, True]
    with pytest.raises(ConfigError, match="tf32 must be true or false"):
        load_models_file(write_models_file(tmp_path / "b.yaml", [{"name": "a", "package": "p", "tf32": "yes"}]))


# ---- load counters (the pod-level scaling gauges) ------------------------------------------------


def counts(load: ExecutorLoad) -> ExecutorLoad:
    """The load without its running mean, which depends on timing."""
    return ExecutorLoad(load.queued, load.in_flight, load.capacity)


def test_load_counts_waiting_and_in_flight_jobs_and_returns_to_zero() -> None:
    async def main() -> None:
        fake = FakeForward()
        metrics = RecordingMetrics()
        ex = ModelExecutor("m", fake, "padded", max_queue=4, metrics=metrics)
        (watched,) = metrics.named("watch")
        assert watched[0] == "m" and counts(watched[1]()) == ExecutorLoad(0, 0, 4 + ex.limits.max_rows)
        assert ex.capacity == 4 + ex.limits.max_rows
        blocker = await hold(ex, fake)
        assert counts(ex.load()) == ExecutorLoad(0, 1, ex.capacity)
        waiting = [asyncio.create_task(ex.submit([make_row(3, seed=i)])) for i in range(3)]
        await until(lambda: ex.queue_depth == 3)
        assert counts(ex.load()) == ExecutorLoad(3, 1, ex.capacity)
        # A job whose deadline passes while it waits leaves both counts.
        with pytest.raises(DeadlineExceeded):
            await ex.submit([make_row(4, seed=7)], deadline=time.monotonic() + 0.02)
        assert counts(ex.load()) == ExecutorLoad(3, 1, ex.capacity)
        fake.entered.clear()
        fake.gate.set()
        await blocker
        await asyncio.gather(*waiting)
        assert counts(ex.load()) == ExecutorLoad(0, 0, ex.capacity)
        ex.close()

    asyncio.run(main())


class SteppedForward(FakeForward):
    """Each forward waits for its own step() (a semaphore), so a test holds the second forward too."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = threading.Semaphore(0)
        self.calls = 0

    def __call__(self, rows: Sequence[Row]) -> list[Any]:
        self.calls += 1
        self.entered.set()
        assert self.steps.acquire(timeout=WAIT_S), "the test never stepped the forward"
        self.batches.append(list(rows))
        return [row.ids * 2 for row in rows]

    def step(self) -> None:
        self.steps.release()


def test_load_counts_every_job_of_a_shared_forward_and_closing_empties_it() -> None:
    async def main() -> None:
        fake = SteppedForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=8)
        blocker = asyncio.create_task(ex.submit([make_row(2, seed=99)]))
        await until(lambda: fake.calls == 1)
        jobs = [asyncio.create_task(ex.submit([make_row(3, seed=i)])) for i in range(3)]
        await until(lambda: ex.queue_depth == 3)
        fake.step()
        await blocker
        # The three waiting jobs share the next forward, held: three in flight, none waiting.
        await until(lambda: fake.calls == 2)
        assert counts(ex.load()) == ExecutorLoad(0, 3, ex.capacity)
        more = asyncio.create_task(ex.submit([make_row(5, seed=5)]))
        await until(lambda: ex.queue_depth == 1)
        assert counts(ex.load()) == ExecutorLoad(1, 3, ex.capacity)
        fake.step()
        fake.step()
        await asyncio.gather(*jobs, more)
        assert counts(ex.load()) == ExecutorLoad(0, 0, ex.capacity)
        held = asyncio.create_task(ex.submit([make_row(2, seed=98)]))
        await until(lambda: fake.calls == 4)
        queued = asyncio.create_task(ex.submit([make_row(3, seed=11)]))
        await until(lambda: ex.queue_depth == 1)
        closing = threading.Thread(target=ex.close)  # waits for the forward in flight
        closing.start()
        with pytest.raises(ExecutorClosed):
            await queued
        assert counts(ex.load()) == ExecutorLoad(0, 1, ex.capacity)
        fake.step()
        await held
        closing.join(WAIT_S)
        assert counts(ex.load()) == ExecutorLoad(0, 0, ex.capacity)

    asyncio.run(main())


def test_capacity_of_a_model_whose_rows_run_alone() -> None:
    ex = ModelExecutor("m", FakeForward(), "alone", max_queue=5)
    assert ex.capacity == 6 and counts(ex.load()) == ExecutorLoad(0, 0, 6)
    ex.close()


def test_spinning_off_sets_the_session_config_entry(graphs: dict[str, Path]) -> None:
    from edge_runtime.engine.session import ALLOW_SPINNING_KEY, FORCE_SPINNING_STOP_KEY

    default = create_session(graphs["invariant"], "cpu", threads=1)
    quiet = create_session(graphs["invariant"], "cpu", threads=1, spinning=False)
    assert default.spinning and not quiet.spinning
    assert quiet.session.get_session_options().get_session_config_entry(ALLOW_SPINNING_KEY) == "0"
    with pytest.raises(RuntimeError, match="does not have configuration"):  # ORT default: the key is unset
        default.session.get_session_options().get_session_config_entry(ALLOW_SPINNING_KEY)
    # spinning, but never after a forward: the next model's forward needs the cores
    assert default.session.get_session_options().get_session_config_entry(FORCE_SPINNING_STOP_KEY) == "1"
    row = make_row(5)
    forward_default, forward_quiet = EncoderForward(default), EncoderForward(quiet)
    # Spinning decides only how idle threads wait: the outputs are the same bits.
    assert bitwise_equal(forward_default([row]), forward_quiet([row]))


def test_queue_mean_follows_the_queue_with_its_time_constant() -> None:
    async def main() -> None:
        fake = FakeForward()
        ex = ModelExecutor("m", fake, "padded", max_queue=4)
        blocker = await hold(ex, fake)
        waiting = [asyncio.create_task(ex.submit([make_row(3, seed=i)])) for i in range(2)]
        await until(lambda: ex.queue_depth == 2)
        queued_at = time.monotonic()
        await asyncio.sleep(0.3)
        before = time.monotonic()
        mean = ex.load().queued_mean
        after = time.monotonic()
        # Two jobs waited at least 0.3 s and at most since they were queued: 2 (1 - e^(-t / tau)).
        assert 2 * (1 - math.exp(-(before - queued_at) / QUEUE_MEAN_TAU_S)) * 0.98 <= mean
        assert mean <= 2 * (1 - math.exp(-(after - queued_at + 0.05) / QUEUE_MEAN_TAU_S))
        fake.gate.set()
        await blocker
        await asyncio.gather(*waiting)
        emptied = ex.load().queued_mean
        await asyncio.sleep(0.2)
        assert 0 < ex.load().queued_mean < emptied  # an empty queue: the mean decays towards 0
        ex.close()

    asyncio.run(main())
