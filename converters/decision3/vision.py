"""The vision tower of a Decision 3.0 package: its processor settings, its ONNX export, its image check.

The Qwen3.5 vision tower (``qwen3_5_vision``) is Qwen3-VL's with no deepstack: same tensor names, same forward
(Transformers 5's ``Qwen3_5VisionModel`` subclasses ``Qwen3VLVisionModel`` and only deletes the deepstack
mergers). So the tower is rebuilt here as Transformers 4's ``Qwen3VLVisionModel`` with
``deepstack_visual_indexes: []`` from the package's ``visual.`` tensors (BF16, upcast exactly) and exported by
the exporter decision-vision uses too (:func:`converters.qwen_vision.export_vision_core`: the grid-free
vision core, ``vision.onnx``).

The check (:func:`check_images`): the golden image request of §3.10 and a second image size through the
server's path (families/decision3/vision.py: decision-vision's processor, the vision core, the pads expanded
and scattered, Qwen's 3-D positions, the text core through engine/recurrent's Forward) against Transformers 5's
``Qwen3_5Model`` given the same ``pixel_values`` and ``image_grid_thw`` (its own vision tower, placeholder
scatter and ``get_rope_index``; reference.py ``--vision``), fp32: the read position's hidden state and the code
probabilities.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from converters.decision3 import source as src
from converters.errors import ConversionError
from converters.qwen_vision import export_vision_core, verify_image, vision_golden
from edge_runtime.engine.recurrent import EmbedsRow
from edge_runtime.families.decision3 import video as vid
from edge_runtime.families.decision3.prompt import IMAGE_TOKEN, D3Prompt, PromptTokens
from edge_runtime.families.decision3.vision import (
    MAX_PIXELS,
    MIN_PIXELS,
    EncodedImage,
    VisionCore,
    expand_ids,
    image_row,
)
from edge_runtime.heads.decisions import code_probabilities
from edge_runtime.questions import Question, parse_question
from edge_runtime.vision_lm.processor import ProcessorSettings

PROCESSOR_TYPES = ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast")
GOLDEN_STATE = "Describe the attached image."
GOLDEN_QUESTIONS: dict[str, Any] = {
    "image_colour": {"type": "choice", "instructions": "Which colour dominates the image?",
                     "criteria": {"red": "Red", "green": "Green", "blue": "Blue", "other": "Anything else"}},
    "image_photo": {"type": "noul", "instructions": "Is the image a photograph?"},
}


# ---- the processor ------------------------------------------------------------------------------


def processor_settings(root: Path, vision_config: Mapping[str, Any]) -> ProcessorSettings:
    """preprocessor_config.json checked as §3.8 says, as decision-vision's processor settings (min and max
    pixels are the runtime's own budget, not the config's ``size``)."""
    raw = src.read_json(root / "preprocessor_config.json")
    if not isinstance(raw, dict):
        raise ConversionError("preprocessor_config.json must be an object")
    if raw.get("image_processor_type") not in PROCESSOR_TYPES:
        raise ConversionError(f"preprocessor_config.json: image_processor_type must be one of {PROCESSOR_TYPES}")
    for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if raw.get(flag, True) is not True:
            raise ConversionError(f"preprocessor_config.json: {flag} must be true (or absent)")
    if raw.get("resample", 3) != 3 or not math.isclose(float(raw.get("rescale_factor", 1 / 255)), 1 / 255):
        raise ConversionError("preprocessor_config.json: resample must be 3 (bicubic) and rescale_factor 1/255")
    sizes = [raw.get(k) for k in ("patch_size", "temporal_patch_size", "merge_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        raise ConversionError("preprocessor_config.json: patch_size, temporal_patch_size and merge_size must be "
                              "positive integers")
    mean, std = raw.get("image_mean"), raw.get("image_std")
    if (not isinstance(mean, list) or not isinstance(std, list) or len(mean) != 3 or len(std) != 3
            or not all(isinstance(v, int | float) and math.isfinite(v) for v in mean + std) or 0 in std):
        raise ConversionError("preprocessor_config.json: image_mean and image_std must be 3 finite numbers, no "
                              "std of 0")
    if tuple(sizes) != (vision_config.get("patch_size"), vision_config.get("temporal_patch_size"),
                        vision_config.get("spatial_merge_size")):
        raise ConversionError("preprocessor_config.json and vision_config disagree on patch, temporal patch or "
                              "merge size")
    patch, temporal, merge = (int(v) for v in sizes)  # type: ignore[arg-type]  # checked ints above
    return ProcessorSettings(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                             min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                             image_mean=tuple(float(v) for v in mean), image_std=tuple(float(v) for v in std),
                             rescale_factor=1 / 255)


# ---- the tower and its export -------------------------------------------------------------------


def vision_tower(vision_config: Mapping[str, Any], weights: Mapping[str, Any]) -> Any:
    """Transformers 4's ``Qwen3VLVisionModel`` (no deepstack) in fp32 holding the package's vision tensors."""
    import torch
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    if vision_config.get("deepstack_visual_indexes"):
        raise ConversionError("a qwen3_5_vision tower has no deepstack layers; vision_config lists some")
    rope = dict(vision_config.get("rope_parameters") or {})
    if float(rope.get("rope_theta", 10000.0)) != 10000.0:
        raise ConversionError("the vision tower's rotary theta must be 10000 (Qwen3-VL's, which the export bakes)")
    keys = ("depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels", "patch_size",
            "spatial_merge_size", "temporal_patch_size", "out_hidden_size", "num_position_embeddings")
    missing = [k for k in keys if k not in vision_config]
    if missing:
        raise ConversionError(f"vision_config lacks {missing}")
    config = Qwen3VLVisionConfig(**{k: vision_config[k] for k in keys}, deepstack_visual_indexes=[])
    tower = Qwen3VLVisionModel._from_config(config, dtype=torch.float32).float().eval()
    missing_w, unexpected = tower.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    if missing_w or unexpected:
        raise ConversionError(f"the vision tensors do not match a Qwen3-VL tower: missing {sorted(missing_w)[:4]}, "
                              f"unexpected {sorted(unexpected)[:4]}")
    return tower


def export_vision(vision_config: Mapping[str, Any], weights: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """Write ``vision.onnx`` (decision-vision's grid-free vision core); returns the card's shapes."""
    tower = vision_tower(vision_config, weights)
    return export_vision_core(tower, tower.config, path)


# ---- the check ------------------------------------------------------------------------------------


def golden_image(height: int = 48, width: int = 64) -> Any:
    """§3.10's image: a pink-to-green horizontal gradient, ``width x height`` RGB."""
    from PIL import Image

    t = np.linspace(0.0, 1.0, width)[None, :, None]
    pink, green = np.array([255.0, 105.0, 180.0]), np.array([40.0, 200.0, 60.0])
    row = (1 - t) * pink + t * green
    return Image.fromarray(np.repeat(row, height, axis=0).round().astype(np.uint8), "RGB")


def data_url(image: Any) -> str:
    """The image as a PNG data URL, as a request carries it."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass(frozen=True)
class ImageCase:
    """One question with images, as the server reads it and as the reference is given it."""

    question: Question
    prompt_ids: tuple[int, ...]  # one placeholder per image, as the family plans it
    images: tuple[EncodedImage, ...]
    ids: np.ndarray           # placeholders expanded
    pixel_values: np.ndarray  # the images' patches, concatenated
    grids: np.ndarray         # [n_images, 3]
    sources: tuple[np.ndarray, ...] = ()  # the images as decoded (uint8 [h, w, 3]), for the reference's processor
    pairs: tuple[EncodedImage, ...] = ()   # a video's pairs through the vision core (the prompt ids come expanded)
    video_pixels: np.ndarray | None = None  # their patches, concatenated (``pixel_values_videos``)
    video_grids: np.ndarray | None = None   # [1, 3]: (pairs, h, w) (``video_grid_thw``)


@dataclass
class ImageVerified:
    hidden: float
    probabilities: float
    processor: float  # max |our pixel values - Transformers 5's Qwen2VLImageProcessorPil's| (grids equal)
    cases: int
    grids: list[list[int]]
    reference: bool
    golden_row: EmbedsRow  # the golden image request's first question, as the text core reads it
    golden_vision: dict[str, np.ndarray]  # the vision core's feeds and outputs on the golden image
    videos: int = 0  # of the cases, those with a video (given to Transformers as pixel_values_videos)


def image_cases(prompt: D3Prompt, core: VisionCore, image_id: int, limit: int) -> list[ImageCase]:
    """The golden image request (two questions on the 64x48 gradient) and a two-image request at other sizes."""
    requests = [(GOLDEN_STATE, [golden_image()], GOLDEN_QUESTIONS),
                ({"turns": ["compare the two pictures"]}, [verify_image(96, 160, 5), verify_image(300, 70, 9)],
                 {"which": {"type": "choice", "instructions": "Which picture is brighter?",
                            "criteria": {"first": None, "second": "the second one"}}})]
    cases = []
    for state, images, questions in requests:
        patches = [core.processor.image(im) for im in images]
        enc = [core.encode(p) for p in patches]
        for qid, raw in questions.items():
            q = parse_question(qid, raw)
            if not isinstance(q, Question):
                raise ConversionError(f"image check question {qid} is invalid")
            got = prompt.tokens(state, q, limit, [e.tokens for e in enc])
            if not isinstance(got, PromptTokens):
                raise ConversionError(f"image check question {qid} does not fit {limit} tokens: {got}")
            ids, _ = expand_ids(got.ids, image_id, [e.tokens for e in enc])
            cases.append(ImageCase(q, got.ids, tuple(enc), ids, np.concatenate([p.patches for p in patches]),
                                   np.array([[1, p.grid_h, p.grid_w] for p in patches], dtype=np.int64),
                                   tuple(np.asarray(im.convert("RGB"), dtype=np.uint8) for im in images)))
    return cases


#: the d3 runtime's per-frame pixel budget (``max_video_tokens * (patch * merge)^2``, 192 tokens of 32 x 32) and
#: frame count; the released runtime's constants are not public: these reproduce its tests' frame sizes
VIDEO_MAX_PIXELS = 192 * 32 * 32
VIDEO_MAX_FRAMES = 64


def video_settings(root: Path, vision_config: Mapping[str, Any]) -> vid.VideoSettings | None:
    """video_preprocessor_config.json checked (Qwen3-VL's video processor, the tower's patch sizes) as the
    package's video settings; None when the source has none (the package then reads no videos)."""
    path = root / "video_preprocessor_config.json"
    if not path.is_file():
        return None
    raw = src.read_json(path)
    if not isinstance(raw, dict) or raw.get("video_processor_type") != "Qwen3VLVideoProcessor":
        raise ConversionError("video_preprocessor_config.json: video_processor_type must be Qwen3VLVideoProcessor")
    sizes = tuple(raw.get(k) for k in ("patch_size", "temporal_patch_size", "merge_size"))
    if sizes != (vision_config.get("patch_size"), vision_config.get("temporal_patch_size"),
                 vision_config.get("spatial_merge_size")):
        raise ConversionError("video_preprocessor_config.json and vision_config disagree on patch, temporal patch "
                              "or merge size")
    size = raw.get("size")
    shortest = size.get("shortest_edge") if isinstance(size, dict) else None
    if not isinstance(shortest, int) or isinstance(shortest, bool) or shortest <= 0:
        raise ConversionError("video_preprocessor_config.json: size.shortest_edge must be a positive integer")
    patch, temporal, merge = (int(v) for v in sizes)  # type: ignore[arg-type]  # equal to the tower's ints
    return vid.VideoSettings(patch, merge, temporal, shortest, VIDEO_MAX_PIXELS, VIDEO_MAX_FRAMES)


def video_case(prompt: D3Prompt, core: VisionCore, settings: vid.VideoSettings, ids: Mapping[str, int],
               limit: int) -> ImageCase:
    """One question on a 3-frame 4 fps clip of 80x56 random frames (an odd count: the last frame repeats), the
    frames sampled, sized and timestamped as the server reads them."""
    frames = [verify_image(56, 80, seed) for seed in range(3)]
    indices = vid.sample_indices(len(frames), 4.0, settings.max_frames)
    size = vid.frame_size(settings, len(indices), 56, 80)
    resized = [frames[i].convert("RGB").resize((size[1], size[0]), resample=Image.Resampling.BICUBIC) for i in indices]
    clip = vid.pairs(core.processor, vid.Decoded(resized, tuple(indices), 4.0, len(frames), size))
    merge = settings.merge_size
    expansion = vid.expansion_ids(lambda t: prompt.tokenizer.encode(t, add_special_tokens=False).ids, clip,
                                  ids["start"], ids["video"], ids["end"], merge)
    q = parse_question("moves", {"type": "noul", "instructions": "Does anything move in the clip?"})
    if not isinstance(q, Question):
        raise ConversionError("video check question is invalid")
    got = prompt.tokens({"turns": ["a short clip"]}, q, limit, [len(expansion)], videos=1)
    if not isinstance(got, PromptTokens):
        raise ConversionError(f"the video check question does not fit {limit} tokens: {got}")
    expanded: list[int] = []
    for t in got.ids:
        expanded += expansion if t == ids["video"] else [t]
    encoded = tuple(core.encode(p.patches) for p in clip)
    grid = clip[0].patches
    return ImageCase(q, tuple(expanded), (), np.asarray(expanded, dtype=np.int64), np.zeros((0, 0), np.float32),
                     np.zeros((0, 3), np.int64), (), encoded, np.concatenate([p.patches.patches for p in clip]),
                     np.array([[len(clip), grid.grid_h, grid.grid_w]], dtype=np.int64))


def check_images(source: src.Decision3Source, graph: Path, vision_graph: Path, settings: ProcessorSettings,
                 prompt: D3Prompt, embeddings: np.ndarray, readout: np.ndarray, limit: int,
                 reference: bool, videos: vid.VideoSettings | None = None) -> ImageVerified:
    """The server's image path against Transformers 5 (see the module docstring); with ``reference`` False,
    only that the path runs (nothing is compared and the report says so)."""
    from edge_runtime.engine.recurrent import RecurrentForward
    from edge_runtime.engine.session import create_session

    vcfg = source.vision_config or {}
    image_id = int(source.config["image_token_id"])
    if prompt.tokenizer.token_to_id(IMAGE_TOKEN) != image_id:
        raise ConversionError(f"the tokenizer's {IMAGE_TOKEN} is not config.json's image_token_id {image_id}")
    core = VisionCore(create_session(vision_graph, "cpu", 2), settings,
                      int(int(vcfg["num_position_embeddings"]) ** 0.5), embeddings.shape[1])
    cases = image_cases(prompt, core, image_id, limit)
    video_id = int(source.config["video_token_id"])
    if videos is not None:
        cases.append(video_case(prompt, core, videos, {"video": video_id,
                                                       "start": int(source.config["vision_start_token_id"]),
                                                       "end": int(source.config["vision_end_token_id"])}, limit))
    forward = RecurrentForward(create_session(graph, "cpu", 2), embeddings, attention_mode=source.attention_mode)
    rows = [image_row(c.prompt_ids, image_id, c.images, embeddings, settings.merge_size, video_id, c.pairs)
            for c in cases]
    ours = np.stack(forward(rows))
    grids = sorted({tuple(int(v) for v in g) for c in cases for g in c.grids})
    golden_vision = vision_golden(core.session, core.processor.image(golden_image()), core.side,
                                  core.settings.merge_size)
    verified = ImageVerified(0.0, 0.0, 0.0, len(cases), [list(g) for g in grids], reference, rows[0], golden_vision,
                             sum(c.video_grids is not None for c in cases))
    if not reference:
        return verified
    files = [source.root / w for w in source.weights if w.endswith(".safetensors")]
    ref, pixels = reference_vision_hidden(files, source.config, cases, source.attention_mode, settings.card())
    for i, case in enumerate(cases):
        if not case.sources:  # the video case: its pixels are the server's, given to the model as they are
            continue
        theirs, grid = pixels[f"{i}.pixel_values"], pixels[f"{i}.image_grid_thw"]
        if theirs.shape != case.pixel_values.shape or not np.array_equal(grid, case.grids):
            raise ConversionError(f"the image processor's grids {case.grids.tolist()} differ from Transformers' "
                                  f"{grid.tolist()}")
        verified.processor = max(verified.processor, float(np.abs(theirs - case.pixel_values).max()))
    verified.hidden = float(np.abs(ours - ref).max())
    verified.probabilities = max(
        float(np.abs(code_probabilities(a, readout, len(c.question.options), source.temperature)
                     - code_probabilities(b, readout, len(c.question.options), source.temperature)).max())
        for a, b, c in zip(ours, ref, cases))
    return verified


def reference_inputs(cases: Sequence[ImageCase]) -> dict[str, np.ndarray]:
    """reference.py ``--vision`` inputs: per case ``{i}.input_ids``, ``{i}.pixel_values``, ``{i}.image_grid_thw``
    and the decoded images ``{i}.image.{k}``."""
    out: dict[str, np.ndarray] = {}
    for i, c in enumerate(cases):
        out[f"{i}.input_ids"] = c.ids
        if len(c.grids):
            out[f"{i}.pixel_values"] = c.pixel_values.astype(np.float32)
            out[f"{i}.image_grid_thw"] = c.grids
        if c.video_pixels is not None and c.video_grids is not None:
            out[f"{i}.pixel_values_videos"] = c.video_pixels.astype(np.float32)
            out[f"{i}.video_grid_thw"] = c.video_grids
        for k, image in enumerate(c.sources):
            out[f"{i}.image.{k}"] = image
    return out


def reference_vision_hidden(weight_files: Sequence[str | Path], config: Mapping[str, Any], cases: Sequence[Any],
                            attention_mode: str, processor: Mapping[str, Any], *, timeout_s: float = 3600.0
                            ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Transformers 5's ``Qwen3_5Model`` (its own vision tower, scatter and ``get_rope_index``) fp32 hidden
    state at the last token of each image case (``ImageCase``), ``[n, H]``, and
    its ``Qwen2VLImageProcessorPil`` (``processor``: the settings as the card records them) on each case's
    images: ``{i}.pixel_values`` and ``{i}.image_grid_thw``."""
    from converters.decision3.export import run_reference

    inputs = {**reference_inputs(cases), "processor": np.array(json.dumps(dict(processor)))}
    out = run_reference(weight_files, config, inputs, ["--vision", "--attention-mode", attention_mode], timeout_s)
    return np.stack([out[str(i)] for i in range(len(cases))]), {k: v for k, v in out.items() if "." in k}


__all__ = ["GOLDEN_QUESTIONS", "GOLDEN_STATE", "ImageVerified", "check_images", "data_url", "export_vision",
           "golden_image", "image_cases", "processor_settings", "reference_inputs", "reference_vision_hidden",
           "video_case", "video_settings", "vision_tower"]
