"""Model updates in process (edge_runtime/updates): change detection, load beside and verify, the
atomic switch, the drain of accepted work, rollbacks (failure, explicit, automatic), the memory
guard. The server-level checks (SIGHUP, the admin listener) are in tests/test_updates_server.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import ServeConfig, UpdateRules
from edge_runtime.engine.errors import ForwardError
from edge_runtime.errors import ApiError
from edge_runtime.metrics import Metrics
from edge_runtime.models_file import load_models_file
from edge_runtime.packages.golden import npz_bytes
from edge_runtime.packages.manifest import build_manifest
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.updates import Updates, UpdateSettings, identity, incomplete, package_need, plan
from tests.support.server_harness import write_models_file

EMBED = {"model": "emb", "input": ["a swap test"], "options": {"return_meta": True}}


def write_manifest(root: Path) -> None:
    (root / "MANIFEST.json").unlink(missing_ok=True)
    (root / "MANIFEST.json").write_text(json.dumps(build_manifest(root)), encoding="utf-8")


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two verified embedding versions (seeds 0 and 1) and three bad ones, all under one root."""
    from converters.encoder.fixture import build_fixture

    root = tmp_path_factory.mktemp("update-packages")
    a = build_fixture("embedding", root / "emb-a", seed=0)
    b = build_fixture("embedding", root / "emb-b", seed=1)
    corrupt = root / "emb-corrupt"
    shutil.copytree(b, corrupt)
    graph = corrupt / "model.onnx"
    data = bytearray(graph.read_bytes())
    data[-100] ^= 0xFF  # same size, other bytes: the digest check must catch it
    graph.write_bytes(bytes(data))
    goldens = root / "emb-goldens"
    shutil.copytree(b, goldens)
    golden = goldens / "golden.npz"
    with np.load(golden, allow_pickle=False) as npz:
        arrays = {k: (npz[k] + 1.0 if "/out/" in k else npz[k]) for k in npz.files}
    golden.write_bytes(npz_bytes(arrays))
    write_manifest(goldens)  # a package that verifies, whose goldens the graph does not reproduce
    partial = root / "emb-partial"
    shutil.copytree(b, partial)
    (partial / "model.onnx").write_bytes((b / "model.onnx").read_bytes()[:1000])  # a copy in progress
    return {"a": a, "b": b, "corrupt": corrupt, "goldens": goldens, "partial": partial, "root": root}


def entry(package: Path, **extra: Any) -> dict[str, Any]:
    """An entry of emb; seeds 0 and 1 are different embedders, so swaps between them are allowed to
    change the output space unless a test says otherwise. No result cache: these tests judge versions
    by what their forwards do, and they repeat one request."""
    return {"name": "emb", "package": str(package), "device": "cpu", "threads": 1,
            "update": {"allow_space_change": True}, "result_cache_entries": 0, **extra}


@pytest.fixture
def served(packages: dict[str, Path], tmp_path: Path) -> Iterator[Callable[..., tuple[Runtime, Updates]]]:
    made: list[tuple[Runtime, Updates]] = []

    def make(**settings: Any) -> tuple[Runtime, Updates]:
        models_file = write_models_file(tmp_path / "models.yaml", [entry(packages["a"])])
        config = ServeConfig(models_file=models_file, models=load_models_file(models_file))
        runtime = Runtime(config, Metrics())
        runtime.load_all()
        updates = Updates(runtime, UpdateSettings(**{"drain_seconds": 5.0, "watch_seconds": 0.0, **settings}),
                          runtime.metrics)
        updates.start()
        made.append((runtime, updates))
        return runtime, updates

    yield make
    for runtime, updates in made:
        updates.stop()
        runtime.close()


def finished(op: Any, timeout: float = 60.0) -> Any:
    assert op.done.wait(timeout), op.describe()
    return op


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def answer(runtime: Runtime, body: dict[str, Any] = EMBED) -> dict[str, Any]:
    async def one() -> dict[str, Any]:
        return await serve(runtime, "embeddings", json.loads(json.dumps(body)), Timing())

    return asyncio.run(one())


def metric(runtime: Runtime, name: str, **labels: str) -> float:
    value = runtime.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# -- change detection -------------------------------------------------------------------------


