"""The loop only dispatches (issue 23 item 6): what decoding costs where it runs, and /health/live
while the server decompresses large zstd bodies and decodes the largest image and video a model admits.

- Inline or pool: decoding a compressed body whose decoded form is at most ``INLINE_BODY_BYTES``
  (``api.body.decode_small``, on the loop) against one hand-off to the preparation pool
  (``WorkPool.offload`` of a no-op from a running loop); what decoding 8 MiB costs (what the loop
  held before this change); and a PNG of 16 KB that claims 2000 x 2000 pixels (why media never
  stay on the loop, whatever their body's size).
- Liveness: a sparrow server (``--max-request-bytes`` 16 MiB) and the decision-vision fixture
  (32 MiB); each heavy request is sent while a second connection polls /health/live every 10 ms;
  the table gives the slowest probe answered while the request was in flight.

``python -m bench.loop_liveness [--rounds N] [--record]`` (needs the converters' training stack to
build the fixtures, about 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import http.client
import io
import json
import random
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import zstandard

from bench.harness.report import Table, conditions, fmt_ms, record, render_run
from bench.harness.server import HOST, ServerProcess
from bench.harness.stats import median
from bench.harness.texts import long_text

MIB = 1 << 20
PROBE_GAP_S = 0.01
ZSTD = zstandard.ZstdCompressor(level=3).compress
NOUL = {"q": {"type": "noul", "instructions": "Is the scene busy?"}}


def _timed(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(median, 90th percentile) seconds of ``n`` calls."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    times.sort()
    return median(times), times[int(0.9 * (n - 1))]


def _handoff(n: int) -> tuple[float, float]:
    """(median, p90) seconds of one WorkPool.offload of a no-op, awaited from a running loop."""
    from edge_runtime.work import WorkPool

    pool = WorkPool(max_queue=n + 1)

    async def run() -> list[float]:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await pool.offload(int)
            times.append(time.perf_counter() - started)
        return times

    try:
        times = sorted(asyncio.run(run()))
    finally:
        pool.close()
    return median(times), times[int(0.9 * (n - 1))]


def inline_or_pool(rounds: int) -> Table:
    """Decoding small compressed bodies here against the hand-off; 8 MiB decodes; a small big PNG."""
    from PIL import Image

    from edge_runtime.api.body import decode_body, decode_small
    from edge_runtime.work import INLINE_BODY_BYTES

    rows = []
    n = 200 * rounds
    hand = _handoff(n)
    rows.append(["hand-off to the pool (no-op job)", "–", fmt_ms(hand[0], 3), fmt_ms(hand[1], 3), "pool"])
    for size in (1024, 4096, INLINE_BODY_BYTES - 64):
        body = b'{"input": "' + long_text(size - 14).encode() + b'"}'
        for coding, encode in (("gzip", gzip.compress), ("zstd", ZSTD)):
            sent = encode(body)
            assert decode_small(sent, coding, 8 * MIB, INLINE_BODY_BYTES) == body
            t = _timed(partial(decode_small, sent, coding, 8 * MIB, INLINE_BODY_BYTES), n)
            rows.append([f"{coding} of prose, {len(body):,} bytes decoded", f"{len(sent):,}", fmt_ms(t[0], 3),
                         fmt_ms(t[1], 3), "loop"])
    prose = long_text(8 * MIB).encode()
    noise = base64.b64encode(random.Random(23).randbytes(6 * MIB))
    for name, body in (("prose", prose), ("random base64", noise)):
        for coding, encode in (("gzip", gzip.compress), ("zstd", ZSTD)):
            sent = encode(body)
            t = _timed(partial(decode_body, sent, coding, 16 * MIB), max(3, rounds))
            rows.append([f"{coding} of {name}, {len(body) / MIB:.0f} MiB decoded", f"{len(sent):,}",
                         fmt_ms(t[0]), fmt_ms(t[1]), "pool"])
    buf = io.BytesIO()
    Image.new("RGB", (2000, 2000), (120, 30, 200)).save(buf, format="PNG", optimize=True)
    png = buf.getvalue()

    def decode() -> None:
        image = Image.open(io.BytesIO(png))
        image.load()
        image.resize((128, 128), Image.Resampling.BICUBIC)

    t = _timed(decode, max(5, rounds))
    rows.append(["PNG 2000 x 2000 decoded and resized", f"{len(png):,}", fmt_ms(t[0]), fmt_ms(t[1]), "pool"])
    return Table(
        f"Decoding on the loop or on the pool ({n} calls for the small ones)",
        ["work", "bytes as sent", "median ms", "p90 ms", "runs on"],
        rows,
        notes=[f"A compressed body stays on the loop only while it is at most {INLINE_BODY_BYTES} bytes as "
               "sent and once decoded (decode_small stops past that and hands the body on); media go to the "
               "pool whatever their body's size."],
    )


def _probe_while(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, float, list[float]]:
    """(status, request seconds, probe seconds) for ``body`` POSTed while /health/live is polled."""
    result: dict[str, Any] = {}

    def send() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=600)
        started = time.perf_counter()
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        result["status"], result["s"] = response.status, time.perf_counter() - started
        conn.close()

    sender = threading.Thread(target=send)
    probe = http.client.HTTPConnection(HOST, port, timeout=60)
    sender.start()
    latencies = []
    while sender.is_alive():
        started = time.perf_counter()
        probe.request("GET", "/health/live")
        probe.getresponse().read()
        if sender.is_alive():
            latencies.append(time.perf_counter() - started)
        time.sleep(PROBE_GAP_S)
    sender.join()
    probe.close()
    return result["status"], result["s"], latencies


def liveness(rounds: int, work: Path) -> Table:
    """The slowest /health/live answered while each heavy request was handled."""
    from converters.decision_vision.fixture import build_decision_vision_fixture_result
    from converters.sparrow.export import build_sparrow_package
    from tests.support.media_samples import image_bytes, picture, video_bytes

    sparrow = build_sparrow_package(work / "sparrow")
    vision = build_decision_vision_fixture_result(work / "vision").path
    json_headers = {"content-type": "application/json"}
    zstd_headers = {**json_headers, "content-encoding": "zstd"}

    def noul(state: str) -> dict[str, Any]:
        return {"model": "sparrow", "state": state, "questions": NOUL}

    def vision_body(**media: list[str]) -> bytes:
        return json.dumps({"model": "vision", "state": "Is anything moving?", **media, "questions": NOUL}).encode()

    image = image_bytes(picture(4000, 4000, seed=23), "JPEG", quality=90)
    video = video_bytes(20, 2, (3840, 2160))
    cases = [
        ("sparrow", "zstd, 8 MiB as sent (random base64 state)",
         ZSTD(json.dumps(noul(base64.b64encode(random.Random(23).randbytes(8 * MIB)).decode())).encode()),
         zstd_headers),
        ("sparrow", "zstd, 8 MiB decoded from < 1 KiB", ZSTD(json.dumps(noul("a" * (8 * MIB))).encode()), zstd_headers),
        ("vision", "image, 4000 x 4000 JPEG (16,000,000 pixels)",
         vision_body(images=["data:image/jpeg;base64," + base64.b64encode(image).decode()]), json_headers),
        ("vision", "video, 20 s of 3840 x 2160 at 2 fps (40 frames)",
         vision_body(videos=["data:video/mp4;base64," + base64.b64encode(video).decode()]), json_headers),
    ]
    servers = {
        "sparrow": ServerProcess(sparrow, "fp32", 1, name="sparrow", args=("--max-request-bytes", str(16 * MIB))),
        "vision": ServerProcess(vision, "fp32", 1, name="vision", args=("--max-request-bytes", str(32 * MIB))),
    }
    rows = []
    try:
        for server in servers.values():
            server.wait_ready()
        results: dict[str, list[tuple[int, float, list[float]]]] = {name: [] for _, name, _, _ in cases}
        for _ in range(rounds):
            for model, name, body, headers in cases:
                results[name].append(_probe_while(servers[model].port, "/v1/decisions", body, headers))
        for _, name, body, _ in cases:
            runs = results[name]
            statuses = sorted({status for status, _, _ in runs})
            slowest = [max(probes, default=0.0) for _, _, probes in runs]
            rows.append([name, f"{len(body):,}", ", ".join(map(str, statuses)), fmt_ms(median([s for _, s, _ in runs])),
                         str(sum(len(p) for _, _, p in runs)), fmt_ms(median(slowest), 1), fmt_ms(max(slowest), 1)])
    finally:
        for server in servers.values():
            server.stop()
    return Table(
        f"/health/live while a heavy request is handled ({rounds} rounds)",
        ["request", "bytes as sent", "status", "request ms (median)", "probes", "slowest probe ms (median)",
         "slowest probe ms (max)"],
        rows,
        notes=["Probes every 10 ms on a second keep-alive connection; only those answered while the request "
               "was in flight count. tests/test_event_loop.py asserts the same cases under 100 ms."],
    )


def main(argv: list[str] | None = None) -> int:
    """Run both tables; ``--record`` appends them to docs/benchmarks.md."""
    parser = argparse.ArgumentParser(prog="python -m bench.loop_liveness", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--liveness-only", action="store_true", help="skip the inline-or-pool table (it needs "
                        "api.body.decode_small, so an older checkout can be measured for comparison)")
    args = parser.parse_args(argv)
    conds = conditions(1, args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        tables = [] if args.liveness_only else [inline_or_pool(args.rounds)]
        tables.append(liveness(args.rounds, Path(tmp)))
    text = render_run("python -m bench.loop_liveness", conds, tables)
    print(text)
    if args.record:
        record(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
