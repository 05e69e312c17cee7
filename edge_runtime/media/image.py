"""Images: PNG, JPEG or WebP bytes -> one loaded Pillow image, limits checked before pixels are decoded.

Pillow reads the header first, so the format and the pixel count are known before any pixel is
decoded: a decompression bomb (a small file that claims a huge canvas) costs only its header.
Animated images are refused, since which frame an embedding should read is not defined.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

from edge_runtime.media.errors import MediaError

#: Pillow format -> the media type a data URL may declare for it
IMAGE_FORMATS: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp"}
_MIME_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg"}
# Formats Pillow may even parse the header of: the served ones, and a few common ones it reads safely,
# so that they are named as unsupported. Never every plugin (EPS would start Ghostscript on load).
_OPENED = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


@dataclass(frozen=True)
class ImageLimits:
    """A card's image limits: bytes as sent (decoded base64) and pixels of the source image."""

    max_bytes: int
    max_pixels: int


def decode_image(raw: bytes, limits: ImageLimits, declared: str | None = None) -> Image.Image:
    """The image in ``raw``, loaded (fully decoded), in its own mode.

    Raises MediaError: image_too_large (bytes or source pixels, with the limit), image_malformed
    (not an image, truncated, corrupt), image_format_unsupported (not PNG, JPEG or WebP),
    image_format_mismatch (the data URL declares another format than the bytes hold),
    image_animated (more than one frame).
    """
    if len(raw) > limits.max_bytes:
        raise MediaError("image_too_large", f"the image is larger than {limits.max_bytes} bytes", limits.max_bytes)
    with warnings.catch_warnings():
        # Pillow warns on large canvases; our own pixel limit below is the rule, so errors not warnings.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            image = Image.open(io.BytesIO(raw), formats=_OPENED)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise MediaError("image_too_large", f"the image has more than {limits.max_pixels} pixels",
                             limits.max_pixels) from None
        except (OSError, ValueError, SyntaxError):
            raise MediaError("image_malformed",
                             "the image could not be read (not a PNG, JPEG or WebP image, or corrupt)") from None
    fmt = image.format or ""
    if fmt not in IMAGE_FORMATS:
        raise MediaError("image_format_unsupported", f"images must be PNG, JPEG or WebP, not {fmt or 'unknown'}")
    if declared is not None:
        want = _MIME_ALIASES.get(declared, declared)
        if want != IMAGE_FORMATS[fmt]:
            raise MediaError("image_format_mismatch",
                             f"the data URL declares {declared} but the bytes are {IMAGE_FORMATS[fmt]}")
    width, height = image.size
    if width < 1 or height < 1:
        raise MediaError("image_malformed", "the image has no pixels")
    if width * height > limits.max_pixels:
        raise MediaError("image_too_large", f"the image has {width * height} pixels, more than {limits.max_pixels}",
                         limits.max_pixels)
    if getattr(image, "is_animated", False) or getattr(image, "n_frames", 1) > 1:
        raise MediaError("image_animated", "animated images are not read; send one frame")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise MediaError("image_malformed", "the image is truncated or corrupt") from None
    return image
