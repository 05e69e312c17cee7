"""decision3 with images and videos: the upstream vision fixture converted (vision.onnx beside the text core).
The image and video paths' parity with Transformers 5's Qwen3_5Model is checked in tests/test_decision3.py, on
the package that test converts against the reference."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from converters.decision3.convert import Decision3Options, export_decision3
from converters.decision3.fixture import write_source_fixture
from converters.decision3.vision import GOLDEN_QUESTIONS, GOLDEN_STATE, data_url, golden_image
from edge_runtime.engine import create_session
from edge_runtime.engine.causal import causal_row
from edge_runtime.families.decision3 import video as vid
from edge_runtime.families.decision3.family import Decision3Family
from edge_runtime.families.decision3.prompt import PromptTokens
from edge_runtime.families.decision3.vision import ImageBranchRow, ImageForward, ImageRow
from edge_runtime.families.registry import read_package
from edge_runtime.questions import Question, answer, parse_question
from edge_runtime.requests.decisions import parse_decisions_request
from tests.support.d3_models import QUESTIONS
from tests.support.media_reasons import (  # decision-vision's media reason helpers: the same intake
    HOSTILE,
    NOUL,
    answered,
    copy_with_card,
    image_url,
    refused,
    still_serving,
    video_url,
)
from tests.support.media_reasons import data_url as media_url
from tests.support.media_samples import encode_video
from tests.support.server_harness import Server, write_models_file
from tests.support.vision import png_b64, sample_image

GOLDEN_URL = data_url(golden_image())


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The upstream vision fixture (causal, so its image rows can run state-once) and its conversion (no
    Transformers run here)."""
    root = tmp_path_factory.mktemp("d3vision")
    source = write_source_fixture(root / "source", "vision", seed=3, attention_mode="causal")
    result = export_decision3(source, root / "package", Decision3Options(
        name="d3-vision-fixture", version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
        description="tiny Decision 3.0 vision fixture", source_name="fixture", reference=False, check_requests=2))
    yield {"source": source, "package": result.path}


def test_vision_tower_is_converted(converted: dict[str, Path]) -> None:
    package = read_package(converted["package"])
    card, config = package.card.raw, package.decision_config()
    assert config is not None
    vision = config["vision"]
    assert (package.path / "vision.onnx").is_file() and card["graph"]["vision"]["file"] == "vision.onnx"
    assert vision["inputs"] == ["patches", "pos_idx", "pos_w", "rowcol"] and vision["outputs"] == ["image_embeds"]
    assert vision["position_side"] == 4 and vision["patch_dim"] == 3 * 2 * 16 * 16
    assert vision["processor"]["min_pixels"] == 65_536 and vision["processor"]["max_pixels"] == 1_638_400
    assert card["upstream"]["vision_tower"].startswith("converted") and card["modalities"] == ["text", "image", "video"]
    assert card["limits"]["image_max_bytes"] == 8_000_000 and card["limits"]["image_max_pixels"] == 1_638_400
    assert (package.path / "vision_check.npz").is_file()
    images = card["verification"]["images"]
    assert images["cases"] == 4 and images["video_cases"] == 1 and "not verified" in images["reference"]
    # videos: the source's video_preprocessor_config.json and the d3 runtime's per-frame budget and frames
    assert vision["video"] == {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "shortest_edge": 4096,
                               "max_pixels": 196_608, "max_frames": 64}
    assert card["limits"]["video_max_bytes"] == 32_000_000 and card["limits"]["video_max_frames"] == 64
    assert card["limits"]["video_max_pixels"] == 196_608 and card["limits"]["video_max_tokens"] == 32 * 192
    # the golden 64x48 image resizes to 224x320 (the runtime's minimum pixels), a 14x20 patch grid
    assert [1, 14, 20] in images["grids"]


# ---- the family in process ------------------------------------------------------------------------


def _family(path: Path) -> Decision3Family:
    package = read_package(path)
    return Decision3Family(package, create_session(package.graph("fp32"), "cpu", 1))


