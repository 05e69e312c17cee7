"""The access log's writer: lines whole and in order, buffered on the loop for FLUSH_SECONDS at most and
formatted when written."""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import orjson
import pytest

from edge_runtime.api import access_log
from edge_runtime.timing import Timing


@pytest.fixture()
def log_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "access.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    access_log.configure(True, fd)
    try:
        yield path
    finally:
        access_log.flush()
        access_log.configure(False)
        os.close(fd)


def record(i: int, timing: Timing | None = None) -> access_log.Access:
    return access_log.Access(f"id-{i}", "POST", "/v1/decisions", "m" * (i % 97), 200, i, 2 * i, timing)


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_lines_on_the_loop_are_written_within_the_flush_interval(log_file: Path) -> None:
    async def requests() -> tuple[int, int, int]:
        for i in range(3):
            access_log.write(record(i))
        before = len(log_file.read_bytes())
        await asyncio.sleep(0)
        soon = len(log_file.read_bytes())
        await asyncio.sleep(access_log.FLUSH_SECONDS * 2)  # the flush the first line scheduled has run
        return before, soon, len(lines(log_file))

    assert asyncio.run(requests()) == (0, 0, 3)
    assert [line["id"] for line in lines(log_file)] == ["id-0", "id-1", "id-2"]


def test_a_full_buffer_is_written_at_once(log_file: Path) -> None:
    async def requests() -> int:
        for i in range(access_log.PENDING_LINES):
            access_log.write(record(i))
        return len(lines(log_file))  # before the loop ran the flush timer

    assert asyncio.run(requests()) == access_log.PENDING_LINES


def test_a_line_is_its_request_as_answered(log_file: Path) -> None:
    timing = Timing()
    timing.add("forward", 0.0012)
    timing.finish()
    access = record(5, timing)
    access_log.write(access)  # off the loop: formatted and written now
    line = lines(log_file)[0]
    assert line["time"] == datetime.fromtimestamp(access.at, UTC).isoformat(timespec="milliseconds")
    assert str(line["time"]).endswith("+00:00")
    assert line["timings"] == timing.milliseconds() and timing.milliseconds()["forward"] == 1.2
    assert {k: line[k] for k in ("id", "method", "route", "status", "bytes_in", "bytes_out")} == {
        "id": "id-5", "method": "POST", "route": "/v1/decisions", "status": 200, "bytes_in": 5, "bytes_out": 10}


def test_off_the_loop_a_line_is_written_at_once(log_file: Path) -> None:
    access_log.write(record(7))
    assert lines(log_file)[0]["bytes_in"] == 7


def test_many_lines_are_written_in_whole_line_pieces(log_file: Path) -> None:
    pieces: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        pieces.append(bytes(data))
        return real_write(fd, data)

    async def burst() -> None:
        for i in range(200):
            access_log.write(record(i))
        await asyncio.sleep(access_log.FLUSH_SECONDS * 2)

    with mock.patch.object(access_log.os, "write", spy):
        asyncio.run(burst())
    assert len(pieces) > 1 and all(len(p) <= select.PIPE_BUF and p.endswith(b"\n") for p in pieces)
    assert [line["id"] for line in lines(log_file)] == [f"id-{i}" for i in range(200)]


def test_nothing_is_written_when_off() -> None:
    access_log.configure(False)
    assert not access_log.enabled()
    access_log.write(record(1))  # no descriptor to write to, and no error
    access_log.flush()
