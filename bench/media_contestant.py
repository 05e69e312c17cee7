"""The PyTorch side of the image and audio embedding rows: `python -m bench.media_contestant --threads N
--siglip SRC --whisper-ct2 DIR`.

Prints one JSON line when loaded, then answers one JSON line per command on stdin:

    {"op": "embed", "modality": "image"|"audio", "items": [base64 file bytes]} -> {"embeddings": [[float]]}
    {"op": "time", "modality": ..., "items": [...], "n": 5}                     -> {"seconds": [float]}
    {"op": "quit"}

Each call does what a PyTorch user would: images opened with Pillow and read by SiglipImageProcessor
(slow, PIL) into SiglipModel.get_image_features; audio decoded to 16 kHz mono (with the same PyAV
decoder as the server, so both read identical samples), WhisperFeatureExtractor (its default torch
STFT) and the Whisper encoder, averaged over the real frames its attention mask counts. Vectors are
L2-normalised. This module imports torch: never import it into the harness's own process.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.stats import timed


def _loaders(siglip: Path, whisper_ct2: Path, threads: int) -> dict[str, Callable[[list[bytes]], np.ndarray]]:
    import torch
    from PIL import Image
    from transformers import SiglipImageProcessor, SiglipModel, WhisperFeatureExtractor

    from converters.multimodal.ctranslate2_whisper import whisper_encoder_from_ct2
    from edge_runtime.media.audio import AudioLimits, decode_audio

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    model = SiglipModel.from_pretrained(siglip).eval()
    processor = SiglipImageProcessor.from_pretrained(siglip)
    encoder = whisper_encoder_from_ct2(whisper_ct2)
    fe = WhisperFeatureExtractor(feature_size=int(encoder.config.num_mel_bins))

    def images(items: list[bytes]) -> np.ndarray:
        pictures = [Image.open(io.BytesIO(b)).convert("RGB") for b in items]
        with torch.inference_mode():
            pixels = processor(pictures, return_tensors="pt")["pixel_values"]
            out = torch.nn.functional.normalize(model.get_image_features(pixel_values=pixels), dim=-1)
        return out.numpy()

    def audio(items: list[bytes]) -> np.ndarray:
        clips = [decode_audio(b, AudioLimits(1 << 30, 3600), 16000, "wav") for b in items]
        inputs = fe(clips, sampling_rate=16000, return_attention_mask=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = encoder(input_features=inputs["input_features"]).last_hidden_state
            real = encoder._get_feat_extract_output_lengths(inputs["attention_mask"].sum(-1))
            pooled = torch.stack([hidden[i, : int(n)].mean(0) for i, n in enumerate(real)])
            out = torch.nn.functional.normalize(pooled, dim=-1)
        return out.numpy()

    return {"image": images, "audio": audio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.media_contestant")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--siglip", type=Path, required=True)
    parser.add_argument("--whisper-ct2", type=Path, required=True)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    embed = _loaders(args.siglip, args.whisper_ct2, args.threads)
    print(json.dumps({"ready": True, "load_s": time.perf_counter() - started}), flush=True)
    for line in sys.stdin:
        cmd: dict[str, Any] = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            items = [base64.b64decode(x) for x in cmd["items"]]
            fn = embed[cmd["modality"]]
            if cmd["op"] == "embed":
                reply: dict[str, Any] = {"embeddings": fn(items).tolist()}
            else:
                reply = {"seconds": timed(lambda fn=fn, items=items: fn(items), int(cmd["n"]))}
        except Exception as exc:  # reported to the harness, which stops the run with it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
