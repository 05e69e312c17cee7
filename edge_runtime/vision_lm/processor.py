"""The Qwen2-VL image processor for a Qwen-VL decision model: images in, patches and grids out
(numpy and Pillow). Images are decoded by edge_runtime.media.image, the one decoder.

``ImageProcessor`` has the slow ``Qwen2VLImageProcessor`` semantics, bit for bit: ``smart_resize``
to multiples of patch x merge within ``[min_pixels, max_pixels]``, Pillow bicubic resize of the
uint8 image, rescale in float64 then float32, ``(x - mean) / std`` in float32, frames repeated to
the temporal patch, and the patch layout ``[t, h, w] -> [N, C*T*p*p]`` in merge-block order. The
fast processor (torch's antialiased bicubic) differs from Pillow by a level on <1 % of values, so
the slow semantics are the pinned ones (the card says so).

Videos (``pair_frames``): every two sampled frames (edge_runtime.media.video) become one vision block
(Qwen3-VL's temporal patch 2), resized as one image of at most ``video_max_pixels`` pixels per frame
(the contract's per-frame limit; Transformers' video processor bounds the whole clip instead) and
read after the timestamp ``<{t:.1f} seconds>``, t the mean of the pair's frame times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from edge_runtime.media.errors import MediaError
from edge_runtime.media.image import MAX_ASPECT_RATIO, ImageLimits, decode_images, upright_rgb


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Transformers' ``smart_resize``: multiples of ``factor``, pixels within [min, max], aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError("image_too_large", f"aspect ratio over {MAX_ASPECT_RATIO}", MAX_ASPECT_RATIO)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ProcessorSettings:
    """The processor's settings as the card records them (``processor`` member)."""

    patch_size: int = 16
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 65_536
    max_pixels: int = 16_777_216
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_card(cls, raw: dict[str, Any]) -> ProcessorSettings:
        return cls(patch_size=int(raw["patch_size"]), merge_size=int(raw["merge_size"]),
                   temporal_patch_size=int(raw["temporal_patch_size"]), min_pixels=int(raw["min_pixels"]),
                   max_pixels=int(raw["max_pixels"]), image_mean=tuple(float(x) for x in raw["image_mean"]),
                   image_std=tuple(float(x) for x in raw["image_std"]),
                   rescale_factor=float(raw["rescale_factor"]))

    def card(self) -> dict[str, Any]:
        return {"patch_size": self.patch_size, "merge_size": self.merge_size,
                "temporal_patch_size": self.temporal_patch_size, "min_pixels": self.min_pixels,
                "max_pixels": self.max_pixels, "image_mean": list(self.image_mean),
                "image_std": list(self.image_std), "rescale_factor": self.rescale_factor,
                "resample": "PIL bicubic (slow Qwen2VLImageProcessor semantics)"}


@dataclass(frozen=True)
class Patches:
    """One vision input: ``patches [t*h*w, C*T*p*p]`` float32 and its grid in patches."""

    patches: np.ndarray
    grid_t: int
    grid_h: int
    grid_w: int


class ImageProcessor:
    """The slow Qwen2VLImageProcessor in numpy and Pillow (see the module docstring)."""

    def __init__(self, settings: ProcessorSettings) -> None:
        self.s = settings

    def target_size(self, height: int, width: int, max_pixels: int | None = None) -> tuple[int, int]:
        """The (height, width) an image is resized to."""
        return smart_resize(height, width, self.s.factor, self.s.min_pixels,
                            self.s.max_pixels if max_pixels is None else max_pixels)

    def normalized(self, image: Image.Image, size: tuple[int, int]) -> np.ndarray:
        """float32 [C, H, W]: resized (Pillow bicubic on uint8), rescaled, normalised."""
        h, w = size
        if image.size != (w, h):
            image = image.resize((w, h), resample=Image.Resampling.BICUBIC)
        arr = np.asarray(image, dtype=np.uint8)
        x = (arr.astype(np.float64) * self.s.rescale_factor).astype(np.float32)
        mean = np.asarray(self.s.image_mean, dtype=np.float32)
        std = np.asarray(self.s.image_std, dtype=np.float32)
        return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1))

    def patchify(self, frames: Sequence[np.ndarray]) -> Patches:
        """Normalised frames (all [C, H, W] of one size) as patches in merge-block order."""
        stack = np.stack(frames)
        t_patch, p, m = self.s.temporal_patch_size, self.s.patch_size, self.s.merge_size
        if stack.shape[0] % t_patch:
            pad = np.repeat(stack[-1:], t_patch - stack.shape[0] % t_patch, axis=0)
            stack = np.concatenate([stack, pad])
        c, height, width = stack.shape[1:]
        gt, gh, gw = stack.shape[0] // t_patch, height // p, width // p
        x = stack.reshape(gt, t_patch, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return Patches(np.ascontiguousarray(x.reshape(gt * gh * gw, c * t_patch * p * p)), gt, gh, gw)

    def image(self, image: Image.Image, max_pixels: int | None = None) -> Patches:
        """One image as patches (t = 1: the image repeated to the temporal patch)."""
        size = self.target_size(image.height, image.width, max_pixels)
        return self.patchify([self.normalized(image, size)])

    def read_images(self, urls: Sequence[object], asset_images: Sequence[bytes], limits: ImageLimits,
                    max_pixels: int) -> list[Patches]:
        """An entry's images (its data URLs, then the assets its state uses) decoded by edge_runtime.media,
        upright and RGB as Transformers' ``load_image`` gives them, as patches within ``max_pixels``;
        MediaError refuses."""
        return decode_images(urls, asset_images, limits, lambda image: self.image(upright_rgb(image), max_pixels))

    def tokens(self, height: int, width: int, max_pixels: int | None = None) -> int:
        """The LM tokens an image of this size takes."""
        h, w = self.target_size(height, width, max_pixels)
        return (h // self.s.factor) * (w // self.s.factor)




# -- videos: frames in pairs -----------------------------------------------------------------

@dataclass(frozen=True)
class FramePair:
    """Two sampled frames as one vision block, at the mean of their times (seconds)."""

    time: float
    patches: Patches


@dataclass(frozen=True)
class VideoClip:
    """A video as the model reads it: its frame pairs and the clip's length in seconds."""

    pairs: list[FramePair]
    seconds: float
    #: the length came from the container (False: from a packet scan; Box and track refuse those)
    measured: bool = True


def pair_frames(processor: ImageProcessor, frames: Sequence[Image.Image], times: Sequence[float],
                max_pixels: int) -> list[FramePair]:
    """Frames (one size) as timestamped pairs of patches; an odd last frame is repeated."""
    if not frames:
        return []
    first = frames[0]
    size = processor.target_size(first.height, first.width, max_pixels)
    normal = [processor.normalized(f, size) for f in frames]
    pairs = []
    for i in range(0, len(normal), 2):
        chunk = normal[i:i + 2]
        t = times[i:i + 2]
        pairs.append(FramePair(float(sum(t) / len(t)), processor.patchify(chunk)))
    return pairs


__all__ = ["FramePair", "ImageProcessor", "Patches", "ProcessorSettings", "VideoClip", "pair_frames",
           "smart_resize"]
