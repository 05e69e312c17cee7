"""Images for a Qwen-VL decision model: data URLs in, patches and grids out (numpy and Pillow).

Intake (``decode_image``): a base64 data URL (or the raw bytes of an asset) whose format is read
from the bytes, PNG, JPEG or WebP, never from the declared media type; animated images are
refused. Limits are checked on the header before any pixel is decoded, so a decompression bomb
costs the header read: ``image_max_bytes``, ``image_source_max_pixels``, the contract's
16,000,000 pixels and aspect ratio 200. EXIF orientation is applied and the image converted to
RGB, as Transformers' ``load_image`` and ``convert_to_rgb`` do.

Processing (``ImageProcessor``): the slow ``Qwen2VLImageProcessor`` semantics, bit for bit:
``smart_resize`` to multiples of patch x merge within ``[min_pixels, max_pixels]``, Pillow bicubic
resize of the uint8 image, rescale in float64 then float32, ``(x - mean) / std`` in float32, frames
repeated to the temporal patch, and the patch layout ``[t, h, w] -> [N, C*T*p*p]`` in merge-block
order. The fast processor (torch's antialiased bicubic) differs from Pillow by a level on <1 % of
values, so the slow semantics are the pinned ones (the card says so).

Every refusal is an :class:`ApiError` ``invalid_request`` with a fixed reason and, for a broken
limit, the limit.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from edge_runtime.errors import ApiError

#: The contract's bounds for every image, whatever the model's own limits.
CONTRACT_MAX_PIXELS = 16_000_000
MAX_ASPECT_RATIO = 200
_FORMATS = {"PNG": b"\x89PNG\r\n\x1a\n", "JPEG": b"\xff\xd8\xff"}
_DATA_URL = re.compile(r"^data:([a-zA-Z0-9.+/-]*)((?:;[a-zA-Z0-9=.+-]+)*?);base64,", re.ASCII)


def refused(reason: str, message: str, limit: int | float | None = None) -> ApiError:
    """The 400 for a rejected image or video: a fixed reason, a message, the broken limit."""
    return ApiError("invalid_request", message, reason=reason, limit=limit)


def data_url_bytes(url: Any, kind: str, reason: str, max_bytes: int) -> bytes:
    """The decoded bytes of a base64 data URL, refused (``reason``) when malformed; the size is
    checked from the base64 length before decoding so an oversized one costs nothing."""
    if not isinstance(url, str):
        raise refused(reason, f"{kind} must be a base64 data URL string")
    m = _DATA_URL.match(url)
    if m is None:
        raise refused(reason, f"{kind} must be a data URL of the form data:<type>;base64,<data>")
    payload = url[m.end():]
    too_large = "image_too_large" if kind == "image" else "video_too_large"
    if len(payload) // 4 * 3 > max_bytes + 3:
        raise refused(too_large, f"the {kind} is larger than {max_bytes} bytes", max_bytes)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise refused(reason, f"the {kind} data URL is not valid base64") from None
    if len(data) > max_bytes:
        raise refused(too_large, f"the {kind} has {len(data)} bytes, more than {max_bytes}", max_bytes)
    if not data:
        raise refused(reason, f"the {kind} is empty")
    return data


def sniff_image_format(data: bytes) -> str | None:
    """PNG, JPEG or WEBP read from the magic bytes, else None."""
    for name, magic in _FORMATS.items():
        if data.startswith(magic):
            return name
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


@dataclass(frozen=True)
class ImageLimits:
    """The card's image limits (bytes of one image, pixels of the source image)."""

    max_bytes: int
    source_max_pixels: int


def decode_image_bytes(data: bytes, limits: ImageLimits) -> Image.Image:
    """An RGB Pillow image from PNG, JPEG or WebP bytes, within the limits (see the module doc)."""
    if len(data) > limits.max_bytes:
        raise refused("image_too_large", f"the image has {len(data)} bytes, more than {limits.max_bytes}",
                      limits.max_bytes)
    fmt = sniff_image_format(data)
    if fmt is None:
        raise refused("image_format_unsupported", "the image is not PNG, JPEG or WebP")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limits follow
            img = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError:  # over Pillow's hard cap, far above ours
        cap = min(limits.source_max_pixels, CONTRACT_MAX_PIXELS)
        raise refused("image_too_large", f"the image has more than {cap} pixels", cap) from None
    except Exception:  # noqa: BLE001 - Pillow raises many types for broken headers
        raise refused("image_malformed", f"the image's {fmt} header cannot be read") from None
    width, height = img.size
    pixels = width * height
    cap = min(limits.source_max_pixels, CONTRACT_MAX_PIXELS)
    if pixels > cap:
        raise refused("image_too_large", f"the image has {pixels} pixels ({width}x{height}), more than {cap}", cap)
    if min(width, height) < 1 or max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise refused("image_too_large", f"the image's aspect ratio ({width}x{height}) is over {MAX_ASPECT_RATIO}",
                      MAX_ASPECT_RATIO)
    if getattr(img, "is_animated", False) or getattr(img, "n_frames", 1) > 1:
        raise refused("image_animated", "animated images are not read; send one frame")
    try:
        img.load()
        upright: Image.Image = ImageOps.exif_transpose(img) or img
        return upright if upright.mode == "RGB" else upright.convert("RGB")
    except ApiError:
        raise
    except Exception:  # noqa: BLE001 - truncated or corrupt pixel data
        raise refused("image_malformed", f"the image's {fmt} data cannot be decoded") from None


def decode_image(url: Any, limits: ImageLimits) -> Image.Image:
    """An RGB image from a base64 data URL (see decode_image_bytes)."""
    return decode_image_bytes(data_url_bytes(url, "image", "image_malformed", limits.max_bytes), limits)


# ---- the Qwen2-VL processor ----------------------------------------------------------------


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Transformers' ``smart_resize``: multiples of ``factor``, pixels within [min, max], aspect kept."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise refused("image_too_large", f"aspect ratio over {MAX_ASPECT_RATIO}", MAX_ASPECT_RATIO)
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

    def tokens(self, height: int, width: int, max_pixels: int | None = None) -> int:
        """The LM tokens an image of this size takes."""
        h, w = self.target_size(height, width, max_pixels)
        return (h // self.s.factor) * (w // self.s.factor)


__all__ = ["CONTRACT_MAX_PIXELS", "ImageLimits", "ImageProcessor", "MAX_ASPECT_RATIO", "Patches",
           "ProcessorSettings", "data_url_bytes", "decode_image", "decode_image_bytes", "refused",
           "smart_resize", "sniff_image_format"]
