"""decision-vision over HTTP: every fixed reason the contract lists for images, videos, assets and
Box, each provoked by a request to the real server, and hostile media refused while it keeps serving.

One server serves the converted fixture three times: ``vision`` as converted; ``tight``, a copy
whose card has small byte, pixel and length limits (so the limits are provoked by small bodies)
and no Box or track in its question_types; ``blind``, a copy whose card lists the text modality
only. The hostile media are made in process: a PNG and a WebP whose
headers claim huge canvases in a few dozen bytes, an MP4 whose header claims ten hours, truncated
and garbage videos, animated PNG, WebP and GIF, a 1 x 20,000 image.
"""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from converters.decision_vision.fixture import build_decision_vision_fixture_result
from edge_runtime.api.schema import validate_response
from tests.support.media_reasons import (
    HOSTILE,
    NOUL,
    animated,
    answered,
    copy_with_card,
    data_url,
    encoded,
    image_url,
    mp4_claiming_hours,
    png_claiming,
    post,
    refused,
    still_serving,
    video_url,
    webp_claiming,
)
from tests.support.media_samples import Pipe, encode_video, write_clip
from tests.support.server_harness import Server, write_models_file
from tests.support.vision import BODY_QUESTIONS, png_b64, png_url, sample_image

#: The tight copy's limits: small enough that small bodies break them.
TIGHT_LIMITS = {"image_max_bytes": 3000, "image_source_max_pixels": 100 * 100, "video_max_bytes": 20_000,
                "video_max_seconds": 1.5, "video_source_max_pixels": 48 * 48}


