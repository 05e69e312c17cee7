"""Overload: many concurrent clients against small model queues.

Every request must be answered 200 or 429 (with Retry-After: 1 and the overloaded error), never
dropped or failed at the connection; every 200 must equal the sequential answer to the same body
(the fixture models' numerics are exact, so batching never changes an answer); afterwards the
server is ready and answers as before. Heavy: 64 clients, 2,000 requests, queue limit 16.
Normal: 16 clients, 300 requests, queue limit 4 (the same ratio of clients to queue slots).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.reliability.support import StartServer, checked, metric
from tests.support.server_harness import Server

WORDS = ["alpha", "beta", "gamma", "δέλτα", "東京", "reset", "password", "queue", "overload", "x1", "🚀"]


@dataclass(frozen=True)
class Job:
    path: str
    body: bytes


@pytest.fixture(scope="module")
def overload_server(start_server: StartServer, fixture_package: Callable[..., Path]) -> Server:
    """Embedding and classification fixtures behind queues of 16 and of 4 jobs."""
    models = []
    for limit in (16, 4):
        models.append({"name": f"emb-q{limit}", "package": str(fixture_package("embedding")),
                       "device": "cpu", "threads": 1, "max_queue": limit})
        models.append({"name": f"cls-q{limit}", "package": str(fixture_package("sequence-classification")),
                       "device": "cpu", "threads": 1, "max_queue": limit})
    # No result cache: the storm repeats the bodies it was answered sequentially, which a cache would
    # answer without queueing anything (tests/test_result_cache.py covers the cache).
    return start_server(models, "--result-cache-entries", "0")


def job_pool(limit: int, n: int = 48, seed: int = 11) -> list[Job]:
    """Distinct bodies of 1 to 16 inputs of 1 to 90 words, for the models behind queue `limit`."""
    rng = np.random.default_rng(seed)
    jobs = []
    for i in range(n):
        texts = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(1, 90, size=int(rng.integers(1, 17)))]
        if i % 2:
            body = {"model": f"emb-q{limit}", "input": texts, "encoding_format": "base64",
                    "options": {"overflow": "truncate"}}
            jobs.append(Job("/v1/embeddings", orjson.dumps(body)))
        else:
            body = {"model": f"cls-q{limit}", "input": texts, "options": {"overflow": "truncate"}}
            jobs.append(Job("/v1/classify", orjson.dumps(body)))
    return jobs


def sequential_answers(server: Server, jobs: list[Job]) -> list[Any]:
    """One request at a time: the reference answer to every body."""
    answers = []
    for job in jobs:
        r = checked(server.client.post(job.path, content=job.body, headers={"content-type": "application/json"}),
                    job.path)
        assert r.status_code == 200, r.text
        answers.append(r.json())
    return answers


def storm(server: Server, jobs: list[Job], clients: int, requests: int, seed: int = 5) -> list[tuple[int, Any]]:
    """`requests` requests drawn from `jobs`, sent by `clients` threads each with its own connection.

    Returns (job index, response or the exception a client met) in send order.
    """
    order = np.random.default_rng(seed).integers(0, len(jobs), size=requests).tolist()
    local = threading.local()
    opened: list[httpx.Client] = []
    lock = threading.Lock()

    def one(index: int) -> tuple[int, Any]:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=server.url, timeout=60)
            with lock:
                opened.append(client)
        job = jobs[index]
        try:
            return index, client.post(job.path, content=job.body, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            return index, exc

    try:
        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(one, order))
    finally:
        for client in opened:
            client.close()


def check_storm(server: Server, jobs: list[Job], results: list[tuple[int, Any]], reference: list[Any]) -> Counter[int]:
    """Every answer 200 (equal to the reference) or 429 (Retry-After 1, overloaded); returns the statuses."""
    failures = [f"{jobs[i].path}: {type(r).__name__}: {r}" for i, r in results if not isinstance(r, httpx.Response)]
    assert not failures, f"{len(failures)} requests met a connection error, e.g. {failures[:3]}"
    statuses: Counter[int] = Counter()
    for index, response in results:
        statuses[response.status_code] += 1
        checked(response, jobs[index].path)
        assert "server-timing" in response.headers
        if response.status_code == 200:
            assert response.json() == reference[index], f"{jobs[index].path} answer differs from the sequential one"
        else:
            assert response.status_code == 429, response.text
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["code"] == "overloaded"
    return statuses


def check_recovered(server: Server, jobs: list[Job], reference: list[Any], limit: int) -> None:
    """Ready, alive, empty queues, and the same answers as before the storm."""
    assert checked(server.client.get("/health"), "/health", "get").json()["status"] == "ready"
    assert server.client.get("/health/live").status_code == 200
    for name in (f"emb-q{limit}", f"cls-q{limit}"):
        assert metric(server, "edge_runtime_queue_depth", model=name) == 0
    assert sequential_answers(server, jobs[:6]) == reference[:6]


def run_overload(server: Server, limit: int, clients: int, requests: int) -> Counter[int]:
    jobs = job_pool(limit)
    reference = sequential_answers(server, jobs)
    statuses = check_storm(server, jobs, storm(server, jobs, clients, requests), reference)
    check_recovered(server, jobs, reference, limit)
    print(f"overload: {clients} clients, {requests} requests, queue {limit}: statuses {dict(statuses)}")
    return statuses


def test_overload_answers_200_or_429(overload_server: Server) -> None:
    statuses = run_overload(overload_server, limit=4, clients=16, requests=300)
    assert statuses.total() == 300 and statuses[200] > 0


@pytest.mark.heavy
def test_overload_heavy(overload_server: Server) -> None:
    statuses = run_overload(overload_server, limit=16, clients=64, requests=2000)
    assert statuses.total() == 2000 and statuses[200] > 0
