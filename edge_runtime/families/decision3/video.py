"""Videos in a decision3 prompt: the released d3 runtime's frame sampling, sizes and expansion.

Intake is the shared one (edge_runtime.media.video.open_video: video_max_bytes, video_max_seconds,
video_source_max_pixels, the aspect ratio; the same reasons as decision-vision). What differs from
decision-vision's Qwen3-VL path follows the d3 runtime (upstream-formats.md §3.6 and its tests):

- frames are picked by index, as Transformers' ``Qwen3VLVideoProcessor.sample_frames`` picks them:
  ``k = int(total / fps * 2)`` clamped to ``[4, video_max_frames]`` and to ``total``, at
  ``linspace(0, total - 1, k).round()`` (decision-vision picks the frame nearest each of k times);
- the frame size is Transformers' video ``smart_resize`` over the clip with ``cap_pixels_per_frame``:
  each frame at most ``video_max_pixels`` pixels (``max_video_tokens * (patch * merge)^2``);
- a pair's timestamp is the mean of its frames' ``index / fps`` (``Qwen3VLProcessor._calculate_timestamps``).

Frames are then read as decision-vision reads them (its processor: Pillow bicubic, normalised, two frames
per vision block, an odd last frame repeated), and the prompt's ``<|video_pad|>`` becomes, per pair,
``<{t:.1f} seconds><|vision_start|>`` + pads + ``<|vision_end|>``. Each pair is one vision block with
t = 1 for the vision core and the 3-D positions (Qwen3.5's ``get_rope_index``, as for an image).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from edge_runtime.media.dataurl import parse_data_url
from edge_runtime.media.errors import MediaError
from edge_runtime.media.image import MAX_ASPECT_RATIO
from edge_runtime.media.video import MIN_FRAMES, VideoLimits, open_video, rgb_image
from edge_runtime.vision_lm.processor import ImageProcessor, Patches

#: the d3 runtime's sampling rate (frames per second of video)
SAMPLE_FPS = 2.0
TIMESTAMP = "<{t:.1f} seconds>"


@dataclass(frozen=True)
class VideoSettings:
    """How a package reads video frames (decision_config ``vision.video``)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    shortest_edge: int  # the clip's fewest pixels (video_preprocessor_config ``size``)
    max_pixels: int     # per frame (card video_max_pixels)
    max_frames: int     # card video_max_frames

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> VideoSettings:
        return cls(int(raw["patch_size"]), int(raw["merge_size"]), int(raw["temporal_patch_size"]),
                   int(raw["shortest_edge"]), int(raw["max_pixels"]), int(raw["max_frames"]))

    def card(self) -> dict[str, Any]:
        return {"patch_size": self.patch_size, "merge_size": self.merge_size,
                "temporal_patch_size": self.temporal_patch_size, "shortest_edge": self.shortest_edge,
                "max_pixels": self.max_pixels, "max_frames": self.max_frames}


def sample_indices(total: int, fps: float, max_frames: int = 768) -> list[int]:
    """The frame indices the model reads of a clip of ``total`` frames at ``fps``."""
    k = int(total / fps * SAMPLE_FPS) if fps > 0 else total
    k = min(max(k, MIN_FRAMES), max_frames, total)
    return [int(i) for i in np.linspace(0, total - 1, k).round().astype(int)]