@pytest.fixture(scope="module")
def card(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The converted fixture's card, its package path under ``path``."""
    result = build_decision_vision_fixture_result(tmp_path_factory.mktemp("decision-vision") / "pkg")
    return {**result.card, "path": result.path}


@pytest.fixture(scope="module")
def server(card: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``vision`` as converted; ``tight`` with TIGHT_LIMITS and no Box or track; ``blind`` reads text only."""
    root = tmp_path_factory.mktemp("reasons")
    tight = copy_with_card(card["path"], root / "tight", name="tight", limits=TIGHT_LIMITS,
                            question_types=["choice", "noul", "score"])
    blind = copy_with_card(card["path"], root / "blind", name="blind", modalities=["text"])
    models = write_models_file(root / "models.yaml", [
        {"name": name, "package": str(path), "device": "cpu", "threads": 1}
        for name, path in (("vision", card["path"]), ("tight", tight), ("blind", blind))])
    srv = Server(models)
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


def test_the_hostile_media_are_what_they_claim() -> None:
    """The hostile inputs below are hostile: huge claims in tiny files, hours in a header, several frames."""
    import av

    assert len(png_claiming(100_000, 100_000)) < 100 and len(webp_claiming(16_383, 16_383)) < 100
    assert Image.open(io.BytesIO(png_claiming(5000, 4000))).size == (5000, 4000)
    with av.open(io.BytesIO(mp4_claiming_hours(10)), format="mp4") as container:
        assert container.duration is not None and container.duration / 1e6 >= 10 * 3600 - 1
    for fmt in ("PNG", "WEBP", "GIF"):
        assert getattr(Image.open(io.BytesIO(animated(fmt))), "n_frames", 1) == 3, fmt


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_media_are_refused_and_the_server_keeps_serving(server: Server, case: str) -> None:
    make, member, reason, limit = HOSTILE[case]
    refused(server, {"state": "s", member: [make()], "questions": NOUL}, reason, limit)
    still_serving(server)


# ---- images ---------------------------------------------------------------------------------


def test_image_limits_of_the_card(server: Server) -> None:
    noisy = image_url(sample_image(60, 60, 35))  # noisy pixels: PNG keeps them, > 3,000 bytes
    refused(server, {"state": "s", "images": [noisy], "questions": NOUL}, "image_too_large",
            TIGHT_LIMITS["image_max_bytes"], model="tight")
    flat = image_url(Image.new("RGB", (120, 100), (9, 99, 199)))  # a few hundred bytes, 12,000 pixels
    refused(server, {"state": "s", "images": [flat], "questions": NOUL}, "image_too_large",
            TIGHT_LIMITS["image_source_max_pixels"], model="tight")
    small = image_url(Image.new("RGB", (90, 90), (9, 99, 199)))  # within both: answered
    assert answered(server, {"state": "s", "images": [small], "questions": NOUL}, "tight")["n"]["type"] == "noul"


def test_image_intake_reasons(server: Server) -> None:
    gif = image_url(Image.new("RGB", (8, 8)), "GIF")
    refused(server, {"state": "s", "images": [gif], "questions": NOUL}, "image_format_unsupported")
    bmp = image_url(Image.new("RGB", (8, 8)), "BMP")
    refused(server, {"state": "s", "images": [bmp], "questions": NOUL}, "image_format_unsupported")
    for bad in ("data:image/png;base64,!!!!", "data:image/png;base64,", "data:image/png," + "x" * 8,
                data_url("image/png", b"not an image at all")):
        refused(server, {"state": "s", "images": [bad], "questions": NOUL}, "image_malformed")
    refused(server, {"state": "s", "images": ["https://example.com/cat.png"], "questions": NOUL},
            "image_url_unsupported")
    # the format comes from the bytes: JPEG and WebP bytes under a PNG label are read as what they are
    for fmt in ("JPEG", "WEBP"):
        url = image_url(sample_image(40, 40, 36), fmt).replace(f"image/{fmt.lower()}", "image/png")
        assert answered(server, {"state": "s", "images": [url], "questions": NOUL})["n"]["type"] == "noul"


# ---- videos ---------------------------------------------------------------------------------


def test_video_limits_of_the_card(server: Server) -> None:
    refused(server, {"state": "s", "videos": [video_url(encode_video("mp4", 2.0, 10, (40, 40)))],
                     "questions": NOUL}, "video_too_long", TIGHT_LIMITS["video_max_seconds"], model="tight")
    refused(server, {"state": "s", "videos": [video_url(encode_video("mp4", 1.0, 10, (64, 48)))],
                     "questions": NOUL}, "video_too_large", TIGHT_LIMITS["video_source_max_pixels"], model="tight")
    big = encode_video("mp4", 1.0, 10, (40, 40)) + bytes(TIGHT_LIMITS["video_max_bytes"])  # padded past the cap
    refused(server, {"state": "s", "videos": [video_url(big)], "questions": NOUL}, "video_too_large",
            TIGHT_LIMITS["video_max_bytes"], model="tight")
    ok = video_url(encode_video("mp4", 1.0, 10, (40, 40)))
    assert answered(server, {"state": "s", "videos": [ok], "questions": NOUL}, "tight")["n"]["type"] == "noul"


def test_video_intake_reasons(server: Server, card: dict[str, Any]) -> None:
    refused(server, {"state": "s", "videos": ["https://example.com/clip.mp4"], "questions": NOUL},
            "video_url_unsupported")
    refused(server, {"state": "s", "videos": ["data:video/mp4;base64,@@@@"], "questions": NOUL}, "video_malformed")
    # 20 s at 2 frames a second: more than the card's video_max_tokens for the request's videos
    long_clip = video_url(encode_video("mp4", 20.0, 2, (64, 48)))
    refused(server, {"state": "s", "videos": [long_clip], "questions": NOUL}, "video_tokens",
            card["limits"]["video_max_tokens"])


# ---- assets -----------------------------------------------------------------------------------


def test_asset_reasons(server: Server) -> None:
    img = {"type": "image", "data_base64": png_b64(sample_image(32, 32, 37))}
    refused(server, {"state": "no reference here", "assets": {"<a>": img}, "questions": NOUL}, "asset_unreferenced")
    refused(server, {"state": "x" * 1025, "assets": {"x" * 1025: img}, "questions": NOUL},
            "asset_reference_too_long", 1024)
    refused(server, {"state": "s", "assets": {"": img}, "questions": NOUL}, "asset_reference_empty", 1)
    many = {f"{k:04d}" + "r" * 1020: img for k in range(65)}  # 65 x 1,024 bytes: over 65,536 together
    refused(server, {"state": " ".join(many), "assets": many, "questions": NOUL}, "asset_references_too_long", 65_536)
    refused(server, {"state": "<a>", "assets": {"<a>": {"type": "video", "data_base64": "AAAA"}}, "questions": NOUL},
            "asset_malformed")
    refused(server, {"state": "<a>", "assets": {"<a>": {"type": "image", "data_base64": "!!"}}, "questions": NOUL},
            "image_malformed")
    gif = base64.b64encode(encoded(Image.new("RGB", (8, 8)), "GIF")).decode()
    refused(server, {"state": "<a>", "assets": {"<a>": {"type": "image", "data_base64": gif}}, "questions": NOUL},
            "image_format_unsupported")
    refused(server, {"state": "<a>", "assets": {"<a>": {"type": "image", "data_base64": base64.b64encode(
        animated("PNG")).decode()}}, "questions": NOUL}, "image_animated")
    noisy = {"type": "image", "data_base64": png_b64(sample_image(60, 60, 38))}  # over the tight 3,000 bytes
    refused(server, {"state": "<a>", "assets": {"<a>": noisy}, "questions": NOUL}, "image_too_large",
            TIGHT_LIMITS["image_max_bytes"], model="tight")
    assert answered(server, {"state": "<a>", "assets": {"<a>": img}, "questions": NOUL})["n"]["type"] == "noul"


def test_multipart_asset_reasons(server: Server) -> None:
    png = encoded(sample_image(32, 32, 39))

    def multipart(request: dict[str, Any], parts: dict[str, bytes]) -> Any:
        files = [("request", (None, json.dumps({"model": "vision", **request}).encode(), "application/json")),
                 *((name, (f"{name}.png", data, "image/png")) for name, data in parts.items())]
        return server.client.post("/v1/decisions", files=files)

    part = {"type": "image", "part": "p1"}
    r = multipart({"state": "<a>", "assets": {"<a>": {"type": "image", "part": "p2"}}, "questions": NOUL},
                  {"p1": png})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "asset_part_missing", r.text
    r = multipart({"state": "<a> <b>", "assets": {"<a>": part, "<b>": part}, "questions": NOUL}, {"p1": png})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "asset_part_reused", r.text
    r = multipart({"state": "<a>", "assets": {"<a>": part}, "questions": NOUL}, {"p1": png[:100]})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "image_malformed", r.text
    r = multipart({"state": "<a>", "assets": {"<a>": part}, "questions": NOUL}, {"p1": png})
    assert r.status_code == 200 and r.json()["answers"]["n"]["type"] == "noul", r.text


# ---- image placements: the card reads images in the state only ---------------------------------


def test_image_placements_refuse_images_in_questions_and_options(server: Server) -> None:
    listed = {m["id"]: m for m in server.client.get("/v1/models").json()["data"]}
    assert listed["vision"]["image_placements"] == ["state"]
    img = {"type": "image", "data_base64": png_b64(sample_image(32, 48, 40))}
    got = answered(server, {"state": "A shop. <shared>", "assets": {"<shared>": img, "<own>": img, "<opt>": img},
                            "questions": {
        "n": BODY_QUESTIONS["busy"],
        "in_instructions": {"type": "noul", "instructions": "Does <own> show a receipt?"},
        "in_options": {"type": "choice", "instructions": "Which picture is the receipt?",
                       "criteria": {"this": "<opt>", "none": "neither"}},
        "about_state": {"type": "noul", "instructions": "Does <shared> show a receipt?"}}})
    assert got["in_instructions"]["reason"] == "question_images_unsupported"
    assert got["in_options"]["reason"] == "question_images_unsupported"
    assert got["about_state"]["reason"] == "question_images_unsupported"  # a use in a question is that question's
    assert got["n"]["type"] == "noul"  # the others are answered, as if the refused ones were not asked
    alone = answered(server, {"state": "A shop. <shared>", "assets": {"<shared>": img}, "questions": NOUL})
    assert alone["n"] == got["n"]


# ---- Box and track -------------------------------------------------------------------------------


def test_box_reasons(server: Server) -> None:
    url = png_url(sample_image(40, 40, 41))
    box = {"type": "box", "instructions": "the receipt"}
    got = answered(server, {"state": "s", "questions": {"b": box, "t": {"type": "track", "instructions": "it"},
                                                        **NOUL}})
    assert got["b"]["reason"] == got["t"]["reason"] == "box_needs_image" and got["n"]["type"] == "noul"
    got = answered(server, {"state": "s", "images": [url, url], "questions": {"b": box, **NOUL}})
    assert got["b"]["reason"] == "box_target_ambiguous"
    img = {"type": "image", "data_base64": png_b64(sample_image(40, 40, 42))}
    got = answered(server, {"state": {"a": "<a>", "b": "<b>"}, "assets": {"<a>": img, "<b>": img, "<c>": img},
                            "questions": {"both": {"type": "box", "instructions": "<a> or <b>"},
                                          "outside": {"type": "box", "instructions": "in <c>"},
                                          "one": {"type": "box", "instructions": "the corner of <b>"}}})
    assert got["both"]["reason"] == "box_target_ambiguous"
    assert got["outside"]["reason"] == "question_images_unsupported"  # its image is not in the state
    assert got["one"]["type"] == "box"
    # box_video_too_long: past box_video_max_seconds (3 s), or a clip whose container states no length
    longer = video_url(encode_video("mp4", 4.0, 10, (64, 48)))
    pipe = Pipe()
    write_clip(pipe, "webm", "libvpx", list(range(20)))
    live = video_url(bytes(pipe.data), "video/webm")
    for clip in (longer, live):
        got = answered(server, {"state": "s", "videos": [clip], "questions": {
            "t": {"type": "track", "instructions": "it"}, "b": {**box, "at": 0.5}, **NOUL}})
        assert got["t"]["reason"] == got["b"]["reason"] == "box_video_too_long" and got["n"]["type"] == "noul"
    # a card whose question_types do not list them (a small image: the tight card's byte limit)
    small = image_url(Image.new("RGB", (40, 40), (200, 20, 20)))
    got = answered(server, {"state": "s", "images": [small], "questions": {
        "b": box, "t": {"type": "track", "instructions": "it"}, **NOUL}}, "tight")
    assert (got["b"]["reason"], got["t"]["reason"]) == ("box_unsupported", "track_unsupported")


def test_request_tokens_and_batch_entries(server: Server, card: dict[str, Any]) -> None:
    many = {f"q{i}": {"type": "noul", "instructions": f"Is {i} so?"} for i in range(60)}
    refused(server, {"state": "s", "questions": many}, "request_tokens",
            card["limits"]["max_request_tokens"])
    r = server.client.post("/v1/decisions", json={"model": "vision", "states": {
        "bad": {"state": "s", "images": [image_url(Image.new("L", (1, 20_000)))], "questions": NOUL},
        "good": {"state": "s", "images": [png_url(sample_image(40, 40, 43))], "questions": NOUL}}})
    assert r.status_code == 200, r.text
    states = r.json()["states"]
    assert (states["bad"]["answers"]["n"]["error"], states["bad"]["answers"]["n"]["reason"]) == (
        "invalid_input", "input_malformed")
    assert states["good"]["answers"]["n"]["type"] == "noul"
    # a batch every entry of which is refused is answered with the first refusal
    r = server.client.post("/v1/decisions", json={"model": "vision", "states": {
        "a": {"state": "s", "videos": [video_url(random.Random(1).randbytes(64))], "questions": NOUL},
        "b": {"state": "s", "images": [image_url(Image.new("L", (1, 20_000)))], "questions": NOUL}}})
    assert r.status_code == 400 and r.json()["error"]["reason"] == "video_format_unsupported", r.text


def test_media_sent_to_a_model_without_the_modality(server: Server) -> None:
    url = png_url(sample_image(40, 40, 44))
    refused(server, {"state": "s", "images": [url], "questions": NOUL}, "image_unsupported", model="blind")
    img = {"type": "image", "data_base64": png_b64(sample_image(40, 40, 45))}
    refused(server, {"state": "<a>", "assets": {"<a>": img}, "questions": NOUL}, "image_unsupported", model="blind")
    clip = video_url(encode_video("mp4", 1.0, 10, (40, 40)))
    refused(server, {"state": "s", "videos": [clip], "questions": NOUL}, "video_unsupported", model="blind")
    assert answered(server, {"state": "s", "questions": NOUL}, "blind")["n"]["type"] == "noul"


def test_a_card_placing_images_in_questions_is_not_served(card: dict[str, Any], tmp_path: Path) -> None:
    """The family reads images in the state only: a card that promises more fails to load, rather than
    answering the questions it promised to read with question_images_unsupported."""
    from edge_runtime.families.decision_vision.family import DecisionVisionFamily
    from edge_runtime.families.registry import read_package

    promised = copy_with_card(card["path"], tmp_path / "promised", image_placements=["state", "instructions"])
    with pytest.raises(ValueError, match="image_placements"):
        DecisionVisionFamily(read_package(promised))
    assert DecisionVisionFamily(read_package(card["path"])).describe()["image_placements"] == ["state"]


# ---- hostile media in bounded memory ---------------------------------------------------------


def _memory_kib(pid: int) -> dict[str, int]:
    """The process's resident set now (VmRSS) and its peak since the last reset (VmHWM), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        fields = dict(line.split(":", 1) for line in status)
    return {key: int(fields[key].split()[0]) for key in ("VmRSS", "VmHWM")}


def _reset_peak(pid: int) -> None:
    """Make VmHWM start again from the current VmRSS (Linux: ``5`` in clear_refs)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


def test_hostile_media_are_refused_in_bounded_memory(server: Server) -> None:
    """Every hostile input, twice over, moves the server's peak resident memory by a few MiB.

    Measured (2026-12-04, the fixture package): peak +2.0 MiB over the baseline, +0.1 MiB from the
    first round to the second; the slowest refusal (the WebP bomb) 33 ms. The bound, 16 MiB, is 8x
    that and still below every claim: the bombs claim 2 * 10^7, 2.7 * 10^8 and 10^10 pixels (19 MiB,
    256 MiB and 9.3 GiB as 8-bit grey, three times that in RGB) and the MP4 ten hours (360,000 frames
    of 64 x 48, 3.1 GiB in RGB), so decoding any claim would break it, most by orders of magnitude.
    Normal image and video requests go first, so that the decoders' own code and buffers are in the
    baseline; refusal times are printed, not asserted (they depend on the machine's load).
    """
    import time

    pid = server.proc.pid
    still_serving(server)
    answered(server, {"state": "s", "videos": [video_url(encode_video("mp4", 1.0, 10, (64, 48)))], "questions": NOUL})
    bodies = {case: {"state": "s", member: [make()], "questions": NOUL}
              for case, (make, member, _, _) in HOSTILE.items()}
    baseline = _memory_kib(pid)["VmRSS"]
    _reset_peak(pid)
    seconds: dict[str, float] = {}
    after_round = []
    for _ in range(2):
        for case, body in bodies.items():
            started = time.perf_counter()
            assert post(server, body).status_code == 400, case
            seconds[case] = max(seconds.get(case, 0.0), time.perf_counter() - started)
        after_round.append(_memory_kib(pid)["VmRSS"])
    still_serving(server)
    peak = _memory_kib(pid)["VmHWM"]
    print(f"\nbaseline {baseline} KiB, peak +{peak - baseline} KiB, after each round "
          f"{[rss - baseline for rss in after_round]} KiB; slowest refusals (s): "
          + ", ".join(f"{case} {s:.3f}" for case, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:4]))
    assert peak - baseline < 16 * 1024, (baseline, peak)
    assert after_round[1] - after_round[0] < 8 * 1024, after_round  # a second round leaks nothing of note


# ---- System One: a question with an image this card does not place there fails the request -------------


def test_systemone_question_images_unsupported_fails_the_request(server: Server) -> None:
    """Under vllm-sr/5.0 (the process's schema here) a question whose instructions or options reference
    an image, on a card that places images in the state only, fails the whole request: 422
    question_failed, invalid_question, the first such question named and every one listed in
    ``detail``; a /v1/systemone/batch request fails alone, as it would alone; in a batch under
    ``states`` the failing entry is named."""
    img = {"type": "image", "data_base64": png_b64(sample_image(32, 48, 46))}
    body = {"model": "vision", "state": "A shop. <shared>", "assets": {"<shared>": img, "<own>": img, "<opt>": img},
            "questions": {
                "n": BODY_QUESTIONS["busy"],
                "in_instructions": {"type": "noul", "instructions": "Does <own> show a receipt?"},
                "in_options": {"type": "choice", "instructions": "Which picture is the receipt?",
                               "criteria": {"this": "<opt>", "none": "neither"}}}}
    r = server.client.post("/v1/systemone", json=body)
    assert r.status_code == 422, r.text
    alone = r.json()
    validate_response("/v1/systemone", "post", 422, alone)
    assert {k: alone[k] for k in ("code", "question_error", "reason", "question")} == {
        "code": "question_failed", "question_error": "invalid_question", "reason": "question_images_unsupported",
        "question": "in_instructions"}
    assert [(issue["loc"], issue["type"]) for issue in alone["detail"]] == [
        (["body", "questions", "in_instructions", "noul"], "question_images_unsupported"),
        (["body", "questions", "in_options", "choice"], "question_images_unsupported")]
    assert "image_placements: state" in alone["detail"][0]["msg"]
    assert "error" not in alone  # the 4.0 form's wrapper is not in the 5.0 answer
    # an image in an option alone is refused just the same
    options_only = {**body, "assets": {"<shared>": img, "<opt>": img},
                    "questions": {k: q for k, q in body["questions"].items() if k != "in_instructions"}}
    r = server.client.post("/v1/systemone", json=options_only)
    assert r.status_code == 422 and (r.json()["question"], r.json()["reason"]) == (
        "in_options", "question_images_unsupported"), r.text
    # the same request without the image in its questions is answered
    fine = {**body, "assets": {"<shared>": img}, "questions": {"n": BODY_QUESTIONS["busy"]}}
    r = server.client.post("/v1/systemone", json=fine)
    assert r.status_code == 200 and r.json()["answers"]["n"]["type"] == "noul", r.text

    r = server.client.post("/v1/systemone/batch", json={"requests": {"bad": body, "good": fine}})
    assert r.status_code == 200, r.text
    validate_response("/v1/systemone/batch", "post", 200, r.json())
    responses = r.json()["responses"]
    assert responses["bad"] == {**alone, "status": 422}
    assert responses["good"]["answers"]["n"]["type"] == "noul"

    batch = {"model": "vision", "assets": {"<own>": img}, "states": {
        "plain": {"state": "A shop.", "questions": {"n": BODY_QUESTIONS["busy"]}},
        "asks": {"state": "A shop.", "questions": {
            "look": {"type": "noul", "instructions": "Does <own> show a receipt?"}}}}}
    r = server.client.post("/v1/systemone", json=batch)
    assert r.status_code == 422, r.text
    validate_response("/v1/systemone", "post", 422, r.json())
    assert {k: r.json()[k] for k in ("code", "question_error", "reason", "question", "state")} == {
        "code": "question_failed", "question_error": "invalid_question", "reason": "question_images_unsupported",
        "question": "look", "state": "asks"}
