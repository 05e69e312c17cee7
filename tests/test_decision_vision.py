"""decision-vision: a tiny random Qwen3-VL through the converter, the two graphs and the family.

The numpy grid arithmetic is checked against Transformers' own functions bit for bit, the served
answers against Qwen3VLForConditionalGeneration's logits at the code tokens (images, a video,
state-once, a batch), and the refusals against their fixed reasons.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.decision_vision.export import DecisionVisionOptions, export_decision_vision
from converters.decision_vision.fixture import build_decision_vision_fixture_result, fixture_options
from converters.errors import ConversionError
from edge_runtime.errors import ApiError
from edge_runtime.families.decision_vision.family import DecisionVisionFamily
from edge_runtime.families.registry import read_package
from edge_runtime.requests.decisions import parse_decisions_request
from edge_runtime.vision_lm.grid import Block, position_taps, rope_positions, rowcol, torch_linspace
from tests.support.vision import BODY_QUESTIONS, png_b64, png_url, sample_image

PROBABILITY_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("decision-vision")
    result = build_decision_vision_fixture_result(root / "pkg", source_dir=root / "src")
    return {"result": result, "root": root}


@pytest.fixture(scope="module")
def family(built) -> DecisionVisionFamily:
    from edge_runtime.engine import create_session

    package = read_package(built["result"].path)
    return DecisionVisionFamily(package, create_session(package.graph("fp32"), "cpu", 1))


@pytest.fixture(scope="module")
def torch_vlm(built):
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    torch.set_num_threads(1)
    return Qwen3VLForConditionalGeneration.from_pretrained(built["root"] / "src", dtype=torch.float32).eval()


def family_limits(built: dict[str, Any]) -> dict[str, Any]:
    return dict(built["result"].card["limits"])


def run(family: DecisionVisionFamily, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    plan = family.plan_request(parse_decisions_request(body))
    outputs = family.forward(plan.rows) if plan.rows else []
    return plan, family.finish(plan, outputs)


# ---- converter -----------------------------------------------------------------------------


def test_card_records_parity_at_three_sizes_a_video_and_state_once(built) -> None:
    card = built["result"].card
    assert card["family"] == card["kind"] == "decision-vision" and card["usage"] == "state_once"
    v = card["verification"]
    assert v["outputs"]["last_hidden_state"] <= 1e-4 and v["outputs"]["probabilities"] <= 1e-4
    assert v["outputs"]["processor_pixels"] == 0.0 and v["outputs"]["state_once_vs_whole"] <= 1e-5
    cases = [c["case"] for c in v["per_case"]]
    assert sum(c.startswith("image") for c in cases) == 3 and sum(c.startswith("video") for c in cases) == 1
    assert len({c.split("grid ")[1] for c in cases if "grid" in c}) == 3  # three different grids
    boxed = [c for c in v["per_case"] if c["case"].startswith("box")]
    assert len(boxed) == 1 and boxed[0]["distribution"] <= 1e-5 and "box" in card["question_types"]
    package = read_package(built["result"].path)
    assert {"vision.onnx", "embeddings.npy", "model.onnx", "head.npz"} <= set(package.files)
    for key in ("image_max_bytes", "image_source_max_pixels", "image_max_pixels", "video_max_bytes",
                "video_max_seconds", "video_source_max_pixels", "video_fps", "video_max_frames", "video_max_tokens"):
        assert key in card["limits"], key
    assert card["processor"]["patch_size"] == 16 and "slow" in card["processor"]["resample"]
    assert card["graph"]["vision"]["outputs"] == ["image_embeds"]  # empty deepstack: the Qwen3.5 tower


def test_fixture_tokenizer_splits_digits_and_reads_codes_as_one_token(family) -> None:
    text = family.planner.prompt.text
    assert text.encode("1000", add_special_tokens=False).tokens == ["1", "0", "0", "0"]
    digits = [text.token_to_id(str(d)) for d in range(10)]
    assert all(text.encode(f"[{n}, ", add_special_tokens=False).ids.count(digits[n % 10]) >= 1 for n in range(10))
    for code, tid in zip(family.config["codes"], family.config["token_ids"]):
        assert text.encode(code, add_special_tokens=False).ids == [tid]


def test_conversion_refuses_models_that_do_not_fit_the_graphs(tmp_path) -> None:
    from transformers import Qwen2_5_VLConfig

    src = tmp_path / "qwen25"
    Qwen2_5_VLConfig().save_pretrained(src)  # config.json as a Qwen2.5-VL checkpoint has it
    with pytest.raises(ConversionError, match="window-attention") as refused:
        export_decision_vision(src, tmp_path / "out", DecisionVisionOptions())
    # the message names what is missing and where it is written down
    for what in ("'qwen2_5_vl'", "window permutation", "block-diagonal bias", "sectioned M-RoPE",
                 "without timestamp text", "docs/packages.md"):
        assert what in str(refused.value), what
    assert not (tmp_path / "out").exists()


def test_cli_fixture(tmp_path) -> None:
    from converters.__main__ import main

    assert main(["fixture", "--kind", "decision-vision", "--out", str(tmp_path / "pkg")]) == 0
    assert read_package(tmp_path / "pkg").card.family == "decision-vision"
    assert main(["fixture", "--kind", "decision-vision", "--out", str(tmp_path / "q"), "--quantize", "int8"]) == 2


# ---- numpy grid arithmetic against Transformers -----------------------------------------------


def test_linspace_taps_and_rotary_ids_equal_transformers(torch_vlm) -> None:
    import torch

    for n in range(1, 200):
        assert np.array_equal(torch_linspace(7, n), torch.linspace(0, 7, n).numpy()), n
    visual = torch_vlm.model.visual
    side = int(visual.config.num_position_embeddings ** 0.5)
    for gh, gw in ((2, 2), (4, 6), (10, 6), (6, 18)):
        grid = torch.tensor([[1, gh, gw]])
        with torch.no_grad():
            want = visual.fast_pos_embed_interpolate(grid).numpy()
            idx, w = position_taps(gh, gw, side, 2)
            taps = visual.pos_embed(torch.from_numpy(idx)) * torch.from_numpy(w)[:, :, None]
            got = (taps[0] + taps[1] + taps[2] + taps[3]).numpy()
            rot = visual.rot_pos_emb(grid).numpy()
            ours = (torch.from_numpy(rowcol(gh, gw, 2)).float()[:, :, None]
                    * visual.rotary_pos_emb.inv_freq[None, None, :]).flatten(1).numpy()
        assert np.array_equal(got, want) and np.array_equal(ours, rot), (gh, gw)


def test_rope_positions_equal_get_rope_index(torch_vlm) -> None:
    import torch

    cfg = torch_vlm.config
    img, vid, vs, ve = cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id
    ids = [205, 206, vs, *[img] * 6, ve, 207, vs, *[img] * 4, ve, 208, 209, vs, *[vid] * 2, ve, 210, vs, *[vid] * 2, ve,
           211, 212]  # text ids far from the special tokens
    blocks = [Block(3, np.zeros(0), 4, 6), Block(12, np.zeros(0), 4, 4), Block(20, np.zeros(0), 2, 4),
              Block(25, np.zeros(0), 2, 4)]
    want, _ = torch_vlm.model.get_rope_index(torch.tensor([ids]), torch.tensor([[1, 4, 6], [1, 4, 4]]),
                                             torch.tensor([[2, 2, 4]]))
    assert np.array_equal(rope_positions(len(ids), blocks, 2), want[:, 0].numpy())


# ---- the family against Transformers -------------------------------------------------------


def _reference(model: Any, family: DecisionVisionFamily, body: dict[str, Any], images: list[Any]) -> dict[str, Any]:
    """Each question's code probabilities from Transformers over the whole sequence (state + question)."""
    import torch
    from transformers import Qwen2VLImageProcessor

    planner = family.planner
    request = parse_decisions_request(body)
    entry = request.single
    assert entry is not None
    patches = [planner.processor.image(im, planner.image_max_pixels) for im in images]
    state, _ = planner.state_with_media(entry.state, patches, [])
    hf = Qwen2VLImageProcessor(size={"shortest_edge": planner.settings.min_pixels,
                                     "longest_edge": planner.image_max_pixels},
                               min_pixels=planner.settings.min_pixels, max_pixels=planner.image_max_pixels,
                               patch_size=16, merge_size=2, temporal_patch_size=2,
                               image_mean=[0.5] * 3, image_std=[0.5] * 3)
    media = {}
    if images:
        px = hf(images=images, return_tensors="pt")
        media = {"pixel_values": px["pixel_values"], "image_grid_thw": px["image_grid_thw"]}
    out = {}
    for q in entry.valid:
        ids = [*state, *planner.prompt.question_ids(q, None, 10_000)]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), **media).logits[0, -1].double().numpy()
        z = logits[family.config["token_ids"][: len(q.options)]]
        e = np.exp(z - z.max())
        out[q.id] = e / e.sum()
    return out