def frame_size(settings: VideoSettings, frames: int, height: int, width: int) -> tuple[int, int]:
    """Transformers' video ``smart_resize`` with ``cap_pixels_per_frame``: the (height, width) every frame of a
    clip of ``frames`` sampled frames is resized to."""
    f, tf = settings.factor, settings.temporal_patch_size
    per_frame = max(settings.max_pixels, int(settings.shortest_edge * 1.05))
    max_pixels = per_frame * frames
    if height < f or width < f:
        scale = max(f / height, f / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError("video_too_large", f"the video's frames have an aspect ratio over {MAX_ASPECT_RATIO}",
                         MAX_ASPECT_RATIO)
    h_bar, w_bar = round(height / f) * f, round(width / f) * f
    t_bar = max(round(frames / tf), 1) * tf
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(frames * height * width / max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif t_bar * h_bar * w_bar < settings.shortest_edge:
        beta = math.sqrt(settings.shortest_edge / (frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h_bar, w_bar


def input_tokens(settings: VideoSettings, frames: int, height: int, width: int) -> int:
    """The video pads a clip of ``frames`` sampled frames takes (timestamps and vision marks not counted)."""
    h, w = frame_size(settings, frames, height, width)
    pairs = -(-frames // settings.temporal_patch_size)
    return pairs * (h // settings.factor) * (w // settings.factor)


@dataclass(frozen=True)
class Decoded:
    """The sampled frames of a clip (RGB, at the size the model reads them) and where they came from."""

    frames: list[Image.Image]
    indices: tuple[int, ...]
    fps: float
    total: int
    size: tuple[int, int]  # (height, width)


@dataclass(frozen=True)
class VideoPair:
    """Two sampled frames as one vision block, read after its timestamp."""

    time: float
    patches: Patches


#: ``check(frames, height, width)``: called before any frame is decoded; may raise to refuse the clip
BeforeDecode = Callable[[int, int, int], None]


def _frame_count(container: Any, stream: Any) -> int:
    if stream.frames:
        return int(stream.frames)
    count = sum(1 for packet in container.demux(stream) if packet.size)  # demux only, no pixels
    container.seek(0)
    return count


def decode(url: Any, limits: VideoLimits, settings: VideoSettings, before_decode: BeforeDecode | None = None
           ) -> Decoded:
    """A base64 data URL's sampled frames, each converted to RGB at the size the model reads it."""
    _, data = parse_data_url(url, limits.max_bytes, "video")
    container, stream, _, _ = open_video(data, limits)
    try:
        rate = stream.average_rate or stream.guessed_rate or stream.base_rate
        fps = float(rate) if rate else 0.0
        total = _frame_count(container, stream)
        if total <= 0 or not math.isfinite(fps) or fps <= 0:
            raise MediaError("video_malformed", "the video's frame count or rate cannot be read")
        indices = sample_indices(total, fps, settings.max_frames)
        width, height = stream.codec_context.width, stream.codec_context.height
        if before_decode is not None:
            before_decode(len(indices), height, width)
        size = frame_size(settings, len(indices), height, width)
        wanted = set(indices)
        kept: dict[int, Image.Image] = {}
        last: Image.Image | None = None
        stream.thread_type = "AUTO"
        try:
            for i, frame in enumerate(container.decode(stream)):
                if i in wanted:
                    image = rgb_image(frame)
                    kept[i] = last = image.resize((size[1], size[0]), resample=Image.Resampling.BICUBIC) \
                        if image.size != (size[1], size[0]) else image
                if i >= indices[-1]:
                    break
        except Exception:  # noqa: BLE001 - corrupt packets
            raise MediaError("video_malformed", "the video's frames cannot be decoded") from None
        if last is None:
            raise MediaError("video_malformed", "the video has no decodable frames")
        # a container that states more frames than it holds: the missing ones are its last decoded frame
        frames = [kept.get(i, last) for i in indices]
        return Decoded(frames, tuple(indices), fps, total, size)
    finally:
        container.close()


def timestamps(indices: Sequence[int], fps: float, merge: int) -> list[float]:
    """``Qwen3VLProcessor._calculate_timestamps``: per pair, the mean of its first and last frame's time."""
    idx = list(indices)
    if len(idx) % merge:
        idx.extend(idx[-1] for _ in range(merge - len(idx) % merge))
    times = [i / fps for i in idx]
    return [(times[i] + times[i + merge - 1]) / 2 for i in range(0, len(times), merge)]


def pairs(processor: ImageProcessor, decoded: Decoded) -> list[VideoPair]:
    """The clip's frames as timestamped vision blocks (two frames each, an odd last frame repeated)."""
    t = processor.s.temporal_patch_size
    normal = [processor.normalized(f, decoded.size) for f in decoded.frames]
    times = timestamps(decoded.indices, decoded.fps, t)
    return [VideoPair(times[j], processor.patchify(normal[i:i + t])) for j, i in enumerate(range(0, len(normal), t))]


def expansion_ids(encode: Callable[[str], Sequence[int]], clip: Sequence[VideoPair], start: int, pad: int,
                  end: int, merge: int) -> list[int]:
    """What the prompt's ``<|video_pad|>`` becomes: per pair, its timestamp, vision start, pads, vision end."""
    ids: list[int] = []
    for pair in clip:
        ids.extend(encode(TIMESTAMP.format(t=pair.time)))
        ids.append(start)
        ids.extend([pad] * ((pair.patches.grid_h // merge) * (pair.patches.grid_w // merge)))
        ids.append(end)
    return ids


__all__ = ["SAMPLE_FPS", "TIMESTAMP", "BeforeDecode", "Decoded", "VideoPair", "VideoSettings", "decode",
           "expansion_ids", "frame_size", "input_tokens", "pairs", "sample_indices", "timestamps"]
