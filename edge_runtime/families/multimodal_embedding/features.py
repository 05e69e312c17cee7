"""Model inputs from decoded media, in numpy: the reference processors' arithmetic, step for step.

Images follow Transformers' (slow, PIL) CLIP and SigLIP image processors: convert to RGB (alpha
dropped), PIL resize (to a fixed size, or the shortest edge), center crop, rescale in
float64 then float32, normalize in float32, channels first. Audio follows WhisperFeatureExtractor's
numpy path: zero-pad or cut to the window, centered reflect-padded STFT with a periodic Hann
window, power spectrum, Slaney (or HTK) mel filters, log10 and Whisper's dynamic-range clamp.
Each spec is the card's preprocess member, written by the converter from the source's processor.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
from PIL import Image

# ---- images -----------------------------------------------------------------------------------


def to_rgb(image: Image.Image) -> Image.Image:
    """Transformers' convert_to_rgb (4.57): Pillow's convert("RGB"), so alpha is dropped, not composited."""
    return image if image.mode == "RGB" else image.convert("RGB")


def _resize_size(width: int, height: int, size: dict[str, int]) -> tuple[int, int]:
    """(width, height) after the processor's resize: fixed, or shortest edge kept in proportion."""
    if "height" in size and "width" in size:
        return int(size["width"]), int(size["height"])
    short_target = int(size["shortest_edge"])
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = short_target, int(short_target * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def image_pixels(image: Image.Image, spec: dict[str, Any]) -> np.ndarray:
    """pixel_values [3, H, W] float32 for one image, as the spec's processor computes them."""
    if spec.get("convert_rgb", True):
        image = to_rgb(image)
    if spec.get("resize"):
        width, height = _resize_size(image.width, image.height, spec["resize"])
        image = image.resize((width, height), resample=Image.Resampling(int(spec.get("resample", 3))))
    pixels = np.array(image)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    crop = spec.get("crop")
    if crop:
        pixels = _center_crop(pixels, int(crop["height"]), int(crop["width"]))
    values: np.ndarray = pixels
    if spec.get("rescale") is not None:
        values = (pixels.astype(np.float64) * float(spec["rescale"])).astype(np.float32)
    if spec.get("mean") is not None:
        values = values.astype(np.float32, copy=False)
        mean = np.array(spec["mean"], dtype=values.dtype)
        std = np.array(spec["std"], dtype=values.dtype)
        values = (values - mean) / std
    return np.ascontiguousarray(values.transpose(2, 0, 1).astype(np.float32, copy=False))


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Transformers' center_crop on HWC: offsets rounded down, zero padding when the image is smaller."""
    h, w = pixels.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return pixels[top:top + height, left:left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((new_h, new_w, pixels.shape[2]), dtype=pixels.dtype)
    top_pad, left_pad = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
    padded[top_pad:top_pad + h, left_pad:left_pad + w] = pixels
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top):min(new_h, top + height), max(0, left):min(new_w, left + width)]


# ---- audio ------------------------------------------------------------------------------------


def _hz_to_mel(freq: np.ndarray | float, scale: str) -> np.ndarray | float:
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + (freq / 700.0))
    mels = 3.0 * np.asarray(freq, dtype=np.float64) / 200.0
    logstep = 27.0 / np.log(6.4)
    if np.ndim(mels) == 0:
        return float(15.0 + np.log(freq / 1000.0) * logstep) if freq >= 1000.0 else float(mels)
    f = np.asarray(freq, dtype=np.float64)
    mels = mels.copy()
    region = f >= 1000.0
    mels[region] = 15.0 + np.log(f[region] / 1000.0) * logstep
    return mels


def _mel_to_hz(mels: np.ndarray, scale: str) -> np.ndarray:
    if scale == "htk":
        return 700.0 * (np.power(10, mels / 2595.0) - 1.0)
    freq = 200.0 * mels / 3.0
    region = mels >= 15.0
    freq[region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[region] - 15.0))
    return freq