def _probabilities(answer: dict[str, Any]) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([1 - answer["noul"], answer["noul"]])
    return np.array(list(answer["probabilities"].values()))


def test_answers_equal_transformers_with_images(family, torch_vlm) -> None:
    images = [sample_image(70, 120, 1), sample_image(90, 64, 2)]
    body = {"state": "Two photos from the shop.", "images": [png_url(images[0]), png_url(images[1], "WEBP")],
            "questions": BODY_QUESTIONS}
    # WebP is lossy by default in Pillow: the reference reads the decoded image, as the server does
    from edge_runtime.media.image import ImageLimits, decode_image_url, upright_rgb

    decoded = [upright_rgb(decode_image_url(u, ImageLimits(1 << 24, 16_000_000))) for u in body["images"]]
    plan, got = run(family, body)
    want = _reference(torch_vlm, family, body, decoded)
    spread = 0.0
    for qid, p in want.items():
        assert np.max(np.abs(_probabilities(got["answers"][qid]) - p)) <= PROBABILITY_TOLERANCE, qid
        spread = max(spread, float(p.max() - p.min()))
    assert spread > 1e-3  # the fixture's answers are not uniform, so the comparison can fail
    assert len(plan.rows) == 1 and len(plan.rows[0].branches) == 3  # the state once, three branches
    state_tokens = len(plan.rows[0].prefix)
    assert got["usage"]["input_tokens"] == state_tokens + sum(len(b) for b in plan.rows[0].branches)


