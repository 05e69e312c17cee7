"""Audio: WAV, MP3, FLAC or Ogg bytes -> mono float32 samples at the tower's rate, with PyAV.

The container format is probed from the bytes and must be the one the request declares. The
length limit is checked from the container's duration before decoding when the container states
one, and again while decoding (a header can lie), so an over-long clip stops decoding at the limit.
Channels are averaged into mono (the reference processors expect mono and say the caller averages).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import av
import numpy as np

from edge_runtime.media.errors import MediaError

#: declared input_audio.format -> the FFmpeg demuxer names that hold it
AUDIO_FORMATS: dict[str, tuple[str, ...]] = {
    "wav": ("wav",),
    "mp3": ("mp3",),
    "flac": ("flac",),
    "ogg": ("ogg",),
}


@dataclass(frozen=True)
class AudioLimits:
    """A card's audio limits: bytes as sent and seconds of sound."""

    max_bytes: int
    max_seconds: float


def decode_audio(raw: bytes, limits: AudioLimits, rate: int, declared: str | None = None) -> np.ndarray:
    """Mono float32 samples of ``raw`` resampled to ``rate`` Hz.

    Raises MediaError: audio_too_large (bytes), audio_too_long (seconds), audio_malformed (not
    audio, truncated, no audio stream, no samples), audio_format_unsupported, audio_format_mismatch.
    """
    if len(raw) > limits.max_bytes:
        raise MediaError("audio_too_large", f"the audio is larger than {limits.max_bytes} bytes", limits.max_bytes)
    if declared is not None and declared not in AUDIO_FORMATS:
        raise MediaError("audio_format_unsupported", f"audio format must be one of {sorted(AUDIO_FORMATS)}")
    try:
        container = av.open(io.BytesIO(raw), mode="r", metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError):
        raise MediaError("audio_malformed", "the audio could not be read (not audio, or corrupt)") from None
    try:
        names = set(container.format.name.split(","))
        found = next((fmt for fmt, demuxers in AUDIO_FORMATS.items() if names & set(demuxers)), None)
        if found is None:
            raise MediaError("audio_format_unsupported", f"audio must be one of {sorted(AUDIO_FORMATS)}")
        if declared is not None and found != declared:
            raise MediaError("audio_format_mismatch", f"input_audio.format is {declared} but the bytes are {found}")
        if not container.streams.audio:
            raise MediaError("audio_malformed", "the file holds no audio stream")
        if container.duration is not None and container.duration / 1e6 > limits.max_seconds:
            raise MediaError("audio_too_long", f"the audio is longer than {limits.max_seconds:g} s", limits.max_seconds)
        return _decode(container, limits, rate)
    finally:
        container.close()


def _decode(container: av.container.InputContainer, limits: AudioLimits, rate: int) -> np.ndarray:
    stream = container.streams.audio[0]
    # fltp keeps channels apart so that we average them ourselves (FFmpeg's downmix matrix differs).
    resampler = av.AudioResampler(format="fltp", rate=rate)
    cap = int(limits.max_seconds * rate) + 1
    parts: list[np.ndarray] = []
    total = 0
    try:
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                total = _take(out, parts, total, cap, limits)
        for out in resampler.resample(None):
            total = _take(out, parts, total, cap, limits)
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, OSError):
        raise MediaError("audio_malformed", "the audio is truncated or corrupt") from None
    if total == 0:
        raise MediaError("audio_malformed", "the audio holds no samples")
    return np.concatenate(parts).astype(np.float32, copy=False)


def _take(frame: av.AudioFrame, parts: list[np.ndarray], total: int, cap: int, limits: AudioLimits) -> int:
    samples = frame.to_ndarray()  # [channels, n] float32 (planar)
    mono = samples.mean(axis=0, dtype=np.float32) if samples.shape[0] > 1 else samples[0]
    total += mono.shape[0]
    if total > cap:
        raise MediaError("audio_too_long", f"the audio is longer than {limits.max_seconds:g} s", limits.max_seconds)
    parts.append(np.array(mono, dtype=np.float32, copy=True))
    return total
