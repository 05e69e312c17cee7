"""The access log's writer: lines whole and in order, formatted and written off the request's path on the
loop (FLUSH_SECONDS at most, or once MAX_PENDING wait)."""

from __future__ import annotations

import asyncio
import os
import select
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from unittest import mock

import orjson
import pytest

from edge_runtime.api import access_log


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


class Phases:
    def __init__(self) -> None:
        self.total = 0.5

    def milliseconds(self) -> dict[str, float]:
        return {"total": self.total}


def log(i: int, timing: Phases | None = None) -> None:
    access_log.log(f"id-{i}", "POST", "/v1/decisions", "m" * (i % 97), 200, i, 2 * i, timing or Phases())


def lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_lines_on_the_loop_are_written_within_the_flush_interval(log_file: Path) -> None:
    async def requests() -> tuple[int, int, int]:
        for i in range(3):
            log(i)
        before = len(log_file.read_bytes())
        await asyncio.sleep(0)
        soon = len(log_file.read_bytes())
        await asyncio.sleep(access_log.FLUSH_SECONDS * 2)  # the flush the first line scheduled has run
        return before, soon, len(lines(log_file))

    assert asyncio.run(requests()) == (0, 0, 3)
    assert [line["id"] for line in lines(log_file)] == ["id-0", "id-1", "id-2"]


def test_off_the_loop_a_line_is_written_at_once(log_file: Path) -> None:
    log(7)
    line = lines(log_file)[0]
    assert (line["bytes_in"], line["bytes_out"], line["timings"], line["method"]) == (7, 14, {"total": 0.5}, "POST")


def test_a_line_is_formatted_when_written_with_the_time_it_was_noted(log_file: Path) -> None:
    async def request() -> float:
        phases = Phases()
        noted = time.time()
        log(1, phases)
        phases.total = 0.75  # still the request's until its line is formatted: the flush reads the final phases
        await asyncio.sleep(access_log.FLUSH_SECONDS * 2)
        return noted

    noted = asyncio.run(request())
    line = lines(log_file)[0]
    assert line["timings"] == {"total": 0.75}
    at = datetime.fromisoformat(str(line["time"])).timestamp()
    assert noted - 0.001 <= at <= noted + 0.05  # the time it was noted (ms resolution), not the flush's


def test_a_full_batch_is_written_once_its_response_is_sent(log_file: Path) -> None:
    async def burst() -> tuple[int, int]:
        for i in range(access_log.MAX_PENDING):
            log(i)
        written = len(log_file.read_bytes())
        await asyncio.sleep(0)  # the loop's next round: the flush the full batch scheduled
        return written, len(lines(log_file))

    assert asyncio.run(burst()) == (0, access_log.MAX_PENDING)


def test_many_lines_are_written_in_whole_line_pieces(log_file: Path) -> None:
    pieces: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        pieces.append(bytes(data))
        return real_write(fd, data)

    async def burst() -> None:
        for i in range(200):
            log(i)
        await asyncio.sleep(access_log.FLUSH_SECONDS * 2)

    with mock.patch.object(access_log.os, "write", spy):
        asyncio.run(burst())
    assert len(pieces) > 1 and all(len(p) <= select.PIPE_BUF and p.endswith(b"\n") for p in pieces)
    assert [line["id"] for line in lines(log_file)] == [f"id-{i}" for i in range(200)]


def test_nothing_is_written_when_off() -> None:
    access_log.configure(False)
    assert not access_log.enabled()
    log(1)  # no descriptor to write to, and no error
    access_log.flush()
