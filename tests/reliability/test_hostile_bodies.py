"""Hostile request bodies over real HTTP: each gets its contract error and nothing else changes.

After every hostile request a normal request must still get the very answer it got before.
The decompression bombs (1 GiB decoded from about 1 MB of gzip, and from 32 KB of zstd) must be
refused with 413 while the server's peak RSS grows by less than 50 MB (VmHWM is reset through
/proc/<pid>/clear_refs first, so the peak of model loading does not hide a request's peak).
The time each bomb took to refuse is printed, not asserted; a client timeout bounds it.
"""

from __future__ import annotations

import gzip
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import zstandard

from edge_runtime.api.body import MAX_JSON_DEPTH, ZSTD_MAX_WINDOW
from edge_runtime.api.schema import load_openapi
from tests.reliability.support import MiB, PeakGrowth, StartServer, checked, error_of
from tests.support.server_harness import Server

LIMIT = 4 * MiB  # --max-request-bytes: the 1 MB bomb passes as sent and is refused once decoded
BOMB_DECODED = 1 << 30
PEAK_GROWTH_LIMIT = 50 * MiB
BOMB_TIMEOUT_S = 10.0  # a bound against a hang, not a performance check
NORMAL = {"model": "emb", "input": ["a normal request after a hostile one", "東京 🚀"], "encoding_format": "base64"}
PATH = "/v1/embeddings"


@pytest.fixture(scope="module")
def hostile_server(start_server: StartServer, fixture_package: Callable[..., Path]) -> Server:
    return start_server([{"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu",
                          "threads": 1}], "--max-request-bytes", str(LIMIT))


@pytest.fixture(scope="module")
def normal_answer(hostile_server: Server) -> Any:
    """The answer to NORMAL before any hostile request."""
    r = checked(hostile_server.client.post(PATH, json=NORMAL), PATH)
    assert r.status_code == 200
    return r.json()


@pytest.fixture()
def unaffected(hostile_server: Server, normal_answer: Any) -> Iterator[None]:
    """After the test: still ready, alive, and NORMAL still gets the same answer."""
    yield
    assert hostile_server.proc.poll() is None, hostile_server.log()
    assert hostile_server.client.get("/health").status_code == 200
    assert hostile_server.client.get("/health/live").status_code == 200
    again = checked(hostile_server.client.post(PATH, json=NORMAL), PATH)
    assert again.status_code == 200 and again.json() == normal_answer


