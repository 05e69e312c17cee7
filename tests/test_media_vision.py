"""Image intake (edge_runtime.media.image) and the Qwen2-VL processor (edge_runtime.vision_lm.processor):
exact against the slow Qwen2VLImageProcessor, and every refusal with its fixed reason."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from edge_runtime.errors import ApiError
from edge_runtime.media.image import ImageLimits, decode_image, decode_image_url, upright_rgb
from edge_runtime.vision_lm.processor import ImageProcessor, ProcessorSettings, smart_resize

LIMITS = ImageLimits(max_bytes=1 << 20, source_max_pixels=4_000_000)


def encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def noisy(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode)


@pytest.mark.parametrize("settings", [
    ProcessorSettings(min_pixels=32 * 32, max_pixels=128 * 128),
    ProcessorSettings(),  # Qwen3-VL's own: patch 16, merge 2, 65,536 to 16,777,216 pixels
    ProcessorSettings(patch_size=14, min_pixels=56 * 56, max_pixels=28 * 28 * 1280,
                      image_mean=(0.48145466, 0.4578275, 0.40821073), image_std=(0.26862954, 0.26130258, 0.27577711)),
])
def test_processor_equals_the_slow_qwen2vl_processor_exactly(settings) -> None:
    from transformers import Qwen2VLImageProcessor

    hf = Qwen2VLImageProcessor(size={"shortest_edge": settings.min_pixels, "longest_edge": settings.max_pixels},
                               min_pixels=settings.min_pixels, max_pixels=settings.max_pixels,
                               patch_size=settings.patch_size, merge_size=settings.merge_size,
                               temporal_patch_size=settings.temporal_patch_size,
                               image_mean=list(settings.image_mean), image_std=list(settings.image_std))
    ours = ImageProcessor(settings)
    for i, (w, h, mode) in enumerate([(64, 64, "RGB"), (123, 77, "RGBA"), (300, 41, "L"), (500, 380, "RGB")]):
        image = upright_rgb(decode_image(encoded(noisy(w, h, mode, i), "PNG"), LIMITS))
        want = hf(images=[image], return_tensors="np")
        got = ours.image(image)
        assert (got.grid_t, got.grid_h, got.grid_w) == tuple(want["image_grid_thw"][0])
        assert got.patches.dtype == np.float32 and np.array_equal(got.patches, want["pixel_values"]), (w, h, mode)


def test_smart_resize_matches_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize as hf_resize

    for h, w in [(10, 10), (64, 2000), (4000, 3000), (33, 97), (1, 150)]:
        assert smart_resize(h, w, 32, 1024, 16384) == hf_resize(h, w, 32, 1024, 16384)


def test_formats_come_from_the_bytes_not_the_declared_type() -> None:
    image = noisy(40, 30)
    for fmt in ("PNG", "JPEG", "WEBP"):
        data = encoded(image, fmt)
        got = upright_rgb(decode_image_url("data:image/png;base64," + base64.b64encode(data).decode(), LIMITS))
        assert got.size == (40, 30) and got.mode == "RGB"


def test_refusals_carry_their_reason_and_limit() -> None:
    def reason(data: bytes, limits: ImageLimits = LIMITS) -> tuple[str | None, float | int | None]:
        with pytest.raises(ApiError) as e:
            decode_image(data, limits)
        assert e.value.code == "invalid_request"
        return e.value.reason, e.value.limit

    assert reason(encoded(noisy(40, 30), "GIF")) == ("image_format_unsupported", None)
    frames = [noisy(20, 20, seed=k) for k in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, format="PNG", save_all=True, append_images=frames[1:])  # an APNG
    assert reason(buf.getvalue()) == ("image_animated", None)
    buf = io.BytesIO()
    frames[0].save(buf, format="WEBP", save_all=True, append_images=frames[1:])
    assert reason(buf.getvalue()) == ("image_animated", None)
    # a bomb: 8000x8000 of zeros is a few KB of PNG; refused from its header
    bomb = encoded(Image.new("L", (8000, 8000)), "PNG")
    assert len(bomb) < 200_000
    assert reason(bomb) == ("image_too_large", 4_000_000)
    assert reason(encoded(Image.new("L", (1, 20_000)), "PNG")) == ("image_too_large", 200)  # aspect ratio
    assert reason(encoded(noisy(40, 30), "PNG"), ImageLimits(100, 4_000_000)) == ("image_too_large", 100)
    big = encoded(Image.new("L", (5000, 4000)), "PNG")  # 20 M pixels: over the contract's 16 M
    assert reason(big, ImageLimits(1 << 26, 50_000_000)) == ("image_too_large", 16_000_000)
    png = encoded(noisy(64, 64), "PNG")
    assert reason(png[: len(png) // 2])[0] == "image_malformed"
    assert reason(png[:20])[0] == "image_malformed"
    for bad in (123, "data:image/png;base64,@@@", "data:image/png;base64,"):
        with pytest.raises(ApiError) as e:
            decode_image_url(bad, LIMITS)
        assert e.value.reason == "image_malformed", bad
    with pytest.raises(ApiError) as e:
        decode_image_url("http://example.com/a.png", LIMITS)
    assert e.value.reason == "image_url_unsupported"  # the runtime never fetches