def test_graphs_with_external_data_serve_the_same_answers(built, family, tmp_path) -> None:
    """A 2B's text core is past protobuf's 2 GB: forced here, every graph keeps its weights in one
    ``.onnx.data`` file beside it, the package verifies and loads, and answers are bit-identical."""
    from edge_runtime.engine import create_session

    result = export_decision_vision(built["root"] / "src", tmp_path / "pkg", fixture_options(external_data_above=0))
    names = {p.name for p in result.path.iterdir()}
    assert names == {p.name for p in built["result"].path.iterdir()} | {"model.onnx.data", "vision.onnx.data"}
    package = read_package(result.path)  # every file, the data files too, checked against the manifest
    external = DecisionVisionFamily(package, create_session(package.graph("fp32"), "cpu", 1))
    body = {"state": "A photo.", "images": [png_url(sample_image(64, 96, 5))], "questions": BODY_QUESTIONS}
    assert run(external, body)[1]["answers"] == run(family, body)[1]["answers"]


def test_state_once_equals_each_question_alone(family) -> None:
    url = png_url(sample_image(64, 96, 3))
    _, together = run(family, {"state": "s", "images": [url], "questions": BODY_QUESTIONS})
    for qid, q in BODY_QUESTIONS.items():
        _, alone = run(family, {"state": "s", "images": [url], "questions": {qid: q}})
        assert np.max(np.abs(_probabilities(alone["answers"][qid]) - _probabilities(together["answers"][qid]))) <= 1e-6


def test_video_answers_equal_transformers(family, torch_vlm) -> None:
    import torch

    from edge_runtime.vision_lm.processor import VideoClip, pair_frames
    from tests.support.media_samples import encode_video

    data = encode_video("mp4", seconds=2.0, fps=10, size=(96, 64))
    body = {"state": "A clip.", "videos": ["data:video/mp4;base64," + base64.b64encode(data).decode()],
            "questions": {"busy": BODY_QUESTIONS["busy"]}}
    plan, got = run(family, body)
    planner = family.planner
    from edge_runtime.media.video import sample_frames

    frames = sample_frames(data, planner.video_limits)
    assert len(frames.images) == 4  # 2 s at 2 fps, at least 4
    clip = VideoClip(pair_frames(planner.processor, frames.images, frames.times, planner.video_max_pixels),
                     frames.seconds)
    entry = parse_decisions_request(body).single
    assert entry is not None
    state, _ = planner.state_with_media(entry.state, [], [clip])
    ids = [*state, *planner.prompt.question_ids(entry.valid[0], None, 10_000)]
    first = clip.pairs[0].patches
    pixels = torch.from_numpy(np.concatenate([p.patches.patches for p in clip.pairs]))
    grid = torch.tensor([[len(clip.pairs), first.grid_h, first.grid_w]])
    with torch.no_grad():
        out = torch_vlm(input_ids=torch.tensor([ids]), pixel_values_videos=pixels, video_grid_thw=grid)
    logits = out.logits[0, -1].double().numpy()
    z = logits[family.config["token_ids"][:2]]
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert abs(got["answers"]["busy"]["noul"] - want[1]) <= PROBABILITY_TOLERANCE
    assert "seconds>" in planner.prompt.text.decode(ids)


