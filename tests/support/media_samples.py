"""Test media made in process: encoded audio clips (PyAV) and images (Pillow), plus hostile variants."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable
from typing import Any

import av
import numpy as np
from PIL import Image

#: declared format -> (container, codec) used to write test clips; ogg holds Opus (libvorbis may be absent)
AUDIO_CODECS = {"wav": ("wav", "pcm_s16le"), "flac": ("flac", "flac"), "mp3": ("mp3", "libmp3lame"),
                "ogg": ("ogg", "libopus")}


def tone(seconds: float, rate: int, freq: float = 440.0, seed: int = 0) -> np.ndarray:
    """A sine plus a little deterministic noise, float32 mono in [-0.5, 0.5]."""
    t = np.arange(int(round(seconds * rate))) / rate
    noise = np.random.default_rng(seed).normal(0, 0.02, t.shape)
    return (0.3 * np.sin(2 * np.pi * freq * t) + noise).astype(np.float32)


def encode_audio(samples: np.ndarray, rate: int, fmt: str = "wav", channels: int = 1) -> bytes:
    """Encode mono float32 ``samples`` into ``fmt`` (the same sound on every channel)."""
    container_name, codec = AUDIO_CODECS[fmt]
    rate_out = 48000 if codec == "libopus" else rate
    buf = io.BytesIO()
    out = av.open(buf, "w", format=container_name)
    stream = out.add_stream(codec, rate=rate_out, layout="stereo" if channels == 2 else "mono")
    resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=stream.layout.name, rate=rate_out)
    data = np.stack([samples] * channels).astype(np.float32)
    for start in range(0, data.shape[1], 1024):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data[:, start:start + 1024]), format="fltp",
                                           layout="stereo" if channels == 2 else "mono")
        frame.sample_rate = rate
        for converted in resampler.resample(frame):
            for packet in stream.encode(converted):
                out.mux(packet)
    for converted in resampler.resample(None):
        for packet in stream.encode(converted):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)
    out.close()
    return buf.getvalue()


def picture(width: int, height: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    """A random-pixel image (smooth enough that JPEG keeps its structure)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, size=(max(1, height // 4), max(1, width // 4), len(mode)), dtype=np.uint8)
    image = Image.fromarray(small.squeeze(-1) if len(mode) == 1 else small, mode=mode)
    return image.resize((width, height), Image.Resampling.BILINEAR)


def image_bytes(image: Image.Image, fmt: str = "PNG", **save: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    return buf.getvalue()


def data_url(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def image_part(image: Image.Image, fmt: str = "PNG", mime: str = "image/png") -> dict[str, Any]:
    """An OpenAI image_url content part carrying ``image`` as a data URL."""
    return {"type": "image_url", "image_url": {"url": data_url(image_bytes(image, fmt), mime)}}


def audio_part(raw: bytes, fmt: str = "wav") -> dict[str, Any]:
    """An OpenAI input_audio content part."""
    return {"type": "input_audio", "input_audio": {"data": b64(raw), "format": fmt}}


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _clip(fmt: str, codec: str, fps: int, size: tuple[int, int], frames: Iterable[Any]) -> bytes:
    """``frames`` (PyAV video frames of ``size``, width by height) encoded as one yuv420p clip."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height = size
        stream.pix_fmt = "yuv420p"
        for frame in frames:
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def video_bytes(seconds: float, fps: int, size: tuple[int, int], fmt: str = "mp4", codec: str = "mpeg4") -> bytes:
    """A clip of ``size`` (width, height) whose frame k is a flat grey of luma 16 + 8 * k: cheap to
    encode and small at any size, while decoding it still costs every frame's full size."""
    width, height = size

    def frame(k: int) -> Any:
        # yuv420p planes stacked (Y, then U and V at half size): no RGB conversion to pay per frame
        planes = np.full((height * 3 // 2, width), 128, dtype=np.uint8)
        planes[:height] = min(16 + 8 * k, 235)
        return av.VideoFrame.from_ndarray(planes, format="yuv420p")

    return _clip(fmt, codec, fps, size, (frame(k) for k in range(int(round(seconds * fps)))))


#: container -> (PyAV format, codec) of the test clips
VIDEO_CODECS = {"mp4": ("mp4", "mpeg4"), "webm": ("webm", "libvpx"), "mov": ("mov", "mpeg4"),
                "mkv": ("matroska", "mpeg4")}


def encode_video(kind: str, seconds: float, fps: int, size: tuple[int, int]) -> bytes:
    """A clip whose frame k is a flat grey of level 8 * k (so a frame's index is readable back)."""
    fmt, codec = VIDEO_CODECS[kind]
    frames = (av.VideoFrame.from_ndarray(np.full((size[1], size[0], 3), min(8 * k, 255), dtype=np.uint8),
                                         format="rgb24") for k in range(int(round(seconds * fps))))
    return _clip(fmt, codec, fps, size, frames)


class Pipe(io.RawIOBase):
    """A write-only, unseekable sink: the muxer cannot go back to write the duration."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b) -> int:  # type: ignore[override]
        self.data += bytes(b)
        return len(b)


def write_clip(sink, fmt: str, codec: str, pts: list[int], fps: int = 10) -> None:
    import av

    with av.open(sink, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for k, p in enumerate(pts):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 8 * k, dtype=np.uint8), format="rgb24")
            frame.pts = p
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
