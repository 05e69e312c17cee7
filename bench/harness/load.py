"""Load on one server: the open loop every load bench shares (requests on a schedule, whatever the
answers' pace: Poisson arrivals at a rate from a seed, or evenly spaced), the closed-loop capacity, and the
minimal asyncio HTTP/1.1 client they run on (keep-alive connections in a pool, as a Router holds them).

Latency runs from a request's scheduled time to its last byte: a request that waits for a free
connection, or a client that falls behind, counts against the server, never in its favour.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.harness.server import HOST

HTTP_TIMEOUT_S = 60.0
#: what a request that got no HTTP answer raises: refused or reset connections, a cut response, a timeout
_NO_ANSWER = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError)


class Connection:
    """One keep-alive connection: a request written as bytes, the response framed by Content-Length."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), HTTP_TIMEOUT_S)
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = await asyncio.wait_for(self.reader.readexactly(length), HTTP_TIMEOUT_S) if length else b""
        return status, data

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class Reply:
    """One request of an open loop and what came back."""

    index: int  # its place in the schedule
    scheduled: float  # loop time it was due
    sent_at: float  # wall clock, as it was written
    received_at: float  # wall clock, after its last byte (or its failure)
    latency_s: float  # from ``scheduled`` to the last byte
    status: int  # 0: no HTTP answer
    body: bytes
    error: str | None = None


@dataclass
class OpenLoopRun:
    """What an open loop sent and got back, replies in completion order."""

    sent: int = 0
    wall_s: float = 0.0
    replies: list[Reply] = field(default_factory=list)


#: The requests of a load: the i-th request's path and body.
Requests = Callable[[int], tuple[str, bytes]]


async def open_loop(port: int, requests: Requests, rate: float, *, connections: int,
                    duration_s: float | None = None, stop: threading.Event | None = None,
                    seed: int | None = None) -> OpenLoopRun:
    """POST ``requests(i)`` at ``rate`` per second over ``connections`` pooled keep-alive connections:
    Poisson arrivals from ``seed``, or evenly spaced without one; no request is scheduled past ``duration_s``
    or once ``stop`` is set, and every one sent is waited for. A connection that fails is replaced; its
    request is answered status 0 with the error."""
    if duration_s is None and stop is None:
        raise ValueError("an open loop needs a duration or a stop event")
    loop = asyncio.get_running_loop()
    pool: asyncio.Queue[Connection | None] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await Connection.open(port))
    run = OpenLoopRun()
    rng = random.Random(seed) if seed is not None else None

    async def one(i: int, scheduled: float) -> None:
        path, body = requests(i)
        conn = await pool.get()
        sent = time.time()
        status, data, error = 0, b"", None
        try:
            if conn is None:
                conn = await Connection.open(port)
            status, data = await conn.request("POST", path, body)
        except _NO_ANSWER as exc:
            error = f"{type(exc).__name__}: {exc}"
            if conn is not None:
                conn.close()
            conn = None  # reopened by the next request that takes this slot
        finally:
            pool.put_nowait(conn)
        run.replies.append(Reply(i, scheduled, sent, time.time(), loop.time() - scheduled, status, data, error))

    started = loop.time()
    due = started
    tasks = []
    while stop is None or not stop.is_set():
        due = due + rng.expovariate(rate) if rng is not None else started + len(tasks) / rate
        if duration_s is not None and due - started > duration_s:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if stop is not None and stop.is_set():
            break
        tasks.append(asyncio.create_task(one(len(tasks), due)))
    run.sent = len(tasks)
    await asyncio.gather(*tasks)
    run.wall_s = loop.time() - started
    while not pool.empty():
        conn = pool.get_nowait()
        if conn is not None:
            conn.close()
    return run


async def closed_loop_capacity(port: int, path: str, duration_s: float, bodies: list[bytes],
                               connections: int) -> float:
    """Requests per second answered with ``connections`` clients each sending as soon as answered."""
    loop = asyncio.get_running_loop()
    done = 0
    end = loop.time() + duration_s

    async def client(k: int) -> None:
        nonlocal done
        conn = await Connection.open(port)
        i = k
        try:
            while loop.time() < end:
                status, body = await conn.request("POST", path, bodies[i % len(bodies)])
                if status != 200:
                    raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
                done += 1
                i += connections
        finally:
            conn.close()

    started = loop.time()
    await asyncio.gather(*(client(k) for k in range(connections)))
    return done / (loop.time() - started)


__all__ = ["Connection", "OpenLoopRun", "Reply", "Requests", "closed_loop_capacity", "open_loop"]