def test_media_refusals_fail_the_request_or_the_batch_entry(family) -> None:
    q = {"n": BODY_QUESTIONS["busy"]}
    with pytest.raises(ApiError) as e:
        run(family, {"state": "s", "images": ["data:image/png;base64,AAAA"], "questions": q})
    assert e.value.reason == "image_malformed"  # three zero bytes: no image signature at all
    with pytest.raises(ApiError) as e:
        run(family, {"state": "s", "videos": ["data:video/mp4;base64,AAAAAAAAAAAA"], "questions": q})
    assert e.value.reason == "video_format_unsupported"
    _, body = run(family, {"states": {
        "bad": {"state": "s", "images": ["data:image/png;base64,!!"], "questions": q},
        "good": {"state": "s", "images": [png_url(sample_image(40, 40, 4))], "questions": q}}})
    assert body["states"]["bad"]["answers"]["n"]["error"] == "invalid_input"
    assert body["states"]["good"]["answers"]["n"]["type"] == "noul"
    with pytest.raises(ApiError) as e:
        run(family, {"state": "s", "questions": {f"q{i}": {"type": "noul", "instructions": f"Is {i} so?"}
                                                 for i in range(60)}})
    assert e.value.reason == "request_tokens" and e.value.limit == family.max_request_tokens
    _, answered = run(family, {"state": "s", "questions": {"t": {"type": "set", "labels": [{"key": "a"}]}, **q}})
    assert answered["answers"]["t"]["reason"] == "question_type_unsupported"


def test_serving_through_the_runtime(built) -> None:
    from edge_runtime.api.schema import validate_response
    from edge_runtime.config import ModelConfig, ServeConfig
    from edge_runtime.runtime import Runtime
    from edge_runtime.service import serve
    from edge_runtime.timing import Timing

    config = ServeConfig(models_file=Path("models.yaml"), models=(
        ModelConfig(name="vision", package=built["result"].path, device="cpu", threads=1),))
    runtime = Runtime(config)
    runtime.load_all()
    try:
        assert runtime.status() == "ready", runtime.health()
        served = runtime.models["vision"]
        assert served.self_check["status"] == "passed" and served.grouping == "alone"
        assert served.self_check["graphs"]["vision"]["status"] == "passed"  # the vision core, checked at load
        info = served.info()
        assert info["family"] == "decision-vision" and "image" in info["modalities"]
        assert info["question_types"] == ["choice", "noul", "score", "box", "track"]
        from edge_runtime.api.listing import list_models

        listed = list_models(runtime)
        validate_response("/v1/models", "get", 200, listed)
        assert listed["data"][0]["limits"]["image_max_pixels"] == family_limits(built)["image_max_pixels"]
        body = {"model": "vision", "state": "Is it paid?", "images": [png_url(sample_image(50, 80, 5))],
                "questions": {"paid": BODY_QUESTIONS["busy"]}}
        got = asyncio.run(serve(runtime, "decisions", body, Timing()))
        assert got["answers"]["paid"]["type"] == "noul"
        validate_response("/v1/decisions", "post", 200, got)
        # the contract's System One media examples (images and videos; assets), in the 4.0 schema
        from edge_runtime.api.systemone import serve_systemone
        from tests.support.media_samples import encode_video

        clip = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 2.0, 10, (64, 48))).decode()
        turbo = {"model": "vision", "state": "Is the attached receipt complete, and does the clip show it being paid?",
                 "images": [png_url(sample_image(60, 40, 13), "JPEG")], "videos": [clip],
                 "questions": {"complete": {"type": "noul",
                                            "instructions": "Does the receipt show a total, a date and a merchant?"},
                               "paid": {"type": "noul", "instructions": "Does the clip show the receipt being paid?"}}}
        status, out, _ = asyncio.run(serve_systemone(runtime, turbo, Timing(), "vllm-sr/4.0", {}, False))
        assert status == 200 and set(out["answers"]) == {"complete", "paid"}, out
        validate_response("/v1/systemone", "post", 200, out)
        lite = {"model": "vision", "state": {"receipt": "<receipt>", "note": "Uploaded by the customer."},
                "assets": {"<receipt>": {"type": "image", "data_base64": png_b64(sample_image(50, 70, 14))}},
                "questions": {"complete": {"type": "noul",
                                           "instructions": "Does <receipt> show a total, a date and a merchant?"}}}
        status, out, _ = asyncio.run(serve_systemone(runtime, lite, Timing(), "vllm-sr/4.0", {}, False))
        # the question references the image, which this card places in the state only
        assert status == 422 and out["error"]["reason"] == "question_images_unsupported", out
        lite["questions"]["complete"]["instructions"] = "Does the receipt show a total, a date and a merchant?"
        status, out, _ = asyncio.run(serve_systemone(runtime, lite, Timing(), "vllm-sr/4.0", {}, False))
        assert status == 200 and out["answers"]["complete"]["type"] == "noul", out
        bad = {**turbo, "videos": ["data:video/mp4;base64,AAAA"]}
        status, out, _ = asyncio.run(serve_systemone(runtime, bad, Timing(), "vllm-sr/4.0", {}, False))
        assert status == 400 and out["error"]["reason"] == "video_format_unsupported", out
    finally:
        for model in runtime.models.values():
            if model.executor is not None:
                model.executor.close()


