"""Video intake (edge_runtime.media.video): containers, limits, sampling and pairing, with PyAV-made clips."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from edge_runtime.errors import ApiError
from edge_runtime.media.video import (
    VideoLimits,
    decode_video,
    frame_count,
    sample_frames,
    sniff_container,
)
from edge_runtime.vision_lm.processor import ImageProcessor, ProcessorSettings, pair_frames
from tests.support.media_samples import Pipe, encode_video, write_clip

LIMITS = VideoLimits(max_bytes=4_000_000, max_seconds=10, source_max_pixels=200 * 200, fps=2, max_frames=16)
encode_video.__test__ = False  # type: ignore[attr-defined]


def url(data: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


@pytest.mark.parametrize("kind", ["mp4", "webm", "mov", "mkv"])
def test_containers_decode_and_sample_over_the_whole_clip(kind) -> None:
    data = encode_video(kind, seconds=3.0, fps=10, size=(64, 48))
    assert sniff_container(data) in ("mp4", "matroska")
    frames = sample_frames(data, LIMITS)
    assert abs(frames.seconds - 3.0) < 0.2
    assert len(frames.images) == frame_count(frames.seconds, LIMITS) == 6
    assert frames.times[0] == 0.0 and frames.times == sorted(frames.times)
    assert frames.times[-1] >= 2.5  # spread over the whole clip, the last frame near the end
    levels = [int(np.asarray(im)[..., 0].mean().round()) for im in frames.images]
    assert levels == sorted(levels) and levels[0] < 20  # frames in time order, starting at the first


def test_frame_count_bounds() -> None:
    assert frame_count(0.5, LIMITS) == 4  # at least 4
    assert frame_count(3.4, LIMITS) == 6  # even: frames go in pairs
    assert frame_count(100, LIMITS) == 16  # at most video_max_frames


def test_limits_and_malformed_videos() -> None:
    short = encode_video("mp4", seconds=1.0, fps=10, size=(64, 48))
    with pytest.raises(ApiError) as e:
        sample_frames(encode_video("mp4", seconds=3.0, fps=10, size=(64, 48)),
                      VideoLimits(4_000_000, 2, 200 * 200, 2, 16))
    assert (e.value.reason, e.value.limit) == ("video_too_long", 2)
    with pytest.raises(ApiError) as e:
        sample_frames(short, VideoLimits(4_000_000, 10, 32 * 32, 2, 16))
    assert (e.value.reason, e.value.limit) == ("video_too_large", 32 * 32)
    with pytest.raises(ApiError) as e:
        decode_video(url(short), VideoLimits(100, 10, 200 * 200, 2, 16))
    assert (e.value.reason, e.value.limit) == ("video_too_large", 100)
    with pytest.raises(ApiError) as e:
        sample_frames(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64, LIMITS)  # an MP4 header and nothing after
    assert e.value.reason == "video_malformed"
    with pytest.raises(ApiError) as e:
        sample_frames(short[: len(short) // 2], LIMITS)  # truncated: the index (moov) is at the end
    assert e.value.reason == "video_malformed"
    with pytest.raises(ApiError) as e:
        sample_frames(b"GIF89a" + b"\x00" * 64, LIMITS)
    assert e.value.reason == "video_format_unsupported"
    with pytest.raises(ApiError) as e:
        decode_video("data:video/mp4;base64,@@@", LIMITS)
    assert e.value.reason == "video_malformed"


def test_pairs_are_timestamped_at_the_mean_of_their_frames() -> None:
    frames = sample_frames(encode_video("mp4", seconds=3.0, fps=10, size=(64, 48)), LIMITS)
    processor = ImageProcessor(ProcessorSettings(min_pixels=32 * 32, max_pixels=64 * 64))
    pairs = pair_frames(processor, frames.images, frames.times, 64 * 64)
    assert len(pairs) == 3
    for i, pair in enumerate(pairs):
        assert pair.time == pytest.approx((frames.times[2 * i] + frames.times[2 * i + 1]) / 2)
        assert pair.patches.grid_t == 1 and pair.patches.grid_h * pair.patches.grid_w * 256 <= 64 * 64


def test_a_live_webm_without_duration_gets_one_from_a_packet_scan() -> None:
    import av

    pipe = Pipe()
    write_clip(pipe, "webm", "libvpx", list(range(30)))
    data = bytes(pipe.data)
    assert av.open(io.BytesIO(data)).duration is None  # the premise: no duration in the container
    frames = sample_frames(data, LIMITS)
    assert abs(frames.seconds - 3.0) < 0.2 and len(frames.images) == 6 and not frames.measured


def test_a_header_that_claims_hours_is_refused_before_decoding() -> None:
    buf = io.BytesIO()
    write_clip(buf, "matroska", "mpeg4", [0, 1, 10 * 3600 * 10])  # three frames, the last at 10 hours
    with pytest.raises(ApiError) as e:
        sample_frames(buf.getvalue(), LIMITS)
    assert (e.value.reason, e.value.limit) == ("video_too_long", 10)


def test_seeking_picks_the_frames_decoding_everything_picks(monkeypatch) -> None:
    """A long clip is sampled by seeking to keyframes; the frames are those a full decode picks."""
    import edge_runtime.media.video as video

    data = encode_video("mkv", seconds=24.0, fps=10, size=(64, 48))  # levels cap at 255 past frame 31
    limits = VideoLimits(4_000_000, 60, 200 * 200, 0.25, 16)  # 6 targets, 4.8 s apart
    seeking = sample_frames(data, limits)
    monkeypatch.setattr(video, "SEEK_GAP_SECONDS", 1e9)
    everything = sample_frames(data, limits)
    assert seeking.times == everything.times and len(seeking.times) == 6
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(seeking.images, everything.images))


def test_picked_frames_are_kept_at_the_size_the_model_reads() -> None:
    data = encode_video("mp4", seconds=2.0, fps=10, size=(128, 96))
    frames = sample_frames(data, LIMITS, frame_size=lambda h, w: (h // 2, w // 2))
    assert {im.size for im in frames.images} == {(64, 48)}
