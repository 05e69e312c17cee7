"""Reading a multimodal source directory: its config, and the image and audio processing each tower's card
records (equal to the source's processors)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from converters.errors import ConversionError


def read_config(src_dir: Path) -> dict[str, Any]:
    path = src_dir / "config.json"
    if not path.is_file():
        raise ConversionError(f"{src_dir}: no config.json (not a Hugging Face model directory)")
    return json.loads(path.read_text(encoding="utf-8"))


def image_spec(src_dir: Path) -> dict[str, Any]:
    """The image processor's settings as the multimodal family's features.py reads them (slow PIL semantics)."""
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(src_dir, use_fast=False)
    size = dict(proc.size)
    spec: dict[str, Any] = {"convert_rgb": True, "resample": int(proc.resample)}
    if getattr(proc, "do_resize", True):
        spec["resize"] = ({"height": int(size["height"]), "width": int(size["width"])} if "height" in size
                          else {"shortest_edge": int(size["shortest_edge"])})
    if getattr(proc, "do_center_crop", False):
        spec["crop"] = {"height": int(proc.crop_size["height"]), "width": int(proc.crop_size["width"])}
    if getattr(proc, "do_rescale", True):
        spec["rescale"] = float(proc.rescale_factor)
    if getattr(proc, "do_normalize", True):
        spec["mean"] = [float(x) for x in proc.image_mean]
        spec["std"] = [float(x) for x in proc.image_std]
    return spec


def audio_spec(src_dir: Path) -> dict[str, Any]:
    from transformers import WhisperFeatureExtractor

    fe = WhisperFeatureExtractor.from_pretrained(src_dir)
    if getattr(fe, "dither", 0.0):
        raise ConversionError("the feature extractor dithers (random noise): not reproducible; set dither 0")
    return {"sampling_rate": int(fe.sampling_rate), "n_fft": int(fe.n_fft), "hop_length": int(fe.hop_length),
            "n_mels": int(fe.feature_size), "chunk_length": int(fe.chunk_length), "fmin": 0.0, "fmax": 8000.0,
            "norm": "slaney", "mel_scale": "slaney", "log": "whisper"}


def clap_spec(src_dir: Path) -> dict[str, Any]:
    from transformers import ClapFeatureExtractor

    fe = ClapFeatureExtractor.from_pretrained(src_dir)
    if fe.padding != "repeatpad":
        raise ConversionError(f"CLAP padding {fe.padding!r}: only repeatpad is reproduced")
    return {"sampling_rate": int(fe.sampling_rate), "n_fft": int(fe.fft_window_size),
            "hop_length": int(fe.hop_length), "n_mels": int(fe.feature_size), "max_length_s": int(fe.max_length_s),
            "fmin": float(fe.frequency_min), "fmax": float(fe.frequency_max), "norm": "slaney",
            "mel_scale": "slaney", "log": "clap_db", "padding": "repeatpad"}