def test_a_tower_with_deepstack_exports_and_matches(tmp_path) -> None:
    """Qwen3-VL's own towers feed deepstack features into the first text layers: the graphs carry them."""
    result = build_decision_vision_fixture_result(tmp_path / "pkg", deepstack=[0])
    card = result.card
    assert card["graph"]["vision"]["outputs"] == ["image_embeds", "deepstack_embeds"]
    assert "deepstack_embeds" in card["graph"]["inputs"]
    assert card["verification"]["outputs"]["last_hidden_state"] <= 1e-4
    assert card["verification"]["outputs"]["state_once_vs_whole"] <= 1e-5


def test_assets_in_the_state_are_images_in_front_of_it(family) -> None:
    img = sample_image(48, 80, 6)
    q = {"n": BODY_QUESTIONS["busy"]}
    via_asset, body = run(family, {"state": {"receipt": "<r>", "note": "See <r> twice: <r>"},
                                   "assets": {"<r>": {"type": "image", "data_base64": png_b64(img)}},
                                   "questions": q})
    # three uses: three images in front of the state, the text naming them [image 1..3]
    assert len(via_asset.rows[0].blocks) == 3
    text = family.planner.prompt.text.decode(list(via_asset.rows[0].prefix))
    assert '"receipt": "[image 1]"' in text and "See [image 2] twice: [image 3]" in text
    # the same as sending the image three times under images with that text
    direct, body2 = run(family, {"state": {"receipt": "[image 1]", "note": "See [image 2] twice: [image 3]"},
                                 "images": ["data:image/png;base64," + png_b64(img)] * 3, "questions": q})
    assert body["answers"] == body2["answers"]
    assert np.array_equal(via_asset.rows[0].prefix, direct.rows[0].prefix)


def test_asset_refusals(family) -> None:
    img = {"type": "image", "data_base64": png_b64(sample_image(32, 32, 7))}
    q = {"n": BODY_QUESTIONS["busy"]}
    with pytest.raises(ApiError) as e:
        run(family, {"state": "no reference here", "assets": {"<a>": img}, "questions": q})
    assert e.value.reason == "asset_unreferenced"
    with pytest.raises(ApiError) as e:
        run(family, {"state": "x" * 1025, "assets": {"x" * 1025: img}, "questions": q})
    assert (e.value.reason, e.value.limit) == ("asset_reference_too_long", 1024)
    with pytest.raises(ApiError) as e:
        run(family, {"state": "<a>", "assets": {"<a>": {"type": "video", "data_base64": "AAAA"}}, "questions": q})
    assert e.value.reason == "asset_malformed"
    _, body = run(family, {"state": "<a>", "assets": {"<a>": img, "<b>": img}, "questions": {
        "n": BODY_QUESTIONS["busy"],
        "look": {"type": "noul", "instructions": "Does <b> show a receipt?"}}})
    assert body["answers"]["look"]["reason"] == "question_images_unsupported"
    assert body["answers"]["n"]["type"] == "noul"


def test_video_tokens_limit_and_batches_equal_entries_alone(family) -> None:
    from tests.support.media_samples import encode_video

    q = {"n": BODY_QUESTIONS["busy"]}
    long_clip = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 20.0, 2, (64, 48))).decode()
    with pytest.raises(ApiError) as e:
        run(family, {"state": "s", "videos": [long_clip], "questions": q})
    assert (e.value.reason, e.value.limit) == ("video_tokens", family.planner.video_max_tokens)
    a = {"state": "first", "images": [png_url(sample_image(40, 72, 8))], "questions": BODY_QUESTIONS}
    b = {"state": "second", "images": [png_url(sample_image(72, 40, 9))], "questions": q}
    _, batch = run(family, {"states": {"a": a, "b": b}})
    for name, entry in (("a", a), ("b", b)):
        _, alone = run(family, entry)
        assert batch["states"][name]["answers"] == alone["answers"]
        assert batch["states"][name]["usage"] == alone["usage"]
    assert batch["usage"]["input_tokens"] == sum(batch["states"][n]["usage"]["input_tokens"] for n in "ab")


def test_video_tokens_are_refused_before_decoding(family, monkeypatch) -> None:
    import edge_runtime.media.video as video
    from tests.support.media_samples import encode_video

    long_clip = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 30.0, 2, (64, 48))).decode()
    decoded: list[int] = []
    original = video.open_video

    class Spy:
        """The container, recording any decoding."""

        def __init__(self, container: Any) -> None:
            self.container = container

        def decode(self, *a: Any, **k: Any) -> Any:
            decoded.append(1)
            return self.container.decode(*a, **k)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.container, name)

    def spy(data: bytes, limits: Any) -> Any:
        container, stream, seconds, measured = original(data, limits)
        return Spy(container), stream, seconds, measured

    monkeypatch.setattr(video, "open_video", spy)
    with pytest.raises(ApiError) as e:
        run(family, {"state": "s", "videos": [long_clip], "questions": {"n": BODY_QUESTIONS["busy"]}})
    assert e.value.reason == "video_tokens" and not decoded
    short = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 2.0, 10, (64, 48))).decode()
    run(family, {"state": "s", "videos": [short], "questions": {"n": BODY_QUESTIONS["busy"]}})
    assert decoded  # the spy sees decoding when there is some