def test_plan_diffs_each_entry_by_identity(packages: dict[str, Path], tmp_path: Path) -> None:
    def cfg(models: list[dict[str, Any]]) -> Any:
        return load_models_file(write_models_file(tmp_path / "m.yaml", models))

    (a,) = cfg([entry(packages["a"])])
    applied = {"emb": (a, identity(a)), "gone": (a, identity(a))}
    wanted = cfg([entry(packages["a"], aliases=["e"]), {**entry(packages["b"]), "name": "new"}])
    actions = {c.name: c.action for c in plan(applied, wanted, {}, retry_failed=False)}
    assert actions == {"emb": "aliases", "new": "added", "gone": "removed"}
    # the same package at another path is the same version; new settings on it are a new version
    moved = packages["root"] / "emb-a-moved"
    shutil.copytree(packages["a"], moved)
    assert [c.action for c in plan(applied, cfg([entry(moved)]), {}, False)][0] == "unchanged"
    assert [c.action for c in plan(applied, cfg([entry(packages["a"], threads=2)]), {}, False)][0] == "changed"
    changed = plan(applied, cfg([entry(packages["b"])]), {}, False)[0]
    assert (changed.action, changed.from_version, changed.to_version) == (
        "changed", identity(a).version_id, identity(cfg([entry(packages["b"])])[0]).version_id)
    # a half-copied package is waited for; a failed identity is left alone by a poll, retried on SIGHUP
    assert plan(applied, cfg([entry(packages["partial"])]), {}, False)[0].action == "wait"
    (b,) = cfg([entry(packages["b"])])
    assert plan(applied, (b,), {"emb": identity(b)}, retry_failed=False)[0].action == "unchanged"
    assert plan(applied, (b,), {"emb": identity(b)}, retry_failed=True)[0].action == "changed"


def test_incomplete_names_what_is_missing(packages: dict[str, Path], tmp_path: Path) -> None:
    assert incomplete(packages["a"]) is None
    assert "model.onnx has 1000 of" in (incomplete(packages["partial"]) or "")
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(packages["a"] / "card.json", copy / "card.json")
    assert "MANIFEST.json is not there yet" in (incomplete(copy) or "")
    shutil.copytree(packages["a"], tmp_path / "extra")
    (tmp_path / "extra" / ".model.onnx.tmp").write_bytes(b"x")
    assert "not in MANIFEST.json" in (incomplete(tmp_path / "extra") or "")


def test_memory_need_is_estimated_from_file_sizes_when_the_card_has_none(packages: dict[str, Path]) -> None:
    need = package_need(packages["a"], "fp32")
    graph = (packages["a"] / "model.onnx").stat().st_size
    assert need.source.startswith("estimate") and need.bytes >= 2 * graph


# -- load beside, verify, switch, drain ---------------------------------------------------------


