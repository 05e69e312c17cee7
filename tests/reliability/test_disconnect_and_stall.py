"""Clients that leave while queued cost no forward; a long forward shows on /health/live.

One server over the real MiniLM package with --forward-timeout-seconds 0.05. A request of 32
inputs of 256 tokens is one forward of about two seconds on one thread (the probe groups MiniLM
as padded), far past 0.05 s: while it runs, the model is busy and liveness reads stalled.
Every wait here is a bounded poll.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from edge_runtime.api.schema import validate_response
from tests.reliability.support import StartServer, checked, metric, wait_until
from tests.support.server_harness import Server

pytestmark = pytest.mark.minilm

MODEL = "mini"
FORWARD_TIMEOUT_S = 0.05
LONG_ROWS = 32
LEAVERS = 8  # clients that send a request and close their connection while it is queued
LEAVER_ROWS = 3
POLL_LIMIT_S = 30.0


@pytest.fixture(scope="module")
def mini_server(start_server: StartServer, minilm_package: Path) -> Server:
    # No result cache: these tests count forwards of repeated rows.
    return start_server([{"name": MODEL, "package": str(minilm_package), "device": "cpu", "threads": 1,
                          "max_queue": 64}], "--forward-timeout-seconds", str(FORWARD_TIMEOUT_S),
                        "--result-cache-entries", "0")


def long_request() -> dict[str, Any]:
    """LONG_ROWS inputs of the model's whole budget (256 tokens): one long forward."""
    text = " ".join(f"word{i}" for i in range(400))
    return {"model": MODEL, "input": [text] * LONG_ROWS, "options": {"overflow": "truncate"}}


class Background:
    """A request sent from another thread; join() returns its response."""

    def __init__(self, server: Server, body: dict[str, Any]) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._send, args=(server, body), daemon=True)
        self._thread.start()

    def _send(self, server: Server, body: dict[str, Any]) -> None:
        try:
            self.response = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=120)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> httpx.Response:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the long request did not finish within 120 s"
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return checked(self.response, "/v1/embeddings")


def live(server: Server) -> httpx.Response:
    r = server.client.get("/health/live")
    validate_response("/health/live", "get", r.status_code, r.json())
    return r


def forwarded_rows(server: Server) -> float:
    return metric(server, "edge_runtime_batch_rows_sum", model=MODEL)


def test_long_forward_reads_stalled_then_alive(mini_server: Server) -> None:
    info = {m["id"]: m for m in mini_server.client.get("/v1/models").json()["data"]}[MODEL]
    if info["engine_args"]["grouping"] == "alone":
        # the probe found batching not exact on this CPU: 32 one-row forwards, each maybe under 0.05 s
        pytest.skip("MiniLM runs one row per forward here, so no single forward is long")
    assert live(mini_server).json()["status"] == "alive"
    seen: list[tuple[int, dict[str, Any]]] = []
    done = threading.Event()

    def poll() -> None:
        # bounded: stops when the request is done, after POLL_LIMIT_S at the latest
        for _ in range(int(POLL_LIMIT_S / 0.02)):
            if done.is_set():
                return
            r = live(mini_server)
            seen.append((r.status_code, r.json()))
            done.wait(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    long = Background(mini_server, long_request())
    try:
        response = long.join()
    finally:
        done.set()
        poller.join(POLL_LIMIT_S)
    assert response.status_code == 200 and len(response.json()["data"]) == LONG_ROWS
    stalled = [body for status, body in seen if status == 503]
    assert stalled, f"no 503 among {len(seen)} liveness polls during a {LONG_ROWS} x 256-token forward"
    assert all(body["status"] == "stalled" for body in stalled)
    reason = stalled[0]["reason"]
    assert MODEL in reason and f"{FORWARD_TIMEOUT_S:g} s" in reason, reason
    # once the forward is over, alive again
    wait_until(lambda: live(mini_server).status_code == 200, POLL_LIMIT_S, "/health/live back to 200")
    assert live(mini_server).json() == {"api_version": "5.0.0", "status": "alive"}


def test_clients_gone_while_queued_cost_no_forward(mini_server: Server) -> None:
    dropped_before = metric(mini_server, "edge_runtime_dropped_rows_total", model=MODEL)
    rows_before = forwarded_rows(mini_server)
    long = Background(mini_server, long_request())
    # the long forward is running once liveness reads stalled
    wait_until(lambda: mini_server.client.get("/health/live").status_code == 503, POLL_LIMIT_S,
               "the long forward to start")
    body = orjson.dumps({"model": MODEL, "input": [f"short text {i}" for i in range(LEAVER_ROWS)]})
    raw = (f"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    leavers = [socket.create_connection(("127.0.0.1", mini_server.port), timeout=10) for _ in range(LEAVERS)]
    try:
        for sock in leavers:
            sock.sendall(raw)
        wait_until(lambda: metric(mini_server, "edge_runtime_queue_depth", model=MODEL) == LEAVERS,
                   POLL_LIMIT_S, f"{LEAVERS} jobs queued behind the long forward")
    finally:
        for sock in leavers:
            sock.close()
    expected = dropped_before + LEAVERS * LEAVER_ROWS
    wait_until(lambda: metric(mini_server, "edge_runtime_dropped_rows_total", model=MODEL) >= expected,
               POLL_LIMIT_S, "the leavers' rows counted as dropped")
    assert metric(mini_server, "edge_runtime_queue_depth", model=MODEL) == 0
    response = long.join()
    assert response.status_code == 200
    assert metric(mini_server, "edge_runtime_dropped_rows_total", model=MODEL) == expected
    # only the long request's rows were forwarded; the leavers' never ran
    assert forwarded_rows(mini_server) - rows_before == LONG_ROWS
    # and the model still serves
    after = checked(mini_server.client.post("/v1/embeddings", json={"model": MODEL, "input": "still serving"}),
                    "/v1/embeddings")
    assert after.status_code == 200
    assert forwarded_rows(mini_server) - rows_before == LONG_ROWS + 1