# ---- Box ---------------------------------------------------------------------------------------


def test_box_grid_is_a_distribution_over_0_to_1000() -> None:
    from edge_runtime.families.decision_vision.box_grid import digit_tree, edge_distribution, pick

    tree = digit_tree()
    assert len(tree.digits) == 101 and tree.index["100"] == 100 and tree.parents[tree.index["42"]] == tree.index["4"]
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (102, 11))
    p = edge_distribution(logits, tree)
    assert p.shape == (1001,) and abs(p.sum() - 1) < 1e-12 and (p > 0).all()

    def soft(z: np.ndarray, allowed: list[int]) -> np.ndarray:
        e = np.exp(z[allowed] - z[allowed].max())
        return dict(zip(allowed, e / e.sum()))  # type: ignore[return-value]

    every = list(range(11))
    node = {k: logits[1 + i] for k, i in tree.index.items()}
    # by hand: 1000 = "1","0","0","0" then nothing to choose; 100 ends after "100"; 42 ends after "42"
    assert p[1000] == pytest.approx(soft(logits[0], list(range(10)))[1] * soft(node["1"], every)[0]
                                    * soft(node["10"], every)[0] * soft(node["100"], [0, 10])[0], rel=1e-12)
    assert p[100] == pytest.approx(soft(logits[0], list(range(10)))[1] * soft(node["1"], every)[0]
                                   * soft(node["10"], every)[0] * soft(node["100"], [0, 10])[10], rel=1e-12)
    assert p[42] == pytest.approx(soft(logits[0], list(range(10)))[4] * soft(node["4"], every)[2]
                                  * soft(node["42"], every)[10], rel=1e-12)
    assert p[0] == pytest.approx(soft(logits[0], list(range(10)))[0], rel=1e-12)
    assert pick(p, 500) >= 500


def test_box_answers_and_transformers_brute_force(family, torch_vlm) -> None:
    """Edge 1's P(v) for a few v, each from Transformers' full forwards along its digits: independent of
    the tree, the cache and the assembly."""
    import torch
    from transformers import Qwen2VLImageProcessor

    from edge_runtime.api.schema import validate_response

    image = sample_image(80, 120, 11)
    body = {"state": "Find it.", "images": [png_url(image)],
            "questions": {"where": {"type": "box", "instructions": "the brightest corner"},
                          "busy": BODY_QUESTIONS["busy"]}}
    plan, got = run(family, body)
    ans = got["answers"]["where"]
    assert ans["type"] == "box" and 0 <= ans["confidence"] <= 1
    b = ans["box"]
    assert 0 <= b["left"] <= b["right"] <= 1 and 0 <= b["top"] <= b["bottom"] <= 1
    validate_response("/v1/decisions", "post", 200, {**got, "model": "m"})
    box = family.planner.box
    hiddens = family.forward(plan.rows)[0].trees[0]
    p = box.distribution(0, hiddens[0], 1.0)
    planner = family.planner
    entry = parse_decisions_request(body).single
    patches = planner.processor.image(image, planner.image_max_pixels)
    state, _ = planner.state_with_media(entry.state, [patches], [])
    q_ids = box.question_ids(entry.valid[0], 10_000)
    hf = Qwen2VLImageProcessor(size={"shortest_edge": planner.settings.min_pixels,
                                     "longest_edge": planner.image_max_pixels},
                               min_pixels=planner.settings.min_pixels, max_pixels=planner.image_max_pixels,
                               patch_size=16, merge_size=2, temporal_patch_size=2,
                               image_mean=[0.5] * 3, image_std=[0.5] * 3)(images=[image], return_tensors="pt")
    digit = [int(i) for i in box.digit_ids]
    sep = int(box.separator_ids[0])

    def step(path: str, allowed: list[int], pick: int) -> float:
        ids = [*state, *q_ids, *(digit[int(c)] for c in path)]
        with torch.no_grad():
            z = torch_vlm(input_ids=torch.tensor([ids]), **hf).logits[0, -1].double().numpy()
        cols = [digit[a] if a < 10 else sep for a in allowed]
        e = np.exp(z[cols] - z[cols].max())
        return float((e / e.sum())[allowed.index(pick)])

    every = list(range(11))
    for v in (0, 7, 42, 100, 1000, 345):
        text = str(v)
        want = step("", list(range(10)), int(text[0]))
        for k in range(1, len(text)):
            want *= step(text[:k], [0, 10] if text[:k] == "100" else every, int(text[k]))
        if v != 0 and (len(text) < 3 or text == "100"):
            want *= step(text, [0, 10] if text == "100" else every, 10)
        assert abs(p[v] - want) <= PROBABILITY_TOLERANCE, v
    assert family.card_box_confidence() == family.config["box"]["confidence"]