def send(server: Server, raw: bytes, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> httpx.Response:
    """POST raw bytes as JSON to the embeddings route; the answer is checked against the contract."""
    hdrs = {"content-type": "application/json", **(headers or {})}
    return checked(httpx.post(server.url + PATH, content=raw, headers=hdrs, timeout=timeout), PATH)


def assert_error(response: httpx.Response, status: int, code: str, reason: str | None = None,
                 limit: int | None = None) -> None:
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["code"] == code
    if reason is not None:
        assert error.get("reason") == reason, error
    if limit is not None:
        assert error.get("limit") == limit, error


# ---- bodies ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """One gzip member of 1 GiB of zeros, about 1 MB (built in about 2.5 s)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(8 * MiB)
    parts = [compressor.compress(chunk) for _ in range(BOMB_DECODED // len(chunk))]
    parts.append(compressor.flush())
    return b"".join(parts)


def zstd_bomb(with_size: bool) -> bytes:
    """1 GiB of zeros in one zstd frame (about 32 KB); with_size writes the size into the frame header."""
    chunk = bytes(8 * MiB)
    compressor = zstandard.ZstdCompressor(level=3, write_content_size=with_size)
    obj = compressor.compressobj(size=BOMB_DECODED if with_size else -1)
    frame = b"".join([obj.compress(chunk) for _ in range(BOMB_DECODED // len(chunk))] + [obj.flush()])
    declared = zstandard.get_frame_parameters(frame).content_size
    assert (declared == BOMB_DECODED) if with_size else (declared == zstandard.CONTENTSIZE_UNKNOWN)
    return frame


def normal_body() -> bytes:
    return orjson.dumps(NORMAL)


# ---- decompression bombs -----------------------------------------------------------------------


def refuse_bomb(server: Server, raw: bytes, coding: str) -> tuple[httpx.Response, PeakGrowth, float]:
    started = time.perf_counter()
    with PeakGrowth(server.proc.pid) as peak:
        response = send(server, raw, {"content-encoding": coding}, timeout=BOMB_TIMEOUT_S)
    return response, peak, time.perf_counter() - started


def test_gzip_bomb_is_413_without_inflating(hostile_server: Server, gzip_bomb: bytes, unaffected: None) -> None:
    assert len(gzip_bomb) < 1.1 * MiB
    response, peak, elapsed = refuse_bomb(hostile_server, gzip_bomb, "gzip")
    print(f"gzip bomb {len(gzip_bomb)} bytes -> 1 GiB: {response.status_code} in {elapsed:.3f} s; {peak.describe()}")
    assert_error(response, 413, "request_too_large", "decoded_body_too_large", LIMIT)
    assert peak.growth < PEAK_GROWTH_LIMIT, peak.describe()


@pytest.mark.parametrize("with_size", [False, True], ids=["streamed", "size-in-header"])
def test_zstd_bomb_is_413_without_inflating(hostile_server: Server, with_size: bool, unaffected: None) -> None:
    bomb = zstd_bomb(with_size)
    response, peak, elapsed = refuse_bomb(hostile_server, bomb, "zstd")
    print(f"zstd bomb ({'size in header' if with_size else 'no size'}) {len(bomb)} bytes -> 1 GiB: "
          f"{response.status_code} in {elapsed:.3f} s; {peak.describe()}")
    assert_error(response, 413, "request_too_large", "decoded_body_too_large", LIMIT)
    assert peak.growth < PEAK_GROWTH_LIMIT, peak.describe()


def test_zstd_window_over_8_mib_is_415(hostile_server: Server, unaffected: None) -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24, write_content_size=False)
    raw = zstandard.ZstdCompressor(compression_params=params).compressobj()
    frame = raw.compress(normal_body()) + raw.flush()
    assert zstandard.get_frame_parameters(frame).window_size > ZSTD_MAX_WINDOW
    assert_error(send(hostile_server, frame, {"content-encoding": "zstd"}), 415, "unsupported_media_type",
                 "zstd_window_too_large", ZSTD_MAX_WINDOW)


@pytest.mark.parametrize("coding, make", [
    ("gzip", lambda b: gzip.compress(b)[:-8]),
    ("gzip", lambda b: gzip.compress(b)[:10] + b"\xff" * 40),
    ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)[:-4]),
    ("zstd", lambda b: b"not a zstd frame at all"),
], ids=["gzip-truncated", "gzip-corrupt", "zstd-truncated", "zstd-garbage"])
def test_broken_compressed_body_is_400_encoding_malformed(
    hostile_server: Server, coding: str, make: Callable[[bytes], bytes], unaffected: None
) -> None:
    assert_error(send(hostile_server, make(normal_body()), {"content-encoding": coding}), 400,
                 "invalid_request", "encoding_malformed")


@pytest.mark.parametrize("header", ["gzip, zstd", "gzip, gzip", "br", "deflate"])
def test_unsupported_or_layered_encoding_is_415(hostile_server: Server, header: str, unaffected: None) -> None:
    raw = gzip.compress(normal_body())
    assert_error(send(hostile_server, raw, {"content-encoding": header}), 415, "unsupported_media_type",
                 "encoding_unsupported")


# ---- size limits -------------------------------------------------------------------------------


def oversized() -> bytes:
    return orjson.dumps({"model": "emb", "input": "x" * (LIMIT + 10)})


def test_body_over_limit_with_content_length_is_413(hostile_server: Server, unaffected: None) -> None:
    assert_error(send(hostile_server, oversized()), 413, "request_too_large", "body_too_large", LIMIT)


def test_body_over_limit_chunked_is_413(hostile_server: Server, unaffected: None) -> None:
    payload = oversized()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 64 * 1024):
            yield payload[i:i + 64 * 1024]

    response = checked(httpx.post(hostile_server.url + PATH, content=chunks(),
                                  headers={"content-type": "application/json"}, timeout=30), PATH)
    assert "content-length" not in response.request.headers  # really sent chunked
    assert_error(response, 413, "request_too_large", limit=LIMIT)


def test_content_length_over_limit_is_413_before_the_body(hostile_server: Server, unaffected: None) -> None:
    """A Content-Length past the limit is refused on the headers alone: no body byte is sent."""
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {LIMIT * 100}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=10) as sock:
        sock.sendall(head)
        reply = _read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    body = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_too_large" and body["error"]["limit"] == LIMIT


def _read_reply(sock: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:")]
        if length and len(rest) >= length[0]:
            break
    return data


# ---- JSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b'{"model": "emb", "input": "caf\xe9"}',                      # Latin-1, not UTF-8
    b'{"model": "emb", "input": "\xed\xa0\x80"}',                 # a UTF-8-encoded surrogate
    b'{"model": "emb", "input": "\xff\xfe"}',
    b'{"model": "emb", "input": "\\ud800"}',                       # an escaped surrogate without its pair
], ids=["latin1", "utf8-surrogate", "ff-fe", "lone-surrogate-escape"])
def test_invalid_text_is_400(hostile_server: Server, raw: bytes, unaffected: None) -> None:
    assert_error(send(hostile_server, raw), 400, "invalid_request")


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deep_nesting_is_400(hostile_server: Server, depth: int, unaffected: None) -> None:
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    raw = b'{"model": "emb", "input": "x", "user": ' + inner + b"}"
    response = send(hostile_server, raw)
    assert_error(response, 400, "invalid_request")
    assert "deeper" in error_of(response)["message"]


