"""Images: the one decoder every family uses (data URLs and bytes in, one loaded Pillow image out).

The format is read from the bytes' signature, PNG, JPEG or WebP, and only that format's Pillow
plugin ever sees them: no other plugin probes hostile bytes (EPS would start Ghostscript), and a
GIF, BMP or TIFF is named unsupported. The limits are checked on the header, before any pixel is
decoded, so a decompression bomb (a small file that claims a huge canvas) costs its header read:
``limits.max_bytes``, ``limits.source_max_pixels`` and the contract's bounds for every image
(16,000,000 pixels, aspect ratio 200). Animated images are refused: which frame a model should
read is not defined. Every refusal is a :class:`MediaError` (a 400 invalid_request) with a fixed
reason and, when a limit was broken, the limit.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from PIL import Image, ImageOps

from edge_runtime.media.dataurl import parse_data_url
from edge_runtime.media.errors import MediaError

#: The contract's bounds for every image, whatever a model's own limits.
CONTRACT_MAX_PIXELS = 16_000_000
MAX_ASPECT_RATIO = 200
#: Pillow format -> the media type a data URL may declare for it
IMAGE_FORMATS: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
# Signatures of common image formats that are not served, so that they are named as unsupported
# rather than malformed; bytes of no known signature are malformed.
_OTHER_SIGNATURES = {b"GIF87a": "GIF", b"GIF89a": "GIF", b"BM": "BMP", b"II*\x00": "TIFF", b"MM\x00*": "TIFF"}


@dataclass(frozen=True)
class ImageLimits:
    """A card's image limits: bytes as sent (decoded base64) and pixels of the source image."""

    max_bytes: int
    source_max_pixels: int

    @property
    def pixel_cap(self) -> int:
        """The pixels an image may have: the card's limit within the contract's."""
        return min(self.source_max_pixels, CONTRACT_MAX_PIXELS)


def sniff_image_format(data: bytes) -> str | None:
    """PNG, JPEG or WEBP read from the signature, else None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _too_large(message: str, limit: int) -> MediaError:
    return MediaError("image_too_large", message, limit)


def decode_image(raw: bytes, limits: ImageLimits, declared: str | None = None) -> Image.Image:
    """The image in ``raw``, loaded (fully decoded), in its own mode and with its ``format``.

    ``declared`` is the media type a data URL names, checked against the bytes when given
    (image_format_mismatch). Raises MediaError: image_too_large (bytes, source pixels or aspect
    ratio, with the limit), image_malformed (no image signature, truncated, corrupt),
    image_format_unsupported (an image, but not PNG, JPEG or WebP), image_animated.
    """
    if len(raw) > limits.max_bytes:
        raise _too_large(f"the image has {len(raw)} bytes, more than {limits.max_bytes}", limits.max_bytes)
    fmt = sniff_image_format(raw)
    if fmt is None:
        other = next((name for magic, name in _OTHER_SIGNATURES.items() if raw.startswith(magic)), None)
        if other is not None:
            raise MediaError("image_format_unsupported", f"images must be PNG, JPEG or WebP, not {other}")
        raise MediaError("image_malformed", "the bytes are not a PNG, JPEG or WebP image")
    if declared is not None and _MIME_ALIASES.get(declared, declared) != IMAGE_FORMATS[fmt]:
        raise MediaError("image_format_mismatch", f"the data URL declares {declared} but the bytes are "
                         f"{IMAGE_FORMATS[fmt]}")
    cap = limits.pixel_cap
    try:
        with warnings.catch_warnings():
            # Pillow warns from 89 M pixels and raises from twice that; our cap is far below both and
            # is checked on the header just after, so its warning would only be noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw), formats=[fmt])
    except Image.DecompressionBombError:
        raise _too_large(f"the image has more than {cap} pixels", cap) from None
    except Exception:  # noqa: BLE001 - Pillow raises many types for a broken header
        raise MediaError("image_malformed", f"the image's {fmt} header cannot be read") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise MediaError("image_malformed", "the image has no pixels")
    if width * height > cap:
        raise _too_large(f"the image has {width * height} pixels ({width}x{height}), more than {cap}", cap)
    if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:
        raise _too_large(f"the image's aspect ratio ({width}x{height}) is over {MAX_ASPECT_RATIO}", MAX_ASPECT_RATIO)
    if getattr(image, "is_animated", False) or getattr(image, "n_frames", 1) > 1:
        raise MediaError("image_animated", "animated images are not read; send one frame")
    try:
        image.load()
    except Exception:  # noqa: BLE001 - truncated or corrupt pixel data
        raise MediaError("image_malformed", f"the image's {fmt} data is truncated or corrupt") from None
    return image


def decode_image_url(url: object, limits: ImageLimits, check_declared: bool = False) -> Image.Image:
    """The image of a base64 data URL (see decode_image); its declared type is checked only when
    ``check_declared`` (embeddings do; decision models read the format from the bytes alone)."""
    mime, raw = parse_data_url(url, limits.max_bytes, "image")
    return decode_image(raw, limits, mime if check_declared else None)


T = TypeVar("T")


def decode_images(urls: Sequence[object], asset_images: Sequence[bytes], limits: ImageLimits,
                  read: Callable[[Image.Image], T]) -> list[T]:
    """A decision entry's images as ``read`` makes them: its data URLs, then the assets its state
    uses (one image per use; an asset used twice is decoded once). The format is read from the bytes
    alone: a data URL's declared type is not checked. MediaError refuses."""
    images = [read(decode_image_url(url, limits)) for url in urls]
    decoded: dict[int, T] = {}
    for data in asset_images:
        if id(data) not in decoded:
            decoded[id(data)] = read(decode_image(data, limits))
        images.append(decoded[id(data)])
    return images


def upright_rgb(image: Image.Image) -> Image.Image:
    """The image with its EXIF orientation applied, in RGB, as Transformers' ``load_image`` and
    ``convert_to_rgb`` give it to a Qwen-VL processor."""
    try:
        upright: Image.Image = ImageOps.exif_transpose(image) or image
    except Exception:  # noqa: BLE001 - a corrupt EXIF block
        raise MediaError("image_malformed", "the image's EXIF data cannot be read") from None
    return upright if upright.mode == "RGB" else upright.convert("RGB")


__all__ = ["CONTRACT_MAX_PIXELS", "IMAGE_FORMATS", "ImageLimits", "MAX_ASPECT_RATIO", "decode_image",
           "decode_image_url", "sniff_image_format", "upright_rgb"]