def test_box_needs_one_image(family) -> None:
    box = {"type": "box", "instructions": "the receipt"}
    _, none = run(family, {"state": "s", "questions": {"b": box, "n": BODY_QUESTIONS["busy"]}})
    assert none["answers"]["b"]["reason"] == "box_needs_image"
    url = png_url(sample_image(40, 40, 12))
    _, two = run(family, {"state": "s", "images": [url, url], "questions": {"b": box, "n": BODY_QUESTIONS["busy"]}})
    assert two["answers"]["b"]["reason"] == "box_target_ambiguous"
    _, at = run(family, {"state": "s", "images": [url],
                         "questions": {"b": {**box, "at": 1.5}, "n": BODY_QUESTIONS["busy"]}})
    assert at["answers"]["b"]["reason"] == "box_needs_image"  # `at` reads the state's only video
    _, track = run(family, {"state": "s", "images": [url], "questions": {
        "t": {"type": "track", "instructions": "the cat"}, "n": BODY_QUESTIONS["busy"]}})
    assert track["answers"]["t"]["reason"] == "box_needs_image"


def test_box_at_a_moment_and_track(family) -> None:
    from edge_runtime.api.schema import validate_response
    from tests.support.media_samples import Pipe, encode_video, write_clip

    clip = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 2.0, 10, (64, 48))).decode()
    target = "the grey square"
    body = {"state": "A clip.", "videos": [clip], "questions": {
        "at": {"type": "box", "instructions": target, "at": 1.0},
        "track": {"type": "track", "instructions": target, "rate": 1},
        "late": {"type": "box", "instructions": target, "at": 9.0}}}
    _, got = run(family, body)
    validate_response("/v1/decisions", "post", 200, {**got, "model": "m"})
    assert got["answers"]["at"]["time"] == 1.0 and got["answers"]["late"]["reason"] == "question_malformed"
    track = got["answers"]["track"]["track"]
    assert [p["time"] for p in track] == [0.0, 1.0, 2.0]
    # each moment reads exactly what a box at that moment and a Noul about it read
    at = got["answers"]["at"]
    assert track[1]["box"] == at["box"] and track[1]["confidence"] == at["confidence"]
    visible = family._visible(parse_decisions_request(body).single.valid[1], 1.0)  # type: ignore[union-attr]
    _, noul = run(family, {"state": "A clip.", "videos": [clip], "questions": {
        "v": {"type": "noul", "instructions": visible.instructions}}})
    assert abs(track[1]["visible"] - noul["answers"]["v"]["noul"]) <= 1e-6
    # box_video_max_seconds (3 s on the fixture): a longer clip, or one whose container states no length
    longer = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 4.0, 10, (64, 48))).decode()
    pipe = Pipe()
    write_clip(pipe, "webm", "libvpx", list(range(20)))
    live = "data:video/webm;base64," + base64.b64encode(bytes(pipe.data)).decode()
    for url in (longer, live):
        _, out = run(family, {"state": "s", "videos": [url], "questions": {
            "t": {"type": "track", "instructions": target}, "n": BODY_QUESTIONS["busy"]}})
        assert out["answers"]["t"]["reason"] == "box_video_too_long" and out["answers"]["n"]["type"] == "noul"
    _, none = run(family, {"state": "s", "questions": {"t": {"type": "track", "instructions": target},
                                                         "n": BODY_QUESTIONS["busy"]}})
    assert none["answers"]["t"]["reason"] == "box_needs_image"


def test_a_box_locates_the_image_its_instructions_reference(family) -> None:
    a, b = png_b64(sample_image(40, 60, 15)), png_b64(sample_image(60, 40, 16))
    assets = {"<a>": {"type": "image", "data_base64": a}, "<b>": {"type": "image", "data_base64": b}}
    plan, got = run(family, {"state": {"first": "<a>", "second": "<b>"}, "assets": assets, "questions": {
        "where": {"type": "box", "instructions": "the corner of <b>"}}})
    assert got["answers"]["where"]["type"] == "box"  # two images in the state, the reference picks one
    text = family.planner.prompt.text.decode(list(plan.rows[0].trees[0].prefix))
    assert "the corner of [image 2]" in text
    _, both = run(family, {"state": {"first": "<a>", "second": "<b>"}, "assets": assets, "questions": {
        "where": {"type": "box", "instructions": "<a> or <b>"}, "n": BODY_QUESTIONS["busy"]}})
    assert both["answers"]["where"]["reason"] == "box_target_ambiguous"
    _, outside = run(family, {"state": {"first": "<a>"}, "assets": assets, "questions": {
        "where": {"type": "box", "instructions": "the corner of <b>"}, "n": BODY_QUESTIONS["busy"]}})
    assert outside["answers"]["where"]["reason"] == "question_images_unsupported"