@pytest.mark.parametrize("number", [b"1" + b"0" * 400, b"-" + b"9" * 30, b"18446744073709551616", b"1e400", b"-1e999"])
def test_huge_numbers_are_400(hostile_server: Server, number: bytes, unaffected: None) -> None:
    raw = b'{"model": "emb", "input": "x", "options": {"max_tokens": ' + number + b"}}"
    assert_error(send(hostile_server, raw), 400, "invalid_request")


# ---- every POST route ----------------------------------------------------------------------

POST_PATHS = [path for path, item in load_openapi()["paths"].items() if "post" in item]
ROUTE_CASES = {
    "gzip-truncated": (lambda: gzip.compress(normal_body())[:-8], {"content-encoding": "gzip"}, 400),
    "two-encodings": (lambda: normal_body(), {"content-encoding": "gzip, zstd"}, 415),
    "invalid-utf8": (lambda: b'{"model": "\xff"}', {}, 400),
    "deep": (lambda: b"[" * 5000 + b"]" * 5000, {}, 400),
    "over-limit": (oversized, {}, 413),
}


@pytest.mark.parametrize("case", list(ROUTE_CASES))
@pytest.mark.parametrize("path", POST_PATHS)
def test_every_post_route_refuses_hostile_bodies_in_its_schema(
    hostile_server: Server, path: str, case: str, unaffected: None
) -> None:
    """The body is refused before any model is chosen, in the route's own error schema
    (System One routes answer in theirs): validated against the contract for that route."""
    make, headers, status = ROUTE_CASES[case]
    if case == "invalid-utf8" and path.startswith("/v1/systemone"):
        status = 422  # vllm-sr/5.0 answers a body that is not JSON as the standard does: json_invalid
    response = checked(httpx.post(hostile_server.url + path, content=make(),
                                  headers={"content-type": "application/json", **headers}, timeout=30), path)
    assert response.status_code == status, response.text


# ---- slow and abandoned bodies -----------------------------------------------------------------


def test_partial_bodies_abandoned_leave_the_server_serving(
    hostile_server: Server, normal_answer: Any, unaffected: None
) -> None:
    """Slow-loris: 16 connections send their headers and half their body, then stall; the server
    answers others meanwhile, and once they are abandoned (closed) it has lost nothing."""
    body = normal_body()
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    stalled = []
    try:
        for _ in range(16):
            sock = socket.create_connection(("127.0.0.1", hostile_server.port), timeout=10)
            sock.sendall(head + body[: len(body) // 2])
            stalled.append(sock)
        during = checked(hostile_server.client.post(PATH, json=NORMAL), PATH)
        assert during.status_code == 200 and during.json() == normal_answer
    finally:
        for sock in stalled:
            sock.close()
    # an abandoned body with a Content-Length that promises more, and one cut inside a chunk
    for partial in (head + body[:5], f"POST {PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "400\r\n{\"model\"".encode()):
        with socket.create_connection(("127.0.0.1", hostile_server.port), timeout=10) as sock:
            sock.sendall(partial)