def test_swap_switches_atomically_and_meta_names_the_version(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served()
    old = runtime.models["emb"]
    assert answer(runtime)["meta"]["version_id"] == old.version_id
    op = finished(updates.load(updates.entry_for("emb", packages["b"], None)))
    assert op.state == "succeeded", op.describe()
    new = runtime.models["emb"]
    assert new is not old and new.version_state == "active" and new.version_id == op.result["version_id"]
    assert answer(runtime)["meta"]["version_id"] == new.version_id
    wait_for(lambda: old.version_state == "retired")
    assert old.executor is None and old.session is None and old.family is None
    assert metric(runtime, "edge_runtime_model_swaps_total", model="emb", result="succeeded") == 1
    assert metric(runtime, "edge_runtime_model_active_version", model="emb", version=new.version_id) == 1
    states = [v.version_state for v in runtime.versions["emb"]]
    assert states == ["active", "retired"]


def test_a_request_accepted_before_the_switch_finishes_on_the_old_version(
        served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served()
    old = runtime.models["emb"]
    assert old.executor is not None
    forward = old.executor.forward

    class Slow:
        """The old version's forward, 1.5 s slower: the request is in flight across the switch."""

        pads = getattr(forward, "pads", True)

        def length(self, row: Any) -> int:
            return int(forward.length(row))

        def __call__(self, rows: list[Any]) -> Any:
            time.sleep(1.5)
            return forward(rows)

    old.executor.forward = Slow()
    old.executor.inline_max_s = 0.0

    async def scenario() -> tuple[dict[str, Any], str]:
        task = asyncio.create_task(serve(runtime, "embeddings", dict(EMBED), Timing()))
        await asyncio.sleep(0.2)  # accepted and running on the old version
        loop = asyncio.get_running_loop()
        op = await loop.run_in_executor(None, updates.load, updates.entry_for("emb", packages["b"], None))
        await loop.run_in_executor(None, finished, op)
        state_during = old.version_state
        return await task, state_during

    got, state_during = asyncio.run(scenario())
    assert got["meta"]["version_id"] == old.version_id  # answered, by the version that accepted it
    assert state_during == "draining"
    wait_for(lambda: old.version_state == "retired")
    assert answer(runtime)["meta"]["version_id"] == runtime.models["emb"].version_id != old.version_id
    assert metric(runtime, "edge_runtime_model_drain_timeouts_total", model="emb") == 0  # drained in time


def test_drain_deadline_answers_what_is_left_503_never_drops_it(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served(drain_seconds=0.3)
    old = runtime.models["emb"]
    old.acquire()  # a request that resolved the old version and has not reached its executor yet
    finished(updates.load(updates.entry_for("emb", packages["b"], None)))
    wait_for(lambda: old.version_state == "retired")
    with pytest.raises(ApiError) as caught:
        asyncio.run(runtime.execute(old, _plan_for(old), None, Timing()))
    assert caught.value.code == "not_ready"  # 503 with Retry-After (api/statuses.py)
    assert metric(runtime, "edge_runtime_model_drain_timeouts_total", model="emb") == 1
    old.release()


def _plan_for(model: Any) -> Any:
    """A plan with one row: what a request that resolved ``model`` brings to its executor."""

    class Planned:
        rows = [object()]
        input_tokens = 0
        extras: dict[str, Any] = {}

    return Planned()


# -- failures before the switch keep the old version --------------------------------------------


@pytest.mark.parametrize(("package", "reason"), [("corrupt", "verify"), ("goldens", "self_check")])
def test_a_bad_package_leaves_the_old_version_active(served: Any, packages: dict[str, Path], package: str,
                                                     reason: str) -> None:
    runtime, updates = served()
    old = runtime.models["emb"]
    op = finished(updates.load(updates.entry_for("emb", packages[package], None)))
    assert op.state == "failed" and "stays active" in (op.reason or ""), op.describe()
    assert runtime.models["emb"] is old and old.version_state == "active"
    assert metric(runtime, "edge_runtime_model_rollbacks_total", model="emb", reason=reason) == 1
    assert metric(runtime, "edge_runtime_model_swaps_total", model="emb", result="failed") == 1
    assert any(v["state"] == "failed" for v in updates.describe()["models"][0]["versions"])
    assert answer(runtime)["meta"]["version_id"] == old.version_id


def test_a_half_copied_package_is_never_loaded(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served()
    with pytest.raises(ApiError) as caught:
        updates.load(updates.entry_for("emb", packages["partial"], None))
    assert caught.value.code == "package_incomplete"
    assert len(updates.resident["emb"]) == 1


def test_a_swap_that_does_not_fit_is_refused_naming_both_numbers(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served(memory_reserve_bytes=1 << 60)
    with pytest.raises(ApiError) as caught:
        updates.load(updates.entry_for("emb", packages["b"], None))
    need = package_need(packages["b"], "fp32").bytes
    assert caught.value.code == "insufficient_memory"
    assert f"needs {need} bytes" in str(caught.value) and "the budget is 0 bytes" in str(caught.value)
    assert metric(runtime, "edge_runtime_model_rollbacks_total", model="emb", reason="memory") == 1


def test_replace_policy_unloads_first_then_loads(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served(memory_reserve_bytes=1 << 60, policy="replace")
    old = runtime.models["emb"]
    op = finished(updates.load(updates.entry_for("emb", packages["b"], None)))
    assert op.state == "succeeded", op.describe()
    assert old.version_state == "retired" and runtime.models["emb"].version_state == "active"
    assert any("replace policy" in s["step"] for s in op.steps)


# -- rollback -------------------------------------------------------------------------------------


def test_explicit_rollback_restores_the_previous_version(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served(watch_seconds=30.0)
    old = runtime.models["emb"]
    finished(updates.load(updates.entry_for("emb", packages["b"], None)))
    wait_for(lambda: old.version_state == "standby")  # drained, kept through the watch window
    new = runtime.models["emb"]
    assert answer(runtime, {**EMBED, "model": f"emb@{old.version_id}"})["meta"]["version_id"] == old.version_id
    op = finished(updates.rollback("emb"))
    assert op.state == "succeeded" and runtime.models["emb"] is old
    wait_for(lambda: new.version_state == "failed")
    assert new.reason == "rolled back: explicit"
    assert metric(runtime, "edge_runtime_model_rollbacks_total", model="emb", reason="explicit") == 1


def test_a_version_failing_half_its_forwards_is_rolled_back_automatically(
        served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served(watch_seconds=30.0, rollback_min_requests=10)
    old = runtime.models["emb"]
    for _ in range(10):  # the old version's record: no errors
        answer(runtime)
    finished(updates.load(updates.entry_for("emb", packages["b"], None)))
    new = runtime.models["emb"]
    assert new.executor is not None
    forward, calls = new.executor.forward, [0]

    class HalfBroken:
        pads = getattr(forward, "pads", True)

        def length(self, row: Any) -> int:
            return int(forward.length(row))

        def __call__(self, rows: list[Any]) -> Any:
            calls[0] += 1
            if calls[0] % 2:
                raise RuntimeError("a broken kernel")
            return forward(rows)

    new.executor.forward = HalfBroken()
    new.executor.inline_max_s = 0.0
    failures = 0
    for _ in range(12):
        try:
            answer(runtime)
        except ForwardError:
            failures += 1
    assert failures >= 5
    wait_for(lambda: runtime.models["emb"] is old)
    assert metric(runtime, "edge_runtime_model_rollbacks_total", model="emb", reason="error_rate") == 1
    wait_for(lambda: new.version_state == "failed")
    assert (new.reason or "").startswith("rolled back: error_rate") or "error rate" in (new.reason or "")


@pytest.mark.heavy
def test_soak_100_swaps_under_light_load_fail_nothing_and_keep_rss(served: Any, packages: dict[str, Path]) -> None:
    """100 swaps A -> B -> A ... while a client asks every 20 ms: no request fails, and RSS after the
    last swap is within 10% of RSS after the second (released versions give their memory back).
    Measured here: 100 swaps in 22.5 s, 248 answers, 0 failed, RSS 534.6 -> 537.4 MiB (1.005)."""
    from edge_runtime.updates.memory import resident_bytes

    runtime, updates = served()
    rss: list[int] = []
    counts = {"answered": 0, "failed": 0}

    async def client(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await serve(runtime, "embeddings", json.loads(json.dumps(EMBED)), Timing())
                counts["answered"] += 1
            except (ApiError, ForwardError):
                counts["failed"] += 1
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(client(stop))
        loop = asyncio.get_running_loop()
        for i in range(100):
            target = packages["b"] if i % 2 == 0 else packages["a"]
            op = await loop.run_in_executor(None, updates.load, updates.entry_for("emb", target, None))
            await loop.run_in_executor(None, finished, op)
            assert op.state == "succeeded", op.describe()
            while len(updates.resident["emb"]) > 1:  # the old version drained and released
                await asyncio.sleep(0.01)
            rss.append(resident_bytes())
        stop.set()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 300))
    assert counts["failed"] == 0 and counts["answered"] > 100
    assert rss[-1] <= 1.10 * rss[1], (rss[1], rss[-1])


# -- the embedding-space guard and the agreement report -----------------------------------------


def test_an_embedder_with_other_weights_is_held_pinned_until_promoted(
        served: Any, packages: dict[str, Path], tmp_path: Path) -> None:
    runtime, updates = served()
    old = runtime.models["emb"]
    strict = updates.entry_for("emb", packages["b"], None)
    strict = dataclasses.replace(strict, update=UpdateRules())  # the default: not allowed
    op = finished(updates.load(strict))
    assert op.state == "succeeded" and op.result["held"] is True, op.describe()
    report = op.result["agreement"]
    assert report["space"]["changed"] is True and report["min_cosine"] < 0.99 and report["cases"] > 0
    new = updates._version("emb", op.result["version_id"]).model
    assert runtime.models["emb"] is old and new.version_state == "standby"
    assert "output space changed" in (new.reason or "")
    assert answer(runtime)["meta"]["version_id"] == old.version_id
    pinned = answer(runtime, {**EMBED, "model": f"emb@{new.version_id}"})
    assert pinned["meta"]["version_id"] == new.version_id
    listed = {v.version_id: v.version() for v in runtime.versions["emb"]}
    assert listed[new.version_id]["state"] == "standby" and "output space" in listed[new.version_id]["reason"]
    assert any(v.get("agreement") == report for v in updates.describe()["models"][0]["versions"])
    assert metric(runtime, "edge_runtime_model_swaps_total", model="emb", result="held") == 1
    assert metric(runtime, "edge_runtime_model_agreement", model="emb", figure="min_cosine") == report["min_cosine"]
    _, health = runtime.health()
    assert any(v["state"] == "standby" and "output space" in v.get("reason", "")
               for v in health["models"]["emb"]["versions"])
    finished(updates.promote("emb", new.version_id))  # the explicit promotion is the allowance
    assert runtime.models["emb"] is new and new.version_state == "active" and new.reason is None
    assert answer(runtime)["meta"]["version_id"] == new.version_id


def test_an_embedder_with_the_same_weights_is_promoted(served: Any, packages: dict[str, Path]) -> None:
    runtime, updates = served()
    strict = updates.entry_for("emb", packages["a"], None)
    strict = dataclasses.replace(strict, update=UpdateRules(), threads=2)
    op = finished(updates.load(strict))  # the same package with another setting: a new version, same space
    report = op.result["agreement"]
    assert op.state == "succeeded" and "held" not in op.result, op.describe()
    assert report["space"] == {"changed": False} and report["min_cosine"] > 0.9999
    assert runtime.models["emb"].config.threads == 2


def test_a_changed_head_is_a_space_change(packages: dict[str, Path]) -> None:
    from edge_runtime.families.registry import read_package
    from edge_runtime.updates.agreement import space_change

    card = read_package(packages["a"]).card
    smaller = dataclasses.replace(card, head={**card.head, "dimension": 16, "dimensions": [16]})
    same = {"cases": 4, "comparable": True, "min_cosine": 1.0}
    assert space_change(card, card, same, UpdateRules()) is None
    assert "dimension 32 -> 16" in (space_change(card, smaller, same, UpdateRules()) or "")
    assert "min cosine 0.9800 < 0.99" in (space_change(card, card, {**same, "min_cosine": 0.98}, UpdateRules()) or "")
    assert space_change(card, card, {**same, "min_cosine": 0.98}, UpdateRules(space_min_cosine=0.9)) is None
    assert "no golden case" in (space_change(card, card, {"cases": 0}, UpdateRules()) or "")


class Scripted:
    """A session whose outputs are given: logits per call, in call order."""

    input_names = ["input_ids"]
    output_names = ["logits"]

    def __init__(self, logits: list[list[float]]) -> None:
        self.logits = list(logits)

    def run(self, feeds: Any, names: Any) -> dict[str, np.ndarray]:
        return {"logits": np.array([self.logits.pop(0)], dtype=np.float32)}


def test_agreement_figures_on_constructed_cases(tmp_path: Path) -> None:
    from converters.encoder.fixture import build_fixture
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages.golden import GoldenCase
    from edge_runtime.updates.agreement import Side, compare

    card = read_package(build_fixture("sequence-classification", tmp_path / "cls", seed=0)).card
    cases = [GoldenCase({"input_ids": np.zeros((1, 3), np.int64)}, {"logits": np.zeros((1, 3), np.float32)})] * 2
    same = [[0.0, 1.0, 2.0], [2.0, 0.0, 0.0]]
    report = compare(Side("old", card, Scripted(same), cases), Side("new", card, Scripted(same), []))
    assert (report["cases"], report["max_abs_dp"], report["argmax_agreement"]) == (2, 0.0, 1.0)
    # p = softmax: [1/3]*3 against [0.5, 0.25, 0.25] (|dp| 1/6, argmax 0 both: numpy takes the first of a tie);
    # then [0.7, 0.2, 0.1]-like logits against the same with labels 0 and 2 exchanged (argmax differs)
    log = np.log
    old = [[0.0, 0.0, 0.0], [log(0.7), log(0.2), log(0.1)]]
    new = [[log(0.5), log(0.25), log(0.25)], [log(0.1), log(0.2), log(0.7)]]
    report = compare(Side("old", card, Scripted(old), cases), Side("new", card, Scripted(new), []))
    assert report["argmax_agreement"] == 0.5
    assert abs(report["max_abs_dp"] - 0.6) < 1e-6  # 0.7 -> 0.1 on label 0 of the second case
    from edge_runtime.updates.agreement import gate_failures

    assert gate_failures(report, UpdateRules()) == []
    assert gate_failures(report, UpdateRules(max_dp=0.7, min_argmax_agreement=0.5)) == []
    failed = gate_failures(report, UpdateRules(max_dp=0.1, min_argmax_agreement=0.9))
    assert failed == ["max |dp| 0.6 > 0.1", "argmax agreement 0.5 < 0.9"]

    class Refusing(Scripted):
        def run(self, feeds: Any, names: Any) -> dict[str, np.ndarray]:
            raise RuntimeError("INVALID_ARGUMENT: unexpected input shape")

    report = compare(Side("old", card, Scripted(same), cases), Side("new", card, Refusing([]), []))
    assert (report["cases"], report["skipped"]) == (0, 2) and "INVALID_ARGUMENT" in report["skipped_reasons"][0]
    assert gate_failures(report, UpdateRules()) == []  # no gate, nothing to fail
    assert "no golden case could be compared" in gate_failures(report, UpdateRules(max_dp=0.5))[0]


def test_an_agreement_gate_that_fails_keeps_the_old_version(tmp_path: Path) -> None:
    from converters.encoder.fixture import build_fixture

    a = build_fixture("sequence-classification", tmp_path / "cls-a", seed=0)
    b = build_fixture("sequence-classification", tmp_path / "cls-b", seed=1)
    gate = {"max_dp": 0.01, "min_argmax_agreement": 1.0}
    models_file = write_models_file(tmp_path / "models.yaml", [
        {"name": "cls", "package": str(a), "device": "cpu", "threads": 1, "update": gate}])
    runtime = Runtime(ServeConfig(models_file=models_file, models=load_models_file(models_file)), Metrics())
    runtime.load_all()
    updates = Updates(runtime, UpdateSettings(drain_seconds=5.0, watch_seconds=0.0), runtime.metrics)
    updates.start()
    try:
        old = runtime.models["cls"]
        op = finished(updates.load(updates.entry_for("cls", b, None)))
        assert op.state == "failed" and op.code == "update_failed", op.describe()
        assert "agreement gate" in (op.reason or "") and "max |dp|" in (op.reason or "")
        assert f"{old.version_id} stays active" in (op.reason or "")
        assert runtime.models["cls"] is old and old.version_state == "active"
        report = op.result["agreement"]
        assert report["max_abs_dp"] > 0.01 and "space" not in report  # a classifier: no space guard
        assert metric(runtime, "edge_runtime_model_rollbacks_total", model="cls", reason="agreement") == 1
        assert metric(runtime, "edge_runtime_model_agreement", model="cls", figure="max_abs_dp") == report["max_abs_dp"]
        failed = [v for v in updates.describe()["models"][0]["versions"] if v["state"] == "failed"]
        assert failed and "agreement gate" in failed[0]["reason"]
        # the same package again passes the gate: max |dp| 0, agreement 1
        op = finished(updates.load(updates.entry_for("cls", a, None)))
        report = op.result["agreement"]
        assert op.state == "succeeded" and report["max_abs_dp"] == 0.0 and report["argmax_agreement"] == 1.0
    finally:
        updates.stop()
        runtime.close()


def test_the_recent_request_sample_is_bounded_and_replayed(served: Any, packages: dict[str, Path],
                                                           tmp_path: Path) -> None:
    from edge_runtime.updates.sample import RecentRequests

    ring = RecentRequests()
    for i in range(5):
        ring.record("emb", "embeddings", {"model": "emb", "input": "x" * 10, "i": i}, count=3, max_bytes=1000)
    assert [b["i"] for _, b in ring.take("emb")] == [2, 3, 4] and ring.held("emb")[0] == 3
    size = ring.held("emb")[1] // 3
    ring.record("emb", "embeddings", {"model": "emb", "input": "x" * 10, "i": 5}, count=3, max_bytes=2 * size)
    assert [b["i"] for _, b in ring.take("emb")] == [4, 5]  # the byte bound drops the oldest too
    ring.record("emb", "embeddings", {"input": "y" * 5000}, count=3, max_bytes=1000)  # alone too large
    assert ring.held("emb")[0] == 2

    runtime, updates = served()
    off = updates.entry_for("emb", packages["a"], None)
    assert off.update.sample_requests == 0
    answer(runtime)
    assert updates.recent.held("emb") == (0, 0)  # off by default
    sampled = dataclasses.replace(off, update=dataclasses.replace(off.update, sample_requests=4), threads=2)
    finished(updates.load(sampled))  # the same weights under another setting, now sampling
    for i in range(6):
        answer(runtime, {**EMBED, "input": [f"recent request {i}"]})
    assert updates.recent.held("emb")[0] == 4
    op = finished(updates.load(dataclasses.replace(sampled, package=packages["b"])))
    sample = op.result["agreement"]["sample"]
    assert op.state == "succeeded", op.describe()
    assert (sample["sampled"], sample["requests"], sample["failed_old"], sample["failed_new"]) == (4, 4, 0, 0)
    assert sample["min_cosine"] < 0.99 and sample["min_cosine"] <= sample["mean_cosine"]
    assert updates.recent.held("emb")[0] == 4  # the report's own requests are not sampled


def test_answers_are_compared_by_the_contract_members() -> None:
    from edge_runtime.updates.sample import compare_answers

    def classify(p: list[float]) -> dict[str, Any]:
        return {"data": [{"index": 0, "probabilities": p, "input": {"tokens": 3}}], "usage": {"tokens": 3}}

    def decide(p: dict[str, float]) -> dict[str, Any]:
        return {"answers": {"q": {"type": "choice", "confidence": max(p.values()), "probabilities": p}}}

    got = compare_answers([(classify([0.2, 0.8]), classify([0.3, 0.7])),
                           (decide({"a": 0.6, "b": 0.4}), decide({"a": 0.4, "b": 0.6})),
                           (classify([0.5, 0.5]), classify([0.2, 0.3, 0.5]))])  # another label set
    assert got["requests"] == 3 and got["not_comparable"] == 1
    assert abs(got["max_abs_dp"] - 0.2) < 1e-12 and got["argmax_agreement"] == 0.5
    vectors = compare_answers([({"data": [{"embedding": [1.0, 0.0]}]}, {"data": [{"embedding": [1.0, 1.0]}]})])
    assert abs(vectors["min_cosine"] - 2 ** -0.5) < 1e-12


def test_update_rules_in_models_yaml(tmp_path: Path, packages: dict[str, Path]) -> None:
    from edge_runtime.config import ConfigError

    def rules(update: Any) -> UpdateRules:
        (m,) = load_models_file(write_models_file(tmp_path / "m.yaml", [entry(packages["a"], update=update)]))
        return m.update

    assert rules(None) == UpdateRules()
    got = rules({"allow_space_change": True, "min_cosine": 0.995, "max_dp": 0, "sample_requests": 8})
    assert got == UpdateRules(allow_space_change=True, min_cosine=0.995, max_dp=0.0, sample_requests=8)
    for bad, message in (({"min_cosine": 1.5}, "from 0 to 1"), ({"allow_space_change": "yes"}, "true or false"),
                         ({"sample_requests": -1}, "at least 0"), ({"gate": 1}, r"unknown keys \['gate'\]"),
                         ([1], "must be a mapping")):
        with pytest.raises(ConfigError, match=message):
            rules(bad)
    # update rules are not part of a version's identity: changing them swaps nothing
    (a,) = load_models_file(write_models_file(tmp_path / "m.yaml", [entry(packages["a"])]))
    (b,) = load_models_file(write_models_file(tmp_path / "m2.yaml", [entry(packages["a"], update={"max_dp": 0.1})]))
    assert identity(a) == identity(b)
    assert [c.action for c in plan({"emb": (a, identity(a))}, (b,), {}, False)] == ["aliases"]
