"""The preparation pool (edge_runtime/work.py): small requests inline, large ones and media on its
threads, and its bounded queue: a job that finds it full is refused at once, and over HTTP that is
the contract's 429 overloaded with Retry-After (529 under System One's vllm-sr/5.0), counted in
/metrics like any refusal."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from edge_runtime.api.statuses import as_api_error, retry_headers, status_of
from edge_runtime.config import DEFAULT_MAX_PREP_QUEUE, ServeConfig
from edge_runtime.engine import Overloaded
from edge_runtime.requests.decisions import parse_decisions_request
from edge_runtime.requests.encoder import parse_classify, parse_embeddings, parse_rerank
from edge_runtime.work import INLINE_BODY_BYTES, PoolFull, WorkPool, keep_inline
from tests.support.server_harness import free_port

PNG = "data:image/png;base64,iVBORw0KGgo="


def _on(thread_names: list[str]) -> Callable[[], str]:
    def record() -> str:
        thread_names.append(threading.current_thread().name)
        return "done"
    return record


async def _held(pool: WorkPool, gate: threading.Event, jobs: int) -> list[asyncio.Task[bool]]:
    """``jobs`` jobs that wait for ``gate``: the first ones take the threads, the rest wait."""
    tasks = [asyncio.create_task(pool.offload(gate.wait)) for _ in range(jobs)]
    for _ in range(500):
        await asyncio.sleep(0.01)
        if pool.waiting == jobs - pool.threads:
            return tasks
    raise AssertionError(f"{pool.waiting} jobs waiting, expected {jobs - pool.threads}")


def test_small_requests_run_inline_large_ones_and_offloads_on_the_pool() -> None:
    pool = WorkPool(2, max_queue=4)
    names: list[str] = []

    async def request(body_bytes: int) -> None:
        keep_inline(body_bytes)
        await pool.run(_on(names))
        await pool.finish(_on(names))
        await pool.offload(_on(names))  # media and compressed bodies: on the pool whatever the size

    try:
        here = threading.current_thread().name
        # each request in its own task (its own context), as Sanic runs them
        asyncio.run(request(INLINE_BODY_BYTES))
        assert names[:2] == [here, here] and names[2].startswith("edge-prep")
        names.clear()
        asyncio.run(request(INLINE_BODY_BYTES + 1))
        assert all(n.startswith("edge-prep") for n in names), names
    finally:
        pool.close()


def test_a_full_queue_refuses_at_once_and_empties_again() -> None:
    async def scenario() -> None:
        pool = WorkPool(1, max_queue=2, refuse=Overloaded)
        gate = threading.Event()
        try:
            held = await _held(pool, gate, 3)  # one running, two waiting: the queue is full
            with pytest.raises(Overloaded, match="preparation queue is full"):
                await pool.offload(int)
            with pytest.raises(Overloaded):
                await pool.run(int)  # a large request's parse, plan, ...: refused the same way
            # The end of an answer already paid for is never refused; it waits its turn.
            finishing = asyncio.create_task(pool.finish(lambda: "answer"))
            await asyncio.sleep(0.05)
            assert pool.waiting == 3 and not finishing.done()
            gate.set()
            assert await finishing == "answer"
            assert all(await asyncio.gather(*held))
            assert pool.waiting == 0
            assert await pool.offload(lambda: 7) == 7  # room again
        finally:
            gate.set()
            pool.close()

    asyncio.run(scenario())


def test_a_cancelled_waiting_job_gives_its_place_back() -> None:
    async def scenario() -> None:
        pool = WorkPool(1, max_queue=1)
        gate = threading.Event()
        try:
            held = await _held(pool, gate, 2)
            with pytest.raises(PoolFull):
                await pool.offload(int)
            held[1].cancel()  # its client went away before a thread took the job
            await asyncio.sleep(0.05)
            assert pool.waiting == 0
            running = asyncio.create_task(pool.offload(lambda: "ran"))
            gate.set()
            assert await running == "ran"
        finally:
            gate.set()
            pool.close()

    asyncio.run(scenario())


def test_the_queue_bound_is_a_setting_of_at_least_one() -> None:
    assert ServeConfig(models_file=Path("m.yaml"), models=()).max_prep_queue == DEFAULT_MAX_PREP_QUEUE >= 64
    with pytest.raises(ValueError):
        WorkPool(1, max_queue=0)
    from edge_runtime.cli import _parser

    args = _parser().parse_args(["serve", "--max-prep-queue", "3"])
    assert args.max_prep_queue == 3
    with pytest.raises(SystemExit):
        _parser().parse_args(["serve", "--max-prep-queue", "0"])


def test_a_full_pool_is_the_contracts_overloaded() -> None:
    error = as_api_error(Overloaded("the preparation queue is full"))
    assert (error.code, status_of(error), retry_headers(error)) == ("overloaded", 429, {"Retry-After": "1"})


@pytest.mark.parametrize("surface,body,media", [
    ("decisions", {"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}}, False),
    ("decisions", {"state": "s", "images": [PNG], "questions": {"q": {"type": "noul", "instructions": "x"}}}, True),
    ("decisions", {"state": "s", "videos": ["data:video/mp4;base64,AAAA"],
                   "questions": {"q": {"type": "noul", "instructions": "x"}}}, True),
    ("decisions", {"states": {"a": {"state": "s", "questions": {"q": {"type": "noul", "instructions": "x"}}},
                              "b": {"state": "t", "images": [PNG],
                                    "questions": {"q": {"type": "noul", "instructions": "x"}}}}}, True),
    ("decisions", {"state": "see <image>", "assets": {"<image>": {"type": "image", "data_base64": "AAAA"}},
                   "questions": {"q": {"type": "noul", "instructions": "x"}}}, True),
    ("embeddings", {"input": ["a", "b"]}, False),
    ("embeddings", {"input": [{"type": "image_url", "image_url": {"url": PNG}}]}, True),
    ("classify", {"input": ["a"]}, False),
    ("rerank", {"query": "q", "documents": ["a"]}, False),
])
def test_requests_say_whether_they_carry_media(surface: str, body: dict[str, Any], media: bool) -> None:
    # service.serve sends the planning of a request with media to the pool whatever its body's size
    parse = {"decisions": parse_decisions_request, "embeddings": parse_embeddings,
             "classify": parse_classify, "rerank": parse_rerank}[surface]
    assert parse(body, 64).has_media is media


def test_a_small_request_with_media_is_planned_on_the_pool() -> None:
    from edge_runtime.errors import ApiError
    from edge_runtime.runtime import Runtime
    from edge_runtime.service import serve
    from edge_runtime.timing import Timing

    planned_on: list[str] = []

    class Family:  # records where planning ran, then ends the request before any model is needed
        def plan(self, surface: str, request: Any) -> Any:
            planned_on.append(threading.current_thread().name)
            raise ApiError("invalid_request", "planned")

    runtime = Runtime(ServeConfig(models_file=Path("m.yaml"), models=()))
    runtime.resolve = lambda surface, name: SimpleNamespace(  # type: ignore[method-assign]
        family=Family(), release=lambda: None, result_cache=None)
    questions = {"q": {"type": "noul", "instructions": "x"}}

    async def request(body: dict[str, Any]) -> None:
        keep_inline(len(orjson.dumps(body)))  # as the app does once the body is read
        with pytest.raises(ApiError, match="planned"):
            await serve(runtime, "decisions", body, Timing())

    try:
        asyncio.run(request({"state": "s", "questions": questions}))
        asyncio.run(request({"state": "s", "images": [PNG], "questions": questions}))
        asyncio.run(request({"state": "x" * INLINE_BODY_BYTES, "questions": questions}))
    finally:
        runtime.close()
    here = threading.current_thread().name
    assert planned_on[0] == here  # small and text only: inline
    assert planned_on[1].startswith("edge-prep") and planned_on[2].startswith("edge-prep"), planned_on


# -- over HTTP: the real app in this process, its pool held full ------------------------------


async def _serving(runtime: Any) -> AsyncIterator[httpx.AsyncClient]:
    from edge_runtime.api.app import create_app

    app = create_app(runtime.config, runtime)
    port = free_port()
    server = await app.create_server(host="127.0.0.1", port=port, return_asyncio_server=True)
    assert server is not None
    await server.startup()
    serving = asyncio.create_task(server.serve_forever())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.close()
        await server.wait_closed()
        serving.cancel()


def test_a_full_preparation_queue_answers_429_overloaded_with_retry_after() -> None:
    from edge_runtime.runtime import Runtime

    config = ServeConfig(models_file=Path("models.yaml"), models=(), max_prep_queue=1)
    runtime = Runtime(config)
    assert runtime.work.max_queue == 1
    large = orjson.dumps({"input": ["x" * (INLINE_BODY_BYTES + 1)]})  # parsed on the pool

    async def scenario() -> None:
        gate = threading.Event()
        try:
            async for client in _serving(runtime):
                held = await _held(runtime.work, gate, runtime.work.threads + 1)
                r = await client.post("/v1/embeddings", content=large, headers={"content-type": "application/json"})
                assert r.status_code == 429, r.text
                assert r.headers["retry-after"] == "1"
                assert r.json()["error"]["code"] == "overloaded"
                # System One's vllm-sr/5.0 schema answers an overloaded process 529, as System One does.
                r = await client.post("/v1/systemone", content=large, headers={"content-type": "application/json"})
                assert (r.status_code, r.headers["retry-after"], r.json()["code"]) == (529, "1", "overloaded")
                metrics = (await client.get("/metrics")).text
                assert 'edge_runtime_requests_total{endpoint="/v1/embeddings",status="429"} 1.0' in metrics
                assert 'edge_runtime_requests_total{endpoint="/v1/systemone",status="529"} 1.0' in metrics
                assert "edge_runtime_prep_queue_depth 1.0" in metrics
                # liveness never waits for the pool
                assert (await client.get("/health/live")).status_code == 200
                gate.set()
                await asyncio.gather(*held)
                r = await client.post("/v1/embeddings", content=large, headers={"content-type": "application/json"})
                assert r.status_code == 422, r.text  # no longer refused: read, and no model serves it
        finally:
            gate.set()
            runtime.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