def test_the_vision_core_is_self_checked_when_the_graphs_open(built) -> None:
    from edge_runtime.engine import create_session
    from edge_runtime.families.base import Graph, open_graphs
    from edge_runtime.families.decision_vision.family import graphs
    from edge_runtime.packages import GoldenCase
    from edge_runtime.vision_lm.golden import VISION_GRAPH, vision_golden

    package = read_package(built["result"].path)
    text = create_session(package.graph("fp32"), "cpu", 1)
    opened, checks = open_graphs(package, graphs(package), text)
    assert set(opened) == {"vision"} and checks["vision"]["status"] == "passed"
    assert checks["vision"]["max_abs_diff"] <= 1e-3
    off = [GoldenCase(c.feeds, {k: v + 0.01 for k, v in c.outputs.items()}) for c in vision_golden(package)]
    with pytest.raises(RuntimeError, match="vision graph golden outputs differ"):
        open_graphs(package, [Graph("vision", VISION_GRAPH, lambda _: off)], text)


def test_batched_trees_read_what_each_tree_reads_alone(family) -> None:
    """A request's boxes and track moments share each step's forward; each reads what it reads alone."""
    from tests.support.media_samples import encode_video

    clip = "data:video/mp4;base64," + base64.b64encode(encode_video("mp4", 2.0, 10, (64, 48))).decode()
    plan = family.plan_request(parse_decisions_request({"state": "A clip.", "videos": [clip], "questions": {
        "track": {"type": "track", "instructions": "the grey square", "rate": 2},
        "at": {"type": "box", "instructions": "the grey square", "at": 0.5}}}))
    row = plan.rows[0]
    assert len(row.trees) == 6  # five moments (0, 0.5, ..., 2) and the box
    fwd = family.forward
    cache, _, start = fwd.prefill(row)
    together = fwd._trees(row.trees, cache, start)
    for k, tree in enumerate(row.trees):
        alone = fwd._tree(tree, cache, start)
        assert alone.shape == together[k].shape
        assert float(np.max(np.abs(alone - together[k]))) <= 1e-5, k


def test_cli_export_from_a_source_directory(built, tmp_path) -> None:
    from converters.__main__ import main

    src = built["root"] / "src"
    assert main(["export", str(src), "--kind", "decision-vision", "--out", str(tmp_path / "pkg"), "--name", "vl",
                 "--max-input-tokens", "512"]) == 0
    card = read_package(tmp_path / "pkg").card
    assert card.name == "vl" and card.limits["max_input_tokens"] == 512
    assert card.raw["verification"]["outputs"]["last_hidden_state"] <= 1e-4
    assert main(["export", str(src), "--kind", "decision-vision", "--out", str(tmp_path / "q"),
                 "--attention-mode", "causal"]) == 2
    assert not (tmp_path / "q").exists()


def test_over_http_with_json_and_multipart_bodies(built, tmp_path) -> None:
    """The real server on 127.0.0.1: an image in JSON, an asset as a multipart part, a refused image."""
    from edge_runtime.api.schema import validate_response
    from tests.support.server_harness import Server, write_models_file

    models = write_models_file(tmp_path / "models.yaml", [
        {"name": "vision", "package": str(built["result"].path), "device": "cpu", "threads": 1}])
    server = Server(models)
    try:
        server.wait()
        q = {"n": BODY_QUESTIONS["busy"]}
        r = server.client.post("/v1/decisions", json={"model": "vision", "state": "s",
                                                      "images": [png_url(sample_image(40, 56, 17))], "questions": q})
        assert r.status_code == 200, r.text
        validate_response("/v1/decisions", "post", 200, r.json())
        buf = io.BytesIO()
        sample_image(56, 40, 18).save(buf, format="PNG")
        request = {"model": "vision", "state": {"photo": "<p>"}, "assets": {"<p>": {"type": "image", "part": "p1"}},
                   "questions": q}
        r = server.client.post("/v1/decisions", files=[
            ("request", (None, json.dumps(request).encode(), "application/json")),
            ("p1", ("p.png", buf.getvalue(), "image/png"))])
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["input_tokens"] > 0
        r = server.client.post("/v1/decisions", json={"model": "vision", "state": "s",
                                                      "images": ["data:image/gif;base64,R0lGODlhAQABAAAAACw="],
                                                      "questions": q})
        assert r.status_code == 400 and r.json()["error"]["reason"] == "image_format_unsupported", r.text
        validate_response("/v1/decisions", "post", 400, r.json())
    finally:
        server.stop()
