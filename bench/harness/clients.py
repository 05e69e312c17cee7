"""The harness's HTTP clients of our server: JsonClient (http.client, keep-alive), LeanClient (a request
written as bytes, only the length parsed: what the server costs a caller), and the decision contestants
built on them: HttpDecider (one of our servers, a body per call) and OneByOne (each question its own
request, as a server without state-once would be asked)."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any

from bench.harness.server import HOST, ServerProcess
from bench.harness.stats import timed

HTTP_TIMEOUT_S = 60.0


class JsonClient:
    """A JSON POST client on one connection (kept alive if the server allows; reopened if not)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HOST, port, timeout=HTTP_TIMEOUT_S)

    def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        for attempt in (0, 1):
            try:
                self.conn.request("POST", path, body=body, headers={"content-type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.conn.close()  # a kept-alive connection the server closed meanwhile: retry once
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


class LeanClient:
    """A minimal HTTP/1.1 JSON POST client: the request written as bytes, the response framed by its
    Content-Length (or read to the connection's close), no other header parsed.

    http.client parses every response header with the email package, which costs 0.1-0.3 ms a
    request on this VM: as much as the server's own work. The Router's Go client costs a few tens of
    microseconds, so this client measures what the server costs a caller; http.client stays the
    first measure. Connections are kept alive unless the server answers HTTP/1.0 or closes.
    """

    def __init__(self, port: int = 0, uds: Path | None = None) -> None:
        """A client of 127.0.0.1:``port``, or of the Unix socket ``uds`` (the Router's managed runtimes)."""
        self.port = port
        self.uds = uds
        self.sock: socket.socket | None = None

    def _connect(self) -> socket.socket:
        if self.uds is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(HTTP_TIMEOUT_S)
            sock.connect(str(self.uds))
            return sock
        sock = socket.create_connection((HOST, self.port), timeout=HTTP_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return self.request(b"POST", path, body)

    def get(self, path: str) -> tuple[int, bytes]:
        return self.request(b"GET", path, None)

    def request(self, method: bytes, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One request on the kept-alive connection (opened, or opened again once, as needed)."""
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (method, path.encode(), HOST.encode())
        if body is not None:
            head += b"Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        request = head + b"\r\n" + (body or b"")
        for attempt in (0, 1):
            reused = self.sock is not None
            if self.sock is None:
                self.sock = self._connect()
            try:
                self.sock.sendall(request)
                return self._response()
            except (ConnectionError, EOFError):
                self.close()  # a kept-alive connection the server closed meanwhile: retry once
                if attempt or not reused:
                    raise
        raise AssertionError("unreachable")

    def _response(self) -> tuple[int, bytes]:
        assert self.sock is not None
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        version, status = lines[0].split(b" ", 2)[:2]
        fields = dict(line.split(b":", 1) for line in lines[1:])
        fields = {k.strip().lower(): v.strip().lower() for k, v in fields.items()}
        closing = version == b"HTTP/1.0" or fields.get(b"connection") == b"close"
        if b"content-length" in fields:
            length = int(fields[b"content-length"])
            while len(rest) < length:
                rest += self._recv()
        else:  # no length: the body ends with the connection
            while chunk := self.sock.recv(65536):
                rest += chunk
            closing = True
        if closing:
            self.close()
        return int(status), rest

    def _recv(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("the server closed the connection mid-response")
        return chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class HttpDecider:
    """One of our servers over HTTP: each timed call sends the body and decodes the answers."""

    def __init__(self, label: str, server: ServerProcess) -> None:
        self.label = label
        self.server = server
        self.client: JsonClient | None = None

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.client is None:
            self.client = JsonClient(self.server.port)
        status, _headers, data = self.client.post("/v1/decisions", json.dumps(body).encode())
        if status != 200:
            raise RuntimeError(f"{self.label}: HTTP {status}: {data[:500]!r}")
        return json.loads(data)

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return timed(lambda: self.answers(body), n)

    def stop(self) -> None:
        """Close the connection (the server is stopped by whoever started it)."""
        if self.client is not None:
            self.client.close()


class OneByOne:
    """Our server without state-once: each question of a body sent as its own request, in turn."""

    label = "edge-runtime, one question per request (HTTP, no state-once)"

    def __init__(self, server: HttpDecider) -> None:
        self.server = server

    def answers(self, body: dict[str, Any]) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        tokens = 0
        for qid, question in body["questions"].items():
            got = self.server.answers({**body, "questions": {qid: question}})
            answers.update(got["answers"])
            tokens += int(got["usage"]["input_tokens"])
        return {"answers": answers, "usage": {"input_tokens": tokens}}

    def time(self, body: dict[str, Any], n: int) -> list[float]:
        return timed(lambda: self.answers(body), n)
