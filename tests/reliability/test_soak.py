"""Soak: many mixed-length requests across every surface; the server's memory must level off.

Requests of 1 to 120 words and 1 to 16 items go to classify (sequence, multi-label, token;
texts, pairs, grounded items, windows), embeddings (float and base64, smaller dimensions, an
earlier layer), rerank, bundle and decisions (sparrow-nano: noul, choice and score questions)
from 4 client threads. Every answer must be 200 and valid against the contract.

RSS (VmRSS) is read after the warm-up and again at the end: it may grow by less than 10%. The
warm-up first sends every model its largest batch (64 rows of the longest input, as concurrent
requests may merge into) twice, then a tenth of the mix. ONNX Runtime's CPU arena grows to the
largest shape it has run and keeps that memory, and with its memory patterns on (the default) a
shape costs twice: the first run allocates as it goes, the second allocates the block planned for
that shape (about 30 MB each per fixture model at 64 x 128 tokens). Without this warm-up a short
run mostly measures the arena growing (+10% over the first 1,000 requests, levelling off later).
Heavy: 20,000 requests; normal: 1,000. The RSS numbers are printed and recorded as properties.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from tests.reliability.support import MiB, StartServer, checked, encoder_entries, memory
from tests.support.server_harness import Server

WORDS = ["reset", "password", "login", "page", "settings", "security", "Paris", "Tom", "Baker", "東京",
         "δέλτα", "🚀", "offices", "closed", "Sunday", "invoice", "refund", "order", "shipping", "late",
         "the", "a", "is", "of", "and", "to", "in", "it"]
MAX_RSS_GROWTH = 0.10
WARM_UP_SHARE = 0.1
MAX_BATCH_ROWS = 64  # the executor's default max_batch_rows
CLIENTS = 4


@pytest.fixture(scope="module")
def soak_server(start_server: StartServer, fixture_package: Callable[..., Path], sparrow_package: Path) -> Server:
    models = encoder_entries(fixture_package)
    models.append({"name": "sparrow", "package": str(sparrow_package), "device": "cpu", "threads": 1})
    # A small result cache: it fills and evicts all through the soak (the path a long-running server
    # takes), while its bounded bytes stay well inside the growth allowed.
    return start_server(models, "--result-cache-bytes", str(1 << 20))


class Mix:
    """A seeded stream of valid requests of mixed surfaces and lengths: (path, body)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def text(self, most: int = 120) -> str:
        return " ".join(self.rng.choice(WORDS, size=int(self.rng.integers(1, most + 1))))

    def texts(self, most: int = 16, words: int = 120) -> list[str]:
        return [self.text(words) for _ in range(int(self.rng.integers(1, most + 1)))]

    def classify(self) -> dict[str, Any]:
        model = str(self.rng.choice(["cls", "ml", "tok"]))
        form = int(self.rng.integers(0, 4))
        items: Any
        if form == 0:
            items = self.text()
        elif form == 1 and model == "cls":
            items = [{"text": self.text(50), "text_pair": self.text(50)} for _ in range(int(self.rng.integers(1, 6)))]
        elif form == 1 and model == "tok":
            items = [{"context": self.text(40), "question": self.text(10), "answer": self.text(40)}]
        else:
            items = self.texts(8)
        options: dict[str, Any] = {"overflow": "truncate"}
        if form == 3 and model != "tok":
            options = {"overflow": "window", "max_tokens": 128, "window": {"tokens": 32, "overlap": 8}}
        return {"model": model, "input": items, "options": options}

    def embeddings(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "emb", "input": self.texts(), "options": {"overflow": "truncate"},
                                "encoding_format": str(self.rng.choice(["float", "base64"]))}
        pick = int(self.rng.integers(0, 4))
        if pick == 1:
            body["dimensions"] = 16
        elif pick == 2:
            body["layer"] = 1
        return body

    def rerank(self) -> dict[str, Any]:
        body: dict[str, Any] = {"model": "rr", "query": self.text(20), "documents": self.texts(12, 80),
                                "options": {"overflow": "truncate"}}
        if self.rng.random() < 0.5:
            body["top_n"] = int(self.rng.integers(1, 4))
            body["return_documents"] = True
        return body

    def decisions(self) -> dict[str, Any]:
        kind = int(self.rng.integers(0, 3))
        question: dict[str, Any]
        if kind == 0:
            question = {"type": "noul", "instructions": f"Is this about {self.rng.choice(WORDS)}?"}
        elif kind == 1:
            keys = self.rng.choice(["billing", "login", "shipping", "other"], size=int(self.rng.integers(2, 5)),
                                   replace=False)
            question = {"type": "choice", "instructions": "What is the topic?",
                        "choices": [{"key": str(k), "description": f"about {k}"} for k in keys]}
        else:
            question = {"type": "score", "instructions": "How urgent is it?", "levels": ["not", "somewhat", "very"]}
        return {"model": "sparrow", "state": self.text(60), "questions": {"q": question}}

    def bundle(self) -> dict[str, Any]:
        makers = [("classify", self.classify), ("embeddings", self.embeddings), ("rerank", self.rerank),
                  ("decisions", self.decisions)]
        tasks = []
        for i in range(int(self.rng.integers(2, 5))):
            name, make = makers[int(self.rng.integers(0, len(makers)))]
            tasks.append({"id": f"t{i}", name: make()})
        return {"tasks": tasks}

    def request(self) -> tuple[str, bytes]:
        surface = str(self.rng.choice(["classify", "embeddings", "rerank", "bundle", "decisions"],
                                      p=[0.3, 0.25, 0.2, 0.1, 0.15]))
        return f"/v1/{surface}", orjson.dumps(getattr(self, surface)())


