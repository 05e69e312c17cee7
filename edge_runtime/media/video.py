"""Videos: data URLs in, sampled timestamped frames out (PyAV, Pillow, numpy).

Intake (``decode_video``): a base64 data URL of MP4, QuickTime, WebM or Matroska (the container is
read from the bytes), refused before any frame is decoded when it breaks a limit:
``video_max_bytes`` (video_too_large), ``video_max_seconds`` (video_too_long; a container without
a duration gets one from a demux-only packet scan, which reads no pixels), and
``video_source_max_pixels`` per frame and the contract's aspect ratio 200 (video_too_large).
Broken or truncated data is video_malformed, another container video_format_unsupported.

Sampling: ``video_fps`` frames per second over the whole clip, at least 4 and at most
``video_max_frames`` (an even count: frames go in pairs), at times ``linspace(0, duration, k)``,
each taken as the decoded frame nearest to its time (times are pts minus the stream's start, so
MPEG-TS-like offsets do not shift them). Targets more than SEEK_GAP_SECONDS apart are reached by
seeking to the keyframe before them, which picks the same frames as decoding everything. Only the
picked frames are converted to RGB, at once to the size the model reads them.

How a model reads the frames (Qwen3-VL: in pairs) is its own: edge_runtime/vision_lm/processor.py.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from edge_runtime.errors import ApiError
from edge_runtime.media.dataurl import parse_data_url
from edge_runtime.media.errors import MediaError
from edge_runtime.media.image import MAX_ASPECT_RATIO

MIN_FRAMES = 4
_EBML = b"\x1a\x45\xdf\xa3"
_MP4_ATOMS = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")


@dataclass(frozen=True)
class VideoLimits:
    """The card's video limits."""

    max_bytes: int
    max_seconds: float
    source_max_pixels: int
    fps: float
    max_frames: int


@dataclass(frozen=True)
class Frames:
    """Decoded frames (RGB) at their times, and the clip's length."""

    images: list[Image.Image]
    times: list[float]
    seconds: float
    measured: bool = True


def check_video_tokens(limit: int, tokens: int) -> None:
    """video_tokens: a request's videos take ``tokens`` (or more), past the model's video_max_tokens ``limit``."""
    if tokens > limit:
        raise ApiError("invalid_request", f"the request's videos take {tokens} tokens or more, more than the "
                       f"model's video_max_tokens {limit}", reason="video_tokens", limit=limit)


def sniff_container(data: bytes) -> str | None:
    """'mp4' (MP4 and QuickTime) or 'matroska' (WebM and Matroska) from the bytes, else None."""
    if data.startswith(_EBML):
        return "matroska"
    if len(data) >= 8 and data[4:8] in _MP4_ATOMS:
        return "mp4"
    return None


def frame_count(seconds: float, limits: VideoLimits) -> int:
    """How many frames a clip of ``seconds`` is read at: fps over the clip, 4 to max_frames, even."""
    k = int(round(seconds * limits.fps))
    k = max(MIN_FRAMES, min(limits.max_frames, k))
    return k - k % 2


def _scan_duration(container: Any, stream: Any) -> float | None:
    """The clip's length from its packets' timestamps (demux only, no decoding)."""
    end = None
    start = stream.start_time or 0
    for packet in container.demux(stream):
        if packet.pts is None:
            continue
        last = packet.pts + (packet.duration or 0)
        end = last if end is None else max(end, last)
    if end is None or stream.time_base is None:
        return None
    return float((end - start) * stream.time_base)


