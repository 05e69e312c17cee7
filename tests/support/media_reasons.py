"""Media refusals over HTTP, shared by the decision families that read images and videos through
the one media intake (decision-vision, decision3): posting helpers that check the contract's shape,
hostile media made in process (headers claiming huge canvases or hours, animations, garbage), and
a copy of a package with its card changed."""

from __future__ import annotations

import base64
import io
import json
import random
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

from PIL import Image

from edge_runtime.api.schema import validate_response
from tests.support.media_samples import encode_video
from tests.support.server_harness import Server
from tests.support.vision import BODY_QUESTIONS, png_url, sample_image

NOUL = {"n": BODY_QUESTIONS["busy"]}


def copy_with_card(package: Path, out: Path, **changes: Any) -> Path:
    """A copy of ``package`` whose card has ``changes`` (limits merged), with its manifest rebuilt."""
    from edge_runtime.packages.card import CARD_FILE
    from edge_runtime.packages.manifest import build_manifest

    shutil.copytree(package, out)
    card = json.loads((out / CARD_FILE).read_text())
    card["limits"].update(changes.pop("limits", {}))
    card.update(changes)
    (out / CARD_FILE).write_text(json.dumps(card))
    (out / "MANIFEST.json").write_text(json.dumps(build_manifest(out)))  # a consistent package
    return out


def post(server: Server, body: dict[str, Any], model: str = "vision") -> Any:
    return server.client.post("/v1/decisions", json={"model": model, **body})


def refused(server: Server, body: dict[str, Any], reason: str, limit: float | None = None,
            model: str = "vision") -> dict[str, Any]:
    """Post ``body``: a 400 invalid_request with ``reason`` (and ``limit``), in the contract's shape."""
    r = post(server, body, model)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["reason"]) == ("invalid_request", reason), r.text
    assert error.get("limit") == limit, r.text
    validate_response("/v1/decisions", "post", 400, r.json())
    return error


def answered(server: Server, body: dict[str, Any], model: str = "vision") -> dict[str, Any]:
    """Post ``body``: a 200 in the contract's shape; its answers."""
    r = post(server, body, model)
    assert r.status_code == 200, r.text
    validate_response("/v1/decisions", "post", 200, r.json())
    return r.json()["answers"]  # type: ignore[no-any-return]


def still_serving(server: Server) -> None:
    """A good image request right after a refusal is answered: the refusal cost the server nothing."""
    got = answered(server, {"state": "s", "images": [png_url(sample_image(40, 56, 30))], "questions": NOUL})
    assert got["n"]["type"] == "noul"


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def image_url(image: Image.Image, fmt: str = "PNG") -> str:
    return data_url(f"image/{fmt.lower()}", encoded(image, fmt))


def video_url(data: bytes, mime: str = "video/mp4") -> str:
    return data_url(mime, data)


# ---- hostile media made in process ---------------------------------------------------------


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A valid PNG header claiming ``width x height`` grey pixels, and a few bytes of pixel data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + _png_chunk(b"IEND", b""))


def webp_claiming(width: int, height: int) -> bytes:
    """A lossless WebP whose VP8L header claims ``width x height`` (14 bits each), then a few bytes."""
    payload = b"\x2f" + struct.pack("<I", (width - 1) | ((height - 1) << 14)) + bytes(16)
    riff = b"WEBP" + b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(riff)) + riff


def mp4_claiming_hours(hours: float) -> bytes:
    """A one-second MP4 whose header (movie, track and media durations, sample table) claims ``hours``.

    The edit list that would clip the track back to its real second is renamed to a free box.
    """
    out = bytearray(encode_video("mp4", 1.0, 10, (64, 48)))
    seconds = hours * 3600

    def scale_of(box: bytes) -> int:
        i = out.find(box)
        return int(struct.unpack(">I", out[i + 16:i + 20])[0])

    movie, media = scale_of(b"mvhd"), scale_of(b"mdhd")
    for box, scale in ((b"mvhd", movie), (b"mdhd", media)):  # version 0: duration after the time scale
        i = out.find(box)
        assert out[i + 4] == 0
        out[i + 20:i + 24] = struct.pack(">I", int(seconds * scale))
    i = out.find(b"tkhd")
    out[i + 24:i + 28] = struct.pack(">I", int(seconds * movie))
    i = out.find(b"stts")  # every sample lasts seconds / samples
    entries = struct.unpack(">I", out[i + 8:i + 12])[0]
    samples = sum(struct.unpack(">I", out[i + 12 + 8 * k:i + 16 + 8 * k])[0] for k in range(entries))
    for k in range(entries):
        out[i + 16 + 8 * k:i + 20 + 8 * k] = struct.pack(">I", int(seconds / samples * media))
    i = out.find(b"edts")
    if i >= 0:
        out[i:i + 4] = b"free"
    return bytes(out)


def animated(fmt: str) -> bytes:
    frames = [sample_image(24, 24, s) for s in (31, 32, 33)]
    buf = io.BytesIO()
    frames[0].save(buf, format=fmt, save_all=True, append_images=frames[1:], duration=100)
    return buf.getvalue()


#: Bytes of no container (seeded, so a run is repeatable).
GARBAGE = random.Random(0).randbytes(4096)

HOSTILE = {
    # decompression bombs: tiny files whose headers claim 10^10 and 2.7 * 10^8 pixels, and 20 M
    "png_bomb": (lambda: data_url("image/png", png_claiming(100_000, 100_000)), "images", "image_too_large",
                 16_000_000),
    "png_over_16m": (lambda: data_url("image/png", png_claiming(5000, 4000)), "images", "image_too_large",
                     16_000_000),
    "webp_bomb": (lambda: data_url("image/webp", webp_claiming(16_383, 16_383)), "images", "image_too_large",
                  16_000_000),
    "one_by_20000": (lambda: image_url(Image.new("L", (1, 20_000))), "images", "image_too_large", 200),
    "animated_png": (lambda: data_url("image/png", animated("PNG")), "images", "image_animated", None),
    "animated_webp": (lambda: data_url("image/webp", animated("WEBP")), "images", "image_animated", None),
    # GIF is not served at all, animated or not: named unsupported without a frame read
    "animated_gif": (lambda: data_url("image/gif", animated("GIF")), "images", "image_format_unsupported", None),
    "truncated_png": (lambda: data_url("image/png", encoded(sample_image(64, 64, 34))[:300]), "images",
                      "image_malformed", None),
    "video_claiming_hours": (lambda: video_url(mp4_claiming_hours(10)), "videos", "video_too_long", 300),
    "truncated_video": (lambda: video_url(encode_video("mp4", 2.0, 10, (64, 48))[:700]),
                        "videos", "video_malformed", None),
    # frames 250 times wider than high: each frame is read as an image, within the aspect ratio 200
    "video_aspect_250": (lambda: video_url(encode_video("mp4", 1.0, 10, (4000, 16))), "videos", "video_too_large",
                         200),
    "garbage_video": (lambda: video_url(GARBAGE), "videos", "video_format_unsupported", None),
    # garbage after a real MP4 signature: the container is tried and refused
    "garbage_after_ftyp": (lambda: video_url(encode_video("mp4", 1.0, 10, (64, 48))[:32] + GARBAGE),
                           "videos", "video_malformed", None),
}