@lru_cache(maxsize=8)
def mel_filters(n_freqs: int, n_mels: int, fmin: float, fmax: float, rate: int, norm: str | None,
                scale: str) -> np.ndarray:
    """Triangular mel filters [n_freqs, n_mels] (Transformers' mel_filter_bank, Hz-space triangles)."""
    mel_freqs = np.linspace(_hz_to_mel(fmin, scale), _hz_to_mel(fmax, scale), n_mels + 2)
    filter_freqs = _mel_to_hz(mel_freqs, scale)
    fft_freqs = np.linspace(0, rate // 2, n_freqs)
    diff = np.diff(filter_freqs)
    slopes = np.expand_dims(filter_freqs, 0) - np.expand_dims(fft_freqs, 1)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    if norm == "slaney":
        filters *= np.expand_dims(2.0 / (filter_freqs[2:n_mels + 2] - filter_freqs[:n_mels]), 0)
    filters.setflags(write=False)
    return filters


def _power_spectrogram(waveform: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """|STFT|^2 [n_fft//2+1, frames]: centered, reflect padded, periodic Hann, as audio_utils.spectrogram."""
    padded = np.pad(waveform, [(n_fft // 2, n_fft // 2)], mode="reflect").astype(np.float64)
    window = np.hanning(n_fft + 1)[:-1]
    frames = 1 + (padded.size - n_fft) // hop
    index = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    # The reference stores each FFT in complex64 before taking the magnitude in float64: so do we.
    spectrum = np.fft.rfft(padded[index] * window, axis=-1).astype(np.complex64)
    return (np.abs(spectrum, dtype=np.float64) ** 2).T


def audio_windows(samples: np.ndarray, window: int, long_audio: str) -> list[np.ndarray]:
    """The clip as the tower reads it: consecutive windows of ``window`` samples (the last one
    short) when the card's ``long_audio`` is ``windows``, else the clip whole (``first_window``,
    packages converted before windows: its first window is taken later)."""
    if long_audio != "windows" or samples.shape[0] <= window:
        return [samples]
    return [samples[i: i + window] for i in range(0, samples.shape[0], window)]


def window_samples(spec: dict[str, Any]) -> int:
    """Samples in one window of the tower: Whisper's chunk_length, CLAP's max_length_s."""
    seconds = spec["max_length_s"] if spec.get("log") == "clap_db" else spec["chunk_length"]
    return int(seconds) * int(spec["sampling_rate"])


def whisper_window(samples: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """The samples the tower reads: the first window (chunk_length seconds), zero padded to it."""
    n = int(spec["chunk_length"]) * int(spec["sampling_rate"])
    out = np.zeros(n, dtype=np.float32)
    head = samples[:n]
    out[: head.shape[0]] = head
    return out


def log_mel(samples: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """input_features [n_mels, frames] float32 of one window, WhisperFeatureExtractor's numpy path."""
    waveform = whisper_window(samples, spec)
    n_fft, hop = int(spec["n_fft"]), int(spec["hop_length"])
    filters = mel_filters(n_fft // 2 + 1, int(spec["n_mels"]), float(spec.get("fmin", 0.0)),
                          float(spec.get("fmax", 8000.0)), int(spec["sampling_rate"]), spec.get("norm", "slaney"),
                          spec.get("mel_scale", "slaney"))
    power = _power_spectrogram(waveform, n_fft, hop)
    mel = np.log10(np.maximum(1e-10, np.dot(filters.T, power))).astype(np.float32)
    mel = mel[:, :-1]
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)


def whisper_real_positions(num_samples: int, spec: dict[str, Any], positions: int) -> int:
    """Encoder positions that saw sound, as Transformers counts them for Whisper's attention mask:
    mel frame i is real when its center sample i*hop lies in the clip (ceil(n / hop) frames), and
    the encoder's stride-2 convolution maps f frames to (f - 1) // 2 + 1 positions. Capped at the
    window's positions; at least 1."""
    hop = int(spec["hop_length"])
    window = int(spec["chunk_length"]) * int(spec["sampling_rate"])
    frames = -(-min(num_samples, window) // hop)
    return max(1, min(positions, (max(frames, 1) - 1) // 2 + 1))


def clap_window(samples: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """The samples CLAP's unfused tower reads, in float64 as its feature extractor holds them: a clip
    longer than the window keeps its first window (the reference crops at a random offset, which no
    server may do: answers must not change from call to call); a shorter one is repeated whole as
    many times as it fits, then zero padded ("repeatpad")."""
    n = int(spec["max_length_s"]) * int(spec["sampling_rate"])
    wave = samples.astype(np.float64)
    if wave.shape[0] > n:
        return wave[:n]
    if wave.shape[0] < n:
        wave = np.tile(wave, int(n / len(wave)))
        wave = np.pad(wave, (0, n - wave.shape[0]), mode="constant", constant_values=0)
    return wave


def clap_log_mel(samples: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """input_features [1, frames, n_mels] float32 of ClapFeatureExtractor (truncation rand_trunc,
    Slaney filters, power in dB) on clap_window's samples."""
    n_fft, hop = int(spec["n_fft"]), int(spec["hop_length"])
    filters = mel_filters(n_fft // 2 + 1, int(spec["n_mels"]), float(spec["fmin"]), float(spec["fmax"]),
                          int(spec["sampling_rate"]), spec.get("norm", "slaney"), spec.get("mel_scale", "slaney"))
    power = _power_spectrogram(clap_window(samples, spec), n_fft, hop)
    mel = np.maximum(1e-10, np.dot(filters.T, power))
    db = 10.0 * (np.log10(np.clip(mel, 1e-10, None)) - np.log10(1.0))
    return np.asarray(db, dtype=np.float32).T[None, :]
