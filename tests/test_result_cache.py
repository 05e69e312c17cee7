"""The result cache: a repeated row is answered from its version's cache, bit for bit what running it
again gives (batching is exact), bounded by entries and bytes, counted in /metrics, and never
carried across a version swap."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from edge_runtime.config import ModelConfig, ServeConfig, UpdateRules
from edge_runtime.engine.result_cache import ResultCache, row_key
from edge_runtime.metrics import Metrics
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing

STATE = "I was charged twice for order 1182 and nobody answers my emails, I want my money back"
QUESTIONS = {
    "tool": {"type": "choice", "instructions": "Which tool should handle this?",
             "choices": [{"key": "refunds", "description": "Refund a payment"},
                         {"key": "shipping", "description": "Track a delivery"}]},
    "urgent": {"type": "noul", "instructions": "Is it urgent?"},
}
TEXTS = ["How do I reset my password?", STATE, "How do I reset my password?", "shipping to Oslo"]


# -- keys and bounds --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Row:
    ids: np.ndarray
    label: str


def test_keys_read_the_whole_structure_and_refuse_what_they_cannot_read() -> None:
    ids = np.arange(5, dtype=np.int64)
    assert row_key(_Row(ids, "a")) == row_key(_Row(ids.copy(), "a"))
    assert row_key(_Row(ids, "a")) != row_key(_Row(ids, "b"))
    assert row_key(ids) != row_key(ids.astype(np.int32))  # same values, other dtype
    assert row_key(ids) != row_key(ids.reshape(5, 1))  # same bytes, other shape
    assert row_key((1, "a")) != row_key(("a", 1)) and row_key([1, 2]) != row_key((1, 2))
    assert row_key({"a": ids, "b": 1}) == row_key({"b": 1, "a": ids.copy()})
    assert row_key((ids, lambda: 0)) is None  # a callable's state cannot be read
    assert row_key(np.array([object()])) is None


def _run(cache: ResultCache, rows: list[Any], forward: Callable[[list[Any]], list[Any]]) -> list[Any]:
    lookup = cache.lookup(rows, cache.keys(rows))
    return lookup.complete(forward(lookup.run) if lookup.run else [])


def test_repeated_rows_run_once_and_outputs_are_handed_out_as_copies() -> None:
    ran: list[int] = []

    def forward(rows: list[Any]) -> list[Any]:
        ran.extend(int(r[0]) for r in rows)
        return [{"hidden": np.full(3, float(r[0]))} for r in rows]

    cache = ResultCache("m", entries=10, max_bytes=1 << 20)
    rows = [np.array([1]), np.array([2]), np.array([1])]
    first = _run(cache, rows, forward)
    assert ran == [1, 2]  # the repeated row ran once
    first[0]["hidden"][:] = -1.0  # a readout that writes into its outputs
    first[2]["hidden"][:] = -2.0
    again = _run(cache, rows, forward)
    assert ran == [1, 2]  # all three answered from the cache
    assert [float(o["hidden"][0]) for o in again] == [1.0, 2.0, 1.0]
    again[0]["hidden"][:] = 7.0  # writable, and the kept output is not changed by it
    assert float(_run(cache, rows[:1], forward)[0]["hidden"][0]) == 1.0


def test_the_cache_keeps_within_its_entries_and_bytes_least_recently_used_first() -> None:
    def forward(rows: list[Any]) -> list[Any]:
        return [np.zeros(256, dtype=np.float32) for _ in rows]  # 1 KiB each

    by_entries = ResultCache("m", entries=2, max_bytes=1 << 20)
    for i in (1, 2, 1, 3):  # 1 is used again before 3 comes, so 2 goes
        _run(by_entries, [np.array([i])], forward)
    assert by_entries.size()[0] == 2
    assert by_entries.lookup([np.array([1])], by_entries.keys([np.array([1])])).run == []
    assert len(by_entries.lookup([np.array([2])], by_entries.keys([np.array([2])])).run) == 1
    by_bytes = ResultCache("m", entries=100, max_bytes=3 * 1024 + 100)
    for i in range(10):
        _run(by_bytes, [np.array([i])], forward)
    entries, held = by_bytes.size()
    assert entries == 3 and held <= 3 * 1024 + 100
    off = ResultCache("m", entries=0, max_bytes=1 << 20)
    assert not off.enabled and off.keys([np.array([1])]) == [None]


# -- every family, through the service ---------------------------------------------------------------


REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "embedding": ("embeddings", {"input": TEXTS}),
    "embedding-int8": ("embeddings", {"input": TEXTS, "encoding_format": "base64"}),
    "sequence-classification": ("classify", {"input": TEXTS}),
    "token-classification": ("classify", {"input": TEXTS}),
    "rerank": ("rerank", {"query": "reset password", "documents": TEXTS}),
    "sparrow": ("decisions", {"state": STATE, "questions": QUESTIONS}),
    "decision-codes": ("decisions", {"state": STATE, "questions": QUESTIONS}),
    "vela2": ("decisions", {"state": STATE, "questions": QUESTIONS}),
}


@pytest.fixture(scope="module")
def runtime(fixture_package: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """Each fixture twice: ``<kind>`` with the cache on (the default), ``<kind>-off`` without it."""
    from converters.sparrow.export import build_sparrow_package

    packages = {kind: (fixture_package(kind), "fp32") for kind in REQUESTS if kind not in ("sparrow", "embedding-int8")}
    packages["embedding-int8"] = (fixture_package("embedding", quantize=True), "int8")
    packages["sparrow"] = (build_sparrow_package(tmp_path_factory.mktemp("cache-sparrow")), "fp32")
    models = []
    for kind, (package, variant) in packages.items():
        for name, entries in ((kind, 16_384), (f"{kind}-off", 0)):
            models.append(ModelConfig(name=name, package=package, variant=variant, device="cpu", threads=1,
                                      result_cache_entries=entries))
    runtime = Runtime(ServeConfig(models_file=None, models=tuple(models)), Metrics())
    runtime.load_all()
    failed = {m.name: m.reason for m in runtime.models.values() if m.status != "ready"}
    assert not failed, failed
    yield runtime
    runtime.close()


def _answer(runtime: Runtime, model: str, surface: str, body: dict[str, Any]) -> bytes:
    async def one() -> dict[str, Any]:
        return await serve(runtime, surface, json.loads(json.dumps({"model": model, **body})), Timing())

    answer = asyncio.run(one())
    answer["model"] = model.removesuffix("-off")
    return orjson.dumps(answer, option=orjson.OPT_SORT_KEYS)


def _lookups(runtime: Runtime, model: str, result: str) -> float:
    value = runtime.metrics.registry.get_sample_value(
        "edge_runtime_result_cache_lookups_total", {"model": model, "result": result})
    return value or 0.0


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_a_cached_answer_is_bit_identical_to_running_it_again(runtime: Runtime, kind: str) -> None:
    surface, body = REQUESTS[kind]
    hits = _lookups(runtime, kind, "hit")
    first = _answer(runtime, kind, surface, body)
    second = _answer(runtime, kind, surface, body)
    assert _lookups(runtime, kind, "hit") > hits  # the second request was answered from the cache
    recomputed = _answer(runtime, f"{kind}-off", surface, body)
    assert first == second == recomputed
    assert _lookups(runtime, f"{kind}-off", "hit") == _lookups(runtime, f"{kind}-off", "miss") == 0.0


def test_a_request_runs_only_its_misses(runtime: Runtime) -> None:
    model = runtime.models["embedding"]
    assert model.executor is not None
    forwards = model.executor.forwards
    _answer(runtime, "embedding", "embeddings", {"input": ["a text seen once, and again", "x"]})
    assert model.executor.forwards == forwards + 1
    _answer(runtime, "embedding", "embeddings", {"input": ["x", "a text seen once, and again", "x"]})
    assert model.executor.forwards == forwards + 1  # every row kept: no forward at all
    _answer(runtime, "embedding", "embeddings", {"input": ["x", "a new text", "x"]})
    assert model.executor.forwards == forwards + 2


def test_whole_answers_are_kept_but_not_one_a_deadline_cut_nor_one_with_timings(runtime: Runtime) -> None:
    model = runtime.models["sequence-classification"]
    assert model.executor is not None and model.result_cache is not None
    body = {"input": ["an answer kept whole", "and its second input"]}
    first = _answer(runtime, "sequence-classification", "classify", body)
    entries = model.result_cache.size()[0]
    forwards = model.executor.forwards
    assert _answer(runtime, "sequence-classification", "classify", body) == first
    assert model.executor.forwards == forwards and model.result_cache.size()[0] == entries  # nothing planned or run
    cut = {"input": ["a deadline that passes at once"], "options": {"deadline_ms": 1e-6}}
    cut_answer = json.loads(_answer(runtime, "sequence-classification", "classify", cut))
    assert cut_answer["results"][0]["error"] == "deadline_exceeded"
    again = json.loads(_answer(runtime, "sequence-classification", "classify", cut))
    assert again["results"][0]["error"] == "deadline_exceeded"  # not answered from an earlier cut
    timed = {"input": ["with its timings"], "options": {"return_meta": True}}
    metas = [json.loads(_answer(runtime, "sequence-classification", "classify", timed))["meta"] for _ in range(2)]
    assert all("timings" in meta for meta in metas)


def test_a_swap_never_answers_from_the_old_versions_cache(tmp_path: Path) -> None:
    from converters.encoder.fixture import build_fixture
    from edge_runtime.updates import Updates, UpdateSettings

    old, new = (build_fixture("embedding", tmp_path / f"emb-{seed}", seed=seed) for seed in (0, 1))
    body = {"input": ["the same request, before and after the swap"]}

    def served(package: Path, entries: int) -> Runtime:
        runtime = Runtime(ServeConfig(models_file=None, models=(
            ModelConfig(name="emb", package=package, device="cpu", threads=1, result_cache_entries=entries),)),
            Metrics())
        runtime.load_all()
        return runtime

    runtime = served(old, 16_384)
    fresh = served(new, 0)
    updates = Updates(runtime, UpdateSettings(drain_seconds=5.0, watch_seconds=0.0), runtime.metrics)
    updates.start()
    try:
        before = _answer(runtime, "emb", "embeddings", body)
        assert _answer(runtime, "emb", "embeddings", body) == before  # kept by the old version
        entry = runtime.models["emb"].config
        op = updates.load(dataclasses.replace(entry, package=new, update=UpdateRules(allow_space_change=True)))
        assert op.done.wait(60) and op.state == "succeeded", op.describe()
        after = _answer(runtime, "emb", "embeddings", body)
        assert after == _answer(fresh, "emb", "embeddings", body) != before
    finally:
        updates.stop()
        runtime.close()
        fresh.close()