def open_video(data: bytes, limits: VideoLimits) -> tuple[Any, Any, float, bool]:
    """The open container, its video stream, its length and whether the container stated it
    (False: a packet scan measured it), within the limits (nothing decoded)."""
    import av

    kind = sniff_container(data)
    if kind is None:
        raise MediaError("video_format_unsupported", "the video is not MP4, QuickTime, WebM or Matroska")
    try:
        container: Any = av.open(io.BytesIO(data), mode="r", format="mp4" if kind == "mp4" else "matroska")
    except Exception:  # noqa: BLE001 - PyAV raises InvalidDataError and friends for broken headers
        raise MediaError("video_malformed", "the video's container cannot be read") from None
    try:
        streams = container.streams.video
        if not streams:
            raise MediaError("video_malformed", "the video has no video stream")
        stream = streams[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if not width or not height:
            raise MediaError("video_malformed", "the video stream has no frame size")
        if width * height > limits.source_max_pixels:
            raise MediaError("video_too_large", f"the video's frames have {width * height} pixels ({width}x{height}), "
                             f"more than {limits.source_max_pixels}", limits.source_max_pixels)
        if max(width, height) / min(width, height) > MAX_ASPECT_RATIO:  # each frame is read as an image
            raise MediaError("video_too_large", f"the video's frames ({width}x{height}) have an aspect ratio over "
                             f"{MAX_ASPECT_RATIO}", MAX_ASPECT_RATIO)
        seconds = container.duration / 1_000_000 if container.duration else None
        if seconds is None and stream.duration and stream.time_base is not None:
            seconds = float(stream.duration * stream.time_base)
        measured = seconds is not None
        if seconds is None:
            seconds = _scan_duration(container, stream)
            container.seek(0)
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            raise MediaError("video_malformed", "the video's length cannot be read")
        if seconds > limits.max_seconds:
            raise MediaError("video_too_long", f"the video is {seconds:.1f} s long, more than {limits.max_seconds:g} s",
                          limits.max_seconds)
        return container, stream, seconds, measured
    except MediaError:
        container.close()
        raise
    except Exception:  # noqa: BLE001
        container.close()
        raise MediaError("video_malformed", "the video's container cannot be read") from None


#: ``check(frames, width, height)``: called before any frame is decoded; may raise to refuse the clip.
BeforeDecode = Callable[[int, int, int], None]


#: Targets further apart than this are reached by seeking to the keyframe before them instead of
#: decoding every frame between (a long clip then costs its keyframe intervals, not its length).
SEEK_GAP_SECONDS = 2.0

#: ``frame_size(height, width) -> (height, width)``: the size a picked frame is kept at, so that a
#: clip of many large frames holds only small ones (768 frames of 8 MP would be gigabytes).
FrameSize = Callable[[int, int], tuple[int, int]]


def rgb_image(frame: Any) -> Image.Image:
    """A decoded video frame as an RGB image: ``frame.to_image()``'s pixels, copied once.

    to_image copies the converted frame row by row, then whole twice more, holding the GIL:
    74 ms per 3840 x 2160 frame, all of which /health/live waited for. The same rgb24 conversion
    read by Pillow's raw decoder is one copy that lets other threads run (8 ms at most).
    """
    plane = frame.reformat(format="rgb24").planes[0]
    if plane.line_size < 0:  # bottom-up rows: to_image knows how to turn them
        return frame.to_image()
    return Image.frombytes("RGB", (plane.width, plane.height), plane, "raw", "RGB", plane.line_size, 1)


def sample_frames(data: bytes, limits: VideoLimits, before_decode: BeforeDecode | None = None,
                  frame_size: FrameSize | None = None) -> Frames:
    """The frames the model reads (see the module docstring), each the decoded frame nearest its time."""
    container, stream, seconds, measured = open_video(data, limits)
    k = frame_count(seconds, limits)
    width, height = stream.codec_context.width, stream.codec_context.height
    if before_decode is not None:
        try:
            before_decode(k, width, height)
        except BaseException:
            container.close()
            raise
    size = frame_size(height, width) if frame_size is not None else (height, width)
    targets = [float(t) for t in np.linspace(0.0, seconds, k)]
    picked: list[tuple[float, Image.Image] | None] = [None] * k
    start = stream.start_time or 0
    kept: dict[float, Image.Image] = {}

    def keep(t: float, frame: Any) -> tuple[float, Image.Image]:
        # converted (and shrunk) once when picked, keyed by its time (unique in a stream): later
        # frames never hold a full-size copy, and a frame picked for two targets is converted once
        if t not in kept:
            image = rgb_image(frame)
            if image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), resample=Image.Resampling.BICUBIC)
            kept.clear()  # targets are in order: only the latest pick can be picked again
            kept[t] = image
        return t, kept[t]

    def frames_from(seek_to: float | None) -> Iterator[tuple[float, Any]]:
        if seek_to is not None:  # to the keyframe at or before the target
            container.seek(start + int(seek_to / stream.time_base), stream=stream, backward=True)
        for frame in container.decode(stream):
            if frame.pts is not None:
                yield float((frame.pts - start) * stream.time_base), frame

    try:
        # one decoding thread: FFmpeg's frame threads would take every core beside the event loop (a
        # /health/live answer then waited ~200 ms on 2 cores); the frames are the same either way
        stream.thread_count = 1
        j = 0
        prev: tuple[float, Any] | None = None
        source = frames_from(None)
        while j < k:
            item = next(source, None)
            if item is None:  # the stream ended: the targets past the last frame take the last frame
                while prev is not None and j < k:
                    picked[j] = keep(*prev)
                    j += 1
                break
            t, frame = item
            while j < k and t >= targets[j]:
                near_prev = prev is not None and targets[j] - prev[0] < t - targets[j]
                picked[j] = keep(*(prev if near_prev and prev is not None else (t, frame)))
                j += 1
            prev = (t, frame)
            if j < k and targets[j] - t > SEEK_GAP_SECONDS:
                source, prev = frames_from(targets[j]), None
    except Exception:  # noqa: BLE001 - corrupt packets
        raise MediaError("video_malformed", "the video's frames cannot be decoded") from None
    finally:
        container.close()
    if any(p is None for p in picked):
        raise MediaError("video_malformed", "the video has no decodable frames")
    return Frames([p[1] for p in picked if p is not None], [p[0] for p in picked if p is not None], seconds, measured)


def decode_video(url: Any, limits: VideoLimits, before_decode: BeforeDecode | None = None,
                 frame_size: FrameSize | None = None) -> Frames:
    """The sampled frames of a base64 data URL (see sample_frames)."""
    _, data = parse_data_url(url, limits.max_bytes, "video")  # the container is read from the bytes
    return sample_frames(data, limits, before_decode, frame_size)


__all__ = ["BeforeDecode", "FrameSize", "Frames", "MIN_FRAMES", "VideoLimits", "decode_video", "frame_count",
           "open_video", "sample_frames", "sniff_container"]