def _alone(family: Decision3Family, state: Any, images: list[str], questions: dict[str, Any]) -> dict[str, Any]:
    """Each question's answer from its whole prompt (images expanded) run alone at batch 1."""
    patches = family._images(parse_decisions_request({"model": "m", "state": state, "images": images,
                                                      "questions": questions}).entries()[0][1], [])
    m = family.processor.s.merge_size
    tokens = [(p.grid_h // m) * (p.grid_w // m) for p in patches]
    out = {}
    for qid, raw in questions.items():
        q = parse_question(qid, raw)
        assert isinstance(q, Question)
        got = family.prompt.tokens(state, q, family.max_input_tokens, tokens)
        assert isinstance(got, PromptTokens)
        hidden = family.forward([ImageRow(got.ids, tuple(patches))])[0]
        out[qid] = answer(q, family.probabilities(hidden, len(q.options)))
    return out


def _close(a: dict[str, Any], b: dict[str, Any], tol: float) -> None:
    assert a.keys() == b.keys()
    for qid in a:
        for key in ("probabilities", "noul"):
            if key in a[qid]:
                x, y = a[qid][key], b[qid][key]
                diff = max(abs(x[k] - y[k]) for k in x) if isinstance(x, dict) else abs(x - y)
                assert diff <= tol, (qid, diff)


def test_image_rows_state_once_and_batched(converted: dict[str, Path]) -> None:
    family = _family(converted["package"])
    assert isinstance(family.forward, ImageForward) and family.modalities == {"text", "image", "video"}
    questions = {**GOLDEN_QUESTIONS, **QUESTIONS}
    request = parse_decisions_request({"model": "m", "state": GOLDEN_STATE, "images": [GOLDEN_URL],
                                       "questions": questions})
    plan = family.plan_request(request)
    # causal: the image sits in the shared prefix, run once; each question continues from its states
    assert len(plan.rows) == 1 and isinstance(plan.rows[0], ImageBranchRow)
    row = plan.rows[0]
    assert len(row.branches) == len(questions) and row.prefix.ids.count(family.image_id) == 1
    # the golden 64x48 image is 70 tokens (a 14x20 patch grid, merged 2x2): usage counts them
    assert plan.input_tokens == len(row.prefix.ids) + 69 + sum(len(b) for b in row.branches)
    assert family.forward.length(row) == plan.input_tokens
    got = family.finish(plan, family.forward(plan.rows))["answers"]
    assert got.keys() == questions.keys() and got["image_colour"]["type"] == "choice"
    alone = _alone(family, GOLDEN_STATE, [GOLDEN_URL], questions)
    _close(got, alone, 1e-5)  # state-once vs whole rows: the text path's tolerance
    # whole image rows batched with a text row and another image's row: each exactly as alone
    q = parse_question("r", QUESTIONS["reasoning"])
    assert isinstance(q, Question)
    patches = family._images(request.entries()[0][1], [])
    other = [family.processor.image(sample_image(90, 50, 3), family.image_max_pixels)]
    tokens = [family.prompt.tokens(s, q, 4096, [70] if s == "a" else [10]) for s in ("a", "b")]
    assert all(isinstance(t, PromptTokens) for t in tokens)
    rows: list[Any] = [ImageRow(tokens[0].ids, tuple(patches)),  # type: ignore[union-attr]
                       causal_row(family.prompt.tokens("text only", q, 4096).ids),  # type: ignore[union-attr]
                       ImageRow(tokens[1].ids, tuple(other))]  # type: ignore[union-attr]
    batched = family.forward(rows)
    for r, h in zip(rows, batched):
        assert np.array_equal(family.forward([r])[0], h)


def test_media_refusals_in_planning(converted: dict[str, Path]) -> None:
    family = _family(converted["package"])
    # a literal placeholder in the state of a request with images fails its questions in place
    plan = family.plan_request(parse_decisions_request({
        "model": "m", "state": "see <|image_pad|>", "images": [GOLDEN_URL], "questions": GOLDEN_QUESTIONS}))
    body = family.finish(plan, [])
    assert {a["reason"] for a in body["answers"].values()} == {"question_malformed"}
    # the image's tokens count against max_input_tokens
    small = Decision3Family(read_package(converted["package"]), max_input_tokens=250)  # text 218, image +69
    plan = small.plan_request(parse_decisions_request({
        "model": "m", "state": GOLDEN_STATE, "images": [GOLDEN_URL], "questions": {"q": QUESTIONS["reasoning"]}}))
    assert small.finish(plan, [])["answers"]["q"]["error"] == "max_length_exceeded"
    text_only = small.plan_request(parse_decisions_request({
        "model": "m", "state": GOLDEN_STATE, "questions": {"q": QUESTIONS["reasoning"]}}))
    assert len(text_only.rows) == 1


# ---- over HTTP ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def d3_server(converted: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``vision`` as converted (the name decision-vision's reason helpers post to), ``tight`` with small limits."""
    root = tmp_path_factory.mktemp("d3-vision-server")
    tight = copy_with_card(converted["package"], root / "tight", name="tight", limits=TIGHT_IMAGE_LIMITS,
                            modalities=["text", "image"])  # and no videos
    vtight = copy_with_card(converted["package"], root / "vtight", name="vtight", limits={"video_max_tokens": 40})
    models = write_models_file(root / "models.yaml", [
        {"name": name, "package": str(path), "device": "cpu", "threads": 1}
        for name, path in (("vision", converted["package"]), ("tight", tight), ("vtight", vtight))])
    srv = Server(models)
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()


TIGHT_IMAGE_LIMITS = {"image_max_bytes": 3000, "image_source_max_pixels": 100 * 100}


def test_image_request_answered_over_http(d3_server: Server, converted: dict[str, Path]) -> None:
    models = {m["id"]: m for m in d3_server.client.get("/v1/models").json()["data"]}
    assert models["vision"]["status"] == "ready"  # the load-time self-check ran the image golden cases
    got = answered(d3_server, {"state": GOLDEN_STATE, "images": [GOLDEN_URL], "questions": GOLDEN_QUESTIONS})
    _close(got, _alone(_family(converted["package"]), GOLDEN_STATE, [GOLDEN_URL], GOLDEN_QUESTIONS), 1e-5)
    # an asset used in the state is that image, named [image 1]; used in a question, that question is refused
    img = {"type": "image", "data_base64": GOLDEN_URL.split(",", 1)[1]}
    with_asset = answered(d3_server, {"state": "Describe <a>.", "assets": {"<a>": img}, "questions": {
        **GOLDEN_QUESTIONS, "asks": {"type": "noul", "instructions": "Is <a> a photograph?"}}})
    assert with_asset["asks"]["reason"] == "question_images_unsupported"
    assert with_asset["image_colour"]["type"] == "choice"
    same = answered(d3_server, {"state": "Describe [image 1].", "images": [GOLDEN_URL], "questions": GOLDEN_QUESTIONS})
    assert same["image_colour"] == with_asset["image_colour"]
    # a batch answers each state as alone
    states = {"a": {"state": GOLDEN_STATE, "images": [GOLDEN_URL], "questions": GOLDEN_QUESTIONS},
              "b": {"state": "text", "questions": {"r": QUESTIONS["reasoning"]}}}
    r = d3_server.client.post("/v1/decisions", json={"model": "vision", "states": states})
    assert r.status_code == 200, r.text
    for name, entry in states.items():
        assert r.json()["states"][name]["answers"] == answered(d3_server, entry)


@pytest.mark.parametrize("case", sorted(k for k, v in HOSTILE.items() if v[1] == "images"))
def test_image_intake_refusals(d3_server: Server, case: str) -> None:
    make, member, reason, limit = HOSTILE[case]
    refused(d3_server, {"state": "s", member: [make()], "questions": NOUL}, reason, limit)
    still_serving(d3_server)


def test_image_limits_videos_and_assets(d3_server: Server) -> None:
    noisy = image_url(sample_image(60, 60, 35))  # noisy pixels: PNG keeps them, > 3,000 bytes
    refused(d3_server, {"state": "s", "images": [noisy], "questions": NOUL}, "image_too_large",
            TIGHT_IMAGE_LIMITS["image_max_bytes"], model="tight")
    flat = image_url(Image.new("RGB", (120, 100), (9, 99, 199)))
    refused(d3_server, {"state": "s", "images": [flat], "questions": NOUL}, "image_too_large",
            TIGHT_IMAGE_LIMITS["image_source_max_pixels"], model="tight")
    for bad in ("data:image/png;base64,!!!!", media_url("image/png", b"not an image at all")):
        refused(d3_server, {"state": "s", "images": [bad], "questions": NOUL}, "image_malformed")
    refused(d3_server, {"state": "s", "images": ["https://example.com/cat.png"], "questions": NOUL},
            "image_url_unsupported")
    refused(d3_server, {"state": "s", "videos": ["data:video/mp4;base64,AAAA"], "questions": NOUL},
            "video_unsupported", model="tight")
    img = {"type": "image", "data_base64": png_b64(sample_image(32, 32, 37))}
    refused(d3_server, {"state": "no reference here", "assets": {"<a>": img}, "questions": NOUL},
            "asset_unreferenced")
    refused(d3_server, {"state": "<a>", "assets": {"<a>": {"type": "image", "data_base64": "!!"}},
                        "questions": NOUL}, "image_malformed")
    still_serving(d3_server)


# ---- videos --------------------------------------------------------------------------------------

#: 12 frames at 8 fps, 96x64, frame k a flat grey of level 8k
CLIP = video_url(encode_video("mp4", 1.5, 8, (96, 64)))


@pytest.mark.parametrize("total,fps,expected", [(48, 24.0, [0, 16, 31, 47]), (3, 30.0, [0, 1, 2]),
                                                (61, 30.0, [0, 20, 40, 60]), (12, 8.0, [0, 4, 7, 11])])
def test_frames_are_sampled_as_the_d3_runtime_samples_them(total: int, fps: float, expected: list[int]) -> None:
    assert vid.sample_indices(total, fps) == expected


def test_video_frame_sizes_and_tokens(converted: dict[str, Path]) -> None:
    settings = _family(converted["package"]).video_settings
    many = vid.sample_indices(3000, 30.0, settings.max_frames)
    assert len(many) == settings.max_frames == 64 and (many[0], many[-1]) == (0, 2999)
    # the d3 runtime's facts: each frame within the per-frame budget, sizes multiples of 32
    assert vid.frame_size(settings, 4, 1080, 1920) == (320, 576)
    assert vid.frame_size(settings, 32, 64, 48) == (64, 64)
    assert vid.input_tokens(settings, 4, 1080, 1920) == 2 * (320 // 32) * (576 // 32)
    # a pair's time is the mean of its frames' index / fps; an odd last frame stands for both of its pair
    assert vid.timestamps([0, 4, 7, 11], 8.0, 2) == [0.25, 1.125]
    assert vid.timestamps([0, 1, 2], 30.0, 2) == [1 / 60, 2 / 30]


def test_video_expansion_and_rows(converted: dict[str, Path]) -> None:
    family = _family(converted["package"])
    decoded = vid.decode(CLIP, family.video_limits, family.video_settings)
    assert (decoded.indices, decoded.total, decoded.fps, decoded.size) == ((0, 4, 7, 11), 12, 8.0, (64, 96))
    clip = vid.pairs(family.processor, decoded)
    expansion = vid.expansion_ids(family._encode_text, clip, family.vision_start, family.video_id, family.vision_end,
                                  2)
    text = family.prompt.tokenizer.decode(expansion, skip_special_tokens=False)
    assert text.startswith("<0.2 seconds><|vision_start|><|video_pad|>") and "<1.1 seconds><|vision_start|>" in text
    assert expansion.count(family.video_id) == 2 * (64 // 32) * (96 // 32)
    # one question: its row is the prompt with the video placeholder's pad replaced by the expansion
    q = {"r": QUESTIONS["reasoning"]}
    plan = family.plan_request(parse_decisions_request({"model": "m", "state": "What happens?", "videos": [CLIP],
                                                        "questions": q}))
    text_plan = family.plan_request(parse_decisions_request({"model": "m", "state": "What happens?",
                                                             "questions": q}))
    # the template's own vision start and end around the video, plus the expansion
    assert plan.input_tokens - text_plan.input_tokens == len(expansion) + 2
    (row,) = plan.rows
    assert isinstance(row, ImageRow) and len(row.pairs) == 2 and family.forward.length(row) == plan.input_tokens
    # frames differ, so do the pairs' vision rows: the answer reads them
    got = family.finish(plan, family.forward(plan.rows))["answers"]["r"]
    assert got != family.finish(text_plan, family.forward(text_plan.rows))["answers"]["r"]


def test_video_request_answered_over_http(d3_server: Server, converted: dict[str, Path]) -> None:
    family = _family(converted["package"])
    clip = vid.pairs(family.processor, vid.decode(CLIP, family.video_limits, family.video_settings))
    expansion = vid.expansion_ids(family._encode_text, clip, family.vision_start, family.video_id, family.vision_end,
                                  2)

    def usage(body: dict[str, Any]) -> int:
        r = d3_server.client.post("/v1/decisions", json={"model": "vision", **body})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["input_tokens"])

    one = {"state": "What happens?", "questions": {"r": QUESTIONS["reasoning"]}}
    assert usage({**one, "videos": [CLIP]}) - usage(one) == len(expansion) + 2
    # a batch answers each state as alone: a video, an image and a video, text; and state-once as whole rows
    states = {"v": {"state": "What happens?", "videos": [CLIP], "questions": QUESTIONS},
              "iv": {"state": "Compare.", "images": [GOLDEN_URL], "videos": [CLIP], "questions": GOLDEN_QUESTIONS},
              "t": {"state": "text", "questions": {"r": QUESTIONS["reasoning"]}}}
    r = d3_server.client.post("/v1/decisions", json={"model": "vision", "states": states})
    assert r.status_code == 200, r.text
    for name, entry in states.items():
        assert r.json()["states"][name]["answers"] == answered(d3_server, entry)
    whole = {qid: answered(d3_server, {**states["v"], "questions": {qid: raw}})[qid]
             for qid, raw in QUESTIONS.items()}
    _close(answered(d3_server, states["v"]), whole, 1e-5)  # state-once vs whole rows: the text path's tolerance


@pytest.mark.parametrize("case", sorted(k for k, v in HOSTILE.items() if v[1] == "videos"))
def test_video_intake_refusals(d3_server: Server, case: str) -> None:
    make, member, reason, limit = HOSTILE[case]
    refused(d3_server, {"state": "s", member: [make()], "questions": NOUL}, reason, limit)
    still_serving(d3_server)


def test_video_tokens_and_placeholders(d3_server: Server) -> None:
    # the clip takes 40 tokens (2 pairs: a 12-token timestamp, the marks, 6 pads): one fits 40, two do not
    refused(d3_server, {"state": "s", "videos": [CLIP, CLIP], "questions": NOUL}, "video_tokens", 40,
            model="vtight")
    assert answered(d3_server, {"state": "s", "videos": [CLIP], "questions": NOUL}, model="vtight")
    refused(d3_server, {"state": "s", "videos": ["https://example.com/a.mp4"], "questions": NOUL},
            "video_url_unsupported")
    # a literal video placeholder in the state of a request with media fails its questions in place
    got = answered(d3_server, {"state": "see <|video_pad|>", "videos": [CLIP], "questions": NOUL})
    assert got["n"]["reason"] == "question_malformed"
    still_serving(d3_server)


#: (frames, fps) clips and (frames, height, width) sizes on which the sampler and sizes meet Transformers 5's
SAMPLING_CASES = [(48, 24.0), (3, 30.0), (61, 30.0), (12, 8.0), (3000, 30.0), (7, 3.0), (50, 25.0), (1001, 29.97)]
SIZE_CASES = [(4, 1080, 1920), (32, 64, 48), (3, 200, 330), (64, 300, 40), (4, 20, 90), (6, 2160, 3840)]
REFERENCE_SNIPPET = """
import json, sys, torch
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.video_utils import VideoMetadata
args = json.loads(sys.argv[1])
s = args["settings"]
p = Qwen3VLVideoProcessor(patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"],
                          merge_size=s["merge_size"], min_frames=4, max_frames=s["max_frames"], fps=2,
                          size={"shortest_edge": s["shortest_edge"], "longest_edge": s["max_pixels"] * s["max_frames"]})
factor = p.patch_size * p.merge_size
p.max_video_tokens = s["max_pixels"] // factor ** 2
# the size Qwen3VLVideoProcessor.resize picks (its cap and smart_resize), read where it hands it to the base
# class's pixel resize (which needs torchvision, absent here)
Qwen3VLVideoProcessor.__mro__[1].resize = lambda self, image, size, **kw: [size.height, size.width]
out = {"indices": [p.sample_frames(VideoMetadata(total_num_frames=t, fps=f)).tolist() for t, f in args["clips"]],
       "sizes": [p.resize(torch.zeros(1, t, 3, h, w, dtype=torch.uint8), size=p.size, resample=p.resample,
                          factor=factor, temporal_factor=p.temporal_patch_size, cap_pixels_per_frame=True)
                 for t, h, w in args["sizes"]],
       "times": [Qwen3VLProcessor._calculate_timestamps(None, list(i), f, 2)
                 for i, f in zip(args["indices"], [f for _, f in args["clips"]])]}
print(json.dumps(out))
"""


def test_sampling_sizes_and_timestamps_match_transformers_5(converted: dict[str, Path]) -> None:
    """Qwen3VLVideoProcessor.sample_frames (2 fps, 4 to max_frames), its resize with cap_pixels_per_frame, and
    Qwen3VLProcessor._calculate_timestamps, in the reference environment, against ours."""
    import json
    import subprocess

    from tests.support.d3_models import NO_REFERENCE, reference_environment

    python = reference_environment()
    if python is None:
        pytest.skip(NO_REFERENCE)
    settings = _family(converted["package"]).video_settings
    ours = [vid.sample_indices(t, f, settings.max_frames) for t, f in SAMPLING_CASES]
    args = {"settings": settings.card(), "clips": SAMPLING_CASES, "sizes": SIZE_CASES, "indices": ours}
    done = subprocess.run([str(python), "-c", REFERENCE_SNIPPET, json.dumps(args)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert ours == theirs["indices"]
    assert [list(vid.frame_size(settings, t, h, w)) for t, h, w in SIZE_CASES] == theirs["sizes"]
    assert [vid.timestamps(i, f, 2) for i, (_, f) in zip(ours, SAMPLING_CASES)] == theirs["times"]
