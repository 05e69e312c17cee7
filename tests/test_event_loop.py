"""The event loop is never held by a request's work, long inputs cost what their budget allows,
and SIGTERM drains: every accepted request is answered and the process exits 0.

Timings are printed for the record (docs/benchmarks.md), and asserted in one place only: issue 23's
acceptance line, /health/live under 100 ms while the server decompresses an 8 MiB zstd body and
decodes the largest image and video a model admits (a loop held by that work waits 130-700 ms).
Elsewhere what is asserted is order (liveness answered while the heavy request is still in flight)
and outcome.
"""

from __future__ import annotations

import base64
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.server_harness import Server, write_models_file


@pytest.fixture(scope="module")
def sparrow_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from converters.sparrow.export import build_sparrow_package

    return build_sparrow_package(tmp_path_factory.mktemp("loop-sparrow"))


@pytest.fixture(scope="module")
def server(sparrow_package: Path, fixture_package: Callable[..., Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = write_models_file(tmp_path_factory.mktemp("loop") / "models.yaml", [
        {"name": "sparrow-nano", "package": str(sparrow_package), "device": "cpu", "threads": 1},
        {"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu", "threads": 1},
    ])
    srv = Server(models, "--max-request-bytes", str(16 << 20))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _probe_while(server: Server, path: str, body: dict[str, Any] | bytes,
                 headers: dict[str, str] | None = None) -> tuple[httpx.Response, list[float]]:
    """POST ``body`` (JSON, or bytes sent as they are with ``headers``) and poll /health/live until
    it is answered; the latencies of probes answered meanwhile."""
    result: dict[str, httpx.Response] = {}
    if not isinstance(body, bytes):  # encoded here, not in the sender: its GIL hold would delay our own probes
        body, headers = orjson.dumps(body), {"content-type": "application/json"}

    def send() -> None:
        result["r"] = httpx.post(server.url + path, content=body, headers=headers, timeout=120)

    sender = threading.Thread(target=send)
    sender.start()
    latencies = []
    with httpx.Client(base_url=server.url, timeout=60) as probe:
        while sender.is_alive():
            started = time.perf_counter()
            live = probe.get("/health/live")
            if sender.is_alive():  # answered while the heavy request was still being handled
                assert live.status_code == 200
                latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    sender.join()
    print(f"{path}: {len(latencies)} liveness probes in flight, slowest {max(latencies, default=0) * 1000:.1f} ms")
    return result["r"], latencies


def _noul(state: str) -> dict[str, Any]:
    return {"model": "sparrow-nano", "state": state,
            "questions": {"q": {"type": "noul", "instructions": "Is this a complaint?"}}}


@pytest.mark.parametrize("unit", ["!?", "a", " ", "QUJD", "\u4e2d\u6587", "\U0001f600 ", "\u03a3\u03b1 "])
def test_a_large_decisions_state_costs_its_budget_not_its_length(server: Server, unit: str) -> None:
    state = unit * ((8 << 20) // len(unit.encode()) - 64)
    big, latencies = _probe_while(server, "/v1/decisions", _noul(state))
    assert big.status_code == 200, big.text
    # The state is read only as far as max_input_tokens decides: its answer is the answer of a prefix.
    small = server.client.post("/v1/decisions", json=_noul(state[:65536]))
    assert big.json()["answers"] == small.json()["answers"]
    assert big.json()["usage"] == small.json()["usage"]
    if unit not in ("a", " ", "QUJD"):  # millions of tokens: past the budget, read no further than it
        assert big.json()["answers"]["q"]["error"] == "max_length_exceeded"
    else:  # one long word (or base64) is one [UNK], white space none: read whole, answered
        assert "noul" in big.json()["answers"]["q"]


def test_a_state_read_whole_reports_exact_tokens(server: Server) -> None:
    usage = server.client.post("/v1/decisions", json=_noul("a short state")).json()["usage"]
    assert "tokens_lower_bound" not in usage and usage["input_tokens"] > 0


# One long word is read whole (WordPiece spells it as one [UNK]), so finding where it ends scans the
# whole state: that scan held the GIL, and with it the loop, for 1.2 s in one regex search.
@pytest.mark.parametrize("shape", ["punctuation runs", "one long word", "hex", "CJK without spaces", "emoji"])
def test_liveness_is_answered_while_a_large_state_is_handled(server: Server, shape: str) -> None:
    from bench.harness.texts import shaped_text

    big, latencies = _probe_while(server, "/v1/decisions", _noul(shaped_text(shape, 8 << 20)))
    assert big.status_code == 200, big.text[:500]
    assert latencies, "no /health/live answer came back while the request was in flight"


def test_liveness_is_answered_while_2048_texts_are_tokenized(server: Server) -> None:
    texts = [f"text {i} " + "lorem ipsum dolor sit amet " * 133 for i in range(2048)]
    big, latencies = _probe_while(server, "/v1/embeddings", {"model": "emb", "input": texts,
                                                             "options": {"overflow": "truncate"}})
    assert big.status_code == 200, big.text[:500]
    assert len(big.json()["data"]) == 2048
    assert latencies, "no /health/live answer came back while the request was in flight"


# -- issue 23: the loop only dispatches ---------------------------------------------------------

#: The acceptance line's bound on every /health/live answered while the heavy request is handled.
LIVE_BOUND_S = 0.1


def _live_within_bound(latencies: list[float]) -> None:
    assert latencies, "no /health/live answer came back while the request was in flight"
    slowest = max(latencies)
    assert slowest < LIVE_BOUND_S, f"/health/live took {slowest * 1000:.0f} ms while the request was handled"


def _zstd_json(body: dict[str, Any]) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3).compress(orjson.dumps(body))


@pytest.mark.parametrize("shape", ["8 MiB as sent", "8 MiB from 1 KiB"])
def test_liveness_stays_under_100_ms_while_a_zstd_body_is_decompressed(server: Server, shape: str) -> None:
    if shape == "8 MiB as sent":  # random base64 text: zstd keeps about 3/4 of it
        state = base64.b64encode(random.Random(23).randbytes(8 << 20)).decode()
    else:  # one repeated letter: a small body that inflates to 8 MiB, past what is decoded inline
        state = "a" * (8 << 20)
    sent = _zstd_json(_noul(state))
    assert len(sent) >= 8 << 20 if shape == "8 MiB as sent" else len(sent) < 1024
    big, latencies = _probe_while(server, "/v1/decisions", sent,
                                  {"content-type": "application/json", "content-encoding": "zstd"})
    assert big.status_code == 200, big.text[:500]
    assert "q" in big.json()["answers"]
    _live_within_bound(latencies)


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The decision-vision fixture (images up to 16,000,000 pixels; video frames up to 3840 x 2160
    and 256 video tokens), with room for a 16 MiB image in a JSON body."""
    from converters.decision_vision.fixture import build_decision_vision_fixture_result

    root = tmp_path_factory.mktemp("loop-vision")
    package = build_decision_vision_fixture_result(root / "pkg").path
    models = write_models_file(root / "models.yaml", [
        {"name": "vision", "package": str(package), "device": "cpu", "threads": 1}])
    srv = Server(models, "--max-request-bytes", str(32 << 20))
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def _vision(**media: list[str]) -> dict[str, Any]:
    return {"model": "vision", "state": "Is anything moving?", **media,
            "questions": {"q": {"type": "noul", "instructions": "Is the scene busy?"}}}


def _refused(server: Server, body: dict[str, Any], reason: str) -> None:
    r = server.client.post("/v1/decisions", json=body)
    assert r.status_code == 400 and r.json()["error"]["reason"] == reason, r.text[:500]


def test_liveness_stays_under_100_ms_while_the_largest_image_is_decoded(vision_server: Server) -> None:
    from PIL import Image

    from tests.support.media_samples import data_url, image_bytes, picture

    # 16,000,000 pixels, the contract's largest image (the card allows as many): a 7 MB JPEG.
    largest = image_bytes(picture(4000, 4000, seed=23), "JPEG", quality=90)
    big, latencies = _probe_while(vision_server, "/v1/decisions", _vision(images=[data_url(largest, "image/jpeg")]))
    assert big.status_code == 200, big.text[:500]
    assert "noul" in big.json()["answers"]["q"]
    _live_within_bound(latencies)
    one_more_row = image_bytes(Image.new("RGB", (4000, 4001)), "JPEG")
    _refused(vision_server, _vision(images=[data_url(one_more_row, "image/jpeg")]), "image_too_large")


def test_liveness_stays_under_100_ms_while_the_largest_video_is_decoded(vision_server: Server) -> None:
    from tests.support.media_samples import data_url, video_bytes

    # Frames of 3840 x 2160 (the card's video_source_max_pixels), 20 s at the card's 2 fps: 40
    # frames, the most its 256 video tokens admit; a second more is refused before any decoding.
    largest = video_bytes(20, 2, (3840, 2160))
    big, latencies = _probe_while(vision_server, "/v1/decisions", _vision(videos=[data_url(largest, "video/mp4")]))
    assert big.status_code == 200, big.text[:500]
    assert "noul" in big.json()["answers"]["q"]
    _live_within_bound(latencies)
    # the token count depends on the frames' aspect ratio, not their size: a small clip shows the bound
    _refused(vision_server, _vision(videos=[data_url(video_bytes(21, 2, (384, 216)), "video/mp4")]), "video_tokens")
    _refused(vision_server, _vision(videos=[data_url(video_bytes(1, 2, (3856, 2160)), "video/mp4")]),
             "video_too_large")


def test_sigterm_answers_every_accepted_request_and_exits_0(
    fixture_package: Callable[..., Path], tmp_path: Path
) -> None:
    models = write_models_file(tmp_path / "models.yaml", [
        {"name": "emb", "package": str(fixture_package("embedding")), "device": "cpu", "threads": 1},
    ])
    srv = Server(models, "--drain-seconds", "20")
    try:
        srv.wait()
        texts = ["slow request text " * 20] * 512
        # Six connections opened first, so that on a loaded machine every request is on the wire
        # before the signal (a connection still being set up at SIGTERM is refused, by design).
        clients = [httpx.Client(base_url=srv.url, timeout=60) for _ in range(6)]
        for client in clients:
            assert client.get("/health").status_code == 200
        with ThreadPoolExecutor(6) as pool:
            sent = [pool.submit(c.post, "/v1/embeddings", json={"model": "emb", "input": texts}) for c in clients]
            time.sleep(0.5)  # all six are accepted and queued behind each other
            srv.proc.send_signal(signal.SIGTERM)
            statuses = [f.result().status_code for f in sent]
        for client in clients:
            client.close()
        assert statuses == [200] * 6, statuses
        assert srv.proc.wait(30) == 0, srv.log()
        assert "terminate called" not in srv.log()
    finally:
        srv.stop()


@pytest.mark.parametrize("bad_type", [["noul"], {"type": "noul"}, 7, None, True])
def test_a_question_of_any_malformed_type_is_answered_in_place(server: Server, bad_type: Any) -> None:
    questions = {"bad": {"type": bad_type, "instructions": "x"},
                 "good": {"type": "noul", "instructions": "Is this a complaint?"}}
    single = {"model": "sparrow-nano", "state": "I was charged twice", "questions": questions}
    # System One fails the request for a failed question (422), naming it; never a 500.
    refused = server.client.post("/v1/systemone", json=single)
    assert refused.status_code == 422, refused.text
    assert refused.json()["question"] == "bad" and refused.json()["reason"] == "question_malformed"
    for path, body in (("/v1/decisions", single), ("/v1/bundle", {"tasks": [{"id": "t", "decisions": single}]})):
        r = server.client.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
        answers = r.json()["results"][0]["decisions"]["answers"] if path == "/v1/bundle" else r.json()["answers"]
        assert "noul" in answers["good"], (path, answers)
        assert answers["bad"]["error"] == "invalid_question", (path, answers)