def run(server: Server, requests: list[tuple[str, bytes]]) -> list[str]:
    """Send every request from CLIENTS threads; returns what was wrong with the answers (ideally nothing)."""
    local = threading.local()
    opened: list[httpx.Client] = []
    lock = threading.Lock()

    def one(request: tuple[str, bytes]) -> str | None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=server.url, timeout=60)
            with lock:
                opened.append(client)
        path, body = request
        try:
            response = client.post(path, content=body, headers={"content-type": "application/json"})
            checked(response, path)
        except Exception as exc:  # a connection error or an answer outside the contract
            return f"{path} {body[:200]!r}: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return f"{path} {body[:200]!r}: {response.status_code} {response.text[:300]}"
        if path == "/v1/bundle" and any(r["status"] != 200 for r in response.json()["results"]):
            return f"{path} {body[:200]!r}: a task failed: {response.text[:300]}"
        return None

    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            return [problem for problem in pool.map(one, requests) if problem]
    finally:
        for client in opened:
            client.close()


def largest_batches() -> list[tuple[str, bytes]]:
    """A request per model that fills one forward with MAX_BATCH_ROWS rows of the longest input."""
    long = " ".join(WORDS * 8)
    rows = [long] * MAX_BATCH_ROWS
    out = [("/v1/classify", {"model": m, "input": rows, "options": {"overflow": "truncate"}})
           for m in ("cls", "ml", "tok")]
    out.append(("/v1/embeddings", {"model": "emb", "input": rows, "options": {"overflow": "truncate"}}))
    out.append(("/v1/rerank", {"model": "rr", "query": long, "documents": rows, "options": {"overflow": "truncate"}}))
    out.append(("/v1/decisions", {"model": "sparrow", "state": long,
                                  "questions": {"q": {"type": "noul", "instructions": long}}}))
    return [(path, orjson.dumps(body)) for path, body in out]


def soak(server: Server, total: int, seed: int) -> dict[str, float]:
    mix = Mix(seed)
    warm_up = largest_batches() * 2 + [mix.request() for _ in range(int(total * WARM_UP_SHARE))]
    requests = [mix.request() for _ in range(total)]
    problems = run(server, warm_up)
    after_warm_up = memory(server.proc.pid)
    problems += run(server, requests)
    end = memory(server.proc.pid)
    assert not problems, f"{len(problems)} bad answers, e.g. {problems[:3]}\n{server.log()[-3000:]}"
    numbers = {"requests": total, "rss_after_warm_up_mib": after_warm_up["VmRSS"] / MiB,
               "rss_end_mib": end["VmRSS"] / MiB, "hwm_end_mib": end["VmHWM"] / MiB,
               "growth": end["VmRSS"] / after_warm_up["VmRSS"] - 1}
    print(f"soak: {total} requests; VmRSS after warm-up {numbers['rss_after_warm_up_mib']:.1f} MiB, at the end "
          f"{numbers['rss_end_mib']:.1f} MiB ({numbers['growth']:+.1%}); VmHWM {numbers['hwm_end_mib']:.1f} MiB")
    assert server.client.get("/health").status_code == 200
    return numbers


def test_mix_requests_are_all_valid() -> None:
    """The request mix itself: every body it draws is valid for its operation in the contract."""
    from edge_runtime.api.schema import request_validator

    mix = Mix(3)
    for _ in range(300):
        path, body = mix.request()
        request_validator(path).validate(orjson.loads(body))


def test_soak_memory_levels_off(soak_server: Server, record_property: Callable[[str, Any], None]) -> None:
    numbers = soak(soak_server, 1000, seed=1)
    for key, value in numbers.items():
        record_property(key, value)
    assert numbers["growth"] < MAX_RSS_GROWTH


@pytest.mark.heavy
def test_soak_memory_levels_off_heavy(soak_server: Server, record_property: Callable[[str, Any], None]) -> None:
    numbers = soak(soak_server, 20_000, seed=2)
    for key, value in numbers.items():
        record_property(key, value)
    assert numbers["growth"] < MAX_RSS_GROWTH
