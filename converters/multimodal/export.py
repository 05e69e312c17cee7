"""`export --kind image-text-embedding | audio-embedding`: one ONNX graph per tower, parity recorded.

Supported sources (Hugging Face directories):
- image-text-embedding: SigLIP (``SiglipModel``) and CLIP (``CLIPModel``) dual encoders. The text
  tower is ``get_text_features`` and the image tower ``get_image_features`` (projected, before
  normalisation); both land in one space, normalised by the runtime.
- audio-embedding: Whisper encoders (``WhisperModel`` / ``WhisperForConditionalGeneration``): the
  graph returns ``last_hidden_state`` of one window and the runtime averages the positions that
  saw sound (``mean_real_frames``); audio longer than the window is read from its first window.

Each tower is traced with the TorchScript exporter at opset 18 (dynamic batch axis; dynamic length
for text) and checked against PyTorch on the inputs the server itself computes: token ids from the
package tokenizer, pixels and log-mel features from edge_runtime.families.multimodal_embedding.features. The numpy
preprocessing is also compared with the source's own (slow) processor. Parity is recorded in the
card's verification member, per tower; an export above the tolerance is refused.

``--quantize int8`` adds the exact int8 of every tower (converters.multimodal.quantize_towers): the
package's ``int8`` variant is the primary tower's int8 graph, and each tower's ``variants.int8`` names
its graph, golden cases, measured agreement with fp32, integer-product check and batch check.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from converters import CONVERTER_VERSION
from converters.errors import ConversionError
from converters.identity import PackageIdentity, identity_card, notice_files, sanitize_name
from converters.multimodal.ctranslate2_whisper import is_ct2_whisper
from converters.multimodal.source import audio_spec, clap_spec, image_spec, read_config
from converters.multimodal.verify import TOLERANCE, compare, sample_clips, sample_images, tower_session
from converters.package_writer import ExportResult, PackageBuild, card_start
from converters.progress import log
from converters.source import package_tokenizer, resolve_source, source_stamp
from converters.verify import torch_reference
from edge_runtime.packages.golden import golden_bytes

MULTIMODAL_KINDS = ("image-text-embedding", "audio-embedding")
OPSET = 18
#: card limits written unless the options say otherwise (bytes as sent; pixels of the source image).
#: 16 MP: a decoded RGB source of 48 MB, which a few concurrent requests on a small edge node can hold;
#: every tower reads 224-384 px, so larger photos gain nothing but memory. Audio: 5 minutes (10
#: Whisper windows of 30 s, 19 MB of decoded samples) is the budget long clips are read in windows to.
DEFAULT_LIMITS = {"image_max_bytes": 10 * 1024 * 1024, "image_source_max_pixels": 16_000_000,
                  "audio_max_bytes": 25 * 1024 * 1024, "audio_max_seconds": 300}
SAMPLE_TEXTS = ("a photo of a cat", "two dogs playing in the snow on a sunny winter afternoon",
                "Überweisung fehlgeschlagen: Konto gesperrt?", "x")


@dataclass
class MultimodalOptions(PackageIdentity):
    """What to export; identity fields as for every package (converters.identity.PackageIdentity)."""

    kind: str
    dimensions: list[int] = field(default_factory=list)
    #: card limits to write instead of DEFAULT_LIMITS (image_max_bytes, audio_max_seconds, ...)
    limits: dict[str, int | float] = field(default_factory=dict)
    #: "int8": also write the exact int8 of every tower (converters.multimodal.quantize_towers)
    quantize: str | None = None


@dataclass
class TowerSamples:
    """What a tower's int8 is calibrated on (its parity samples), the inputs its agreement is measured on
    (built only when quantizing), what those are, and how the runtime pools its output."""

    calibration: list[dict[str, np.ndarray]]
    agreement: Callable[[], list[dict[str, np.ndarray]]]
    described: str
    pool: Callable[[np.ndarray, int], np.ndarray] | None = None


# ---- tower wrappers (torch modules built lazily: the module imports without torch) --------------


def _wrappers() -> dict[str, Any]:
    import torch

    class TextTower(torch.nn.Module):
        def __init__(self, model: Any, with_mask: bool) -> None:
            super().__init__()
            self.model, self.with_mask = model, with_mask

        def forward(self, input_ids: Any, attention_mask: Any = None) -> Any:
            if self.with_mask:
                return self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
            return self.model.get_text_features(input_ids=input_ids)

    class ImageTower(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model.get_image_features(pixel_values=pixel_values)

    class AudioTower(torch.nn.Module):
        def __init__(self, encoder: Any) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_features: Any) -> Any:
            return self.encoder(input_features=input_features).last_hidden_state

    class ClapAudioTower(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_features: Any) -> Any:
            return self.model.get_audio_features(input_features=input_features)

    return {"text": TextTower, "image": ImageTower, "audio": AudioTower, "clap_audio": ClapAudioTower}


def _export(module: Any, args: tuple, path: Path, inputs: list[str], output: str,
            axes: dict[str, dict[int, str]]) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings: noise; parity below is the judge
        torch.onnx.export(module.eval(), args, str(path), input_names=inputs, output_names=[output],
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    return path


# ---- export -----------------------------------------------------------------------------------


def _text_tower(model: Any, src_dir: Path, work: Path, arch: str
                ) -> tuple[dict, dict, dict, dict, int, TowerSamples]:
    """(tower, files, goldens, verification, max tokens, samples) of a dual encoder's text tower (model.onnx)."""
    import torch

    wrappers = _wrappers()
    tok = package_tokenizer(src_dir)
    text_cfg = model.config.text_config
    # CLAP's text tower is RoBERTa: positions start after the padding index, so two fewer tokens fit.
    max_pos = int(text_cfg.max_position_embeddings) - (2 if arch == "clap" else 0)
    siglip = arch == "siglip"
    pad_id = int(text_cfg.pad_token_id if text_cfg.pad_token_id is not None else 0)
    # SigLIP was trained on text padded to its full length with no mask ("padding=max_length" in
    # its model card); CLIP and CLAP read a mask, so they are padded only in batches.
    text_inputs = ["input_ids"] if siglip else ["input_ids", "attention_mask"]

    def text_feeds_of(texts: Sequence[str]) -> list[dict[str, np.ndarray]]:
        out = []
        for text in texts:
            ids = np.array(tok.encode(text).ids[:max_pos], dtype=np.int64)
            padded = np.full((1, max_pos if siglip else len(ids)), pad_id, dtype=np.int64)
            padded[0, : len(ids)] = ids
            feeds = {"input_ids": padded}
            if not siglip:
                feeds["attention_mask"] = np.ones_like(padded)
            out.append(feeds)
        return out

    text_feeds = text_feeds_of(SAMPLE_TEXTS)
    wrapper = wrappers["text"](model, not siglip)
    path = _export(wrapper, tuple(torch.from_numpy(text_feeds[1][k]) for k in text_inputs), work / "model.onnx",
                   text_inputs, "text_embeds",
                   {**{k: {0: "batch", 1: "sequence"} for k in text_inputs}, "text_embeds": {0: "batch"}})
    session = tower_session(path)
    diff, cases = compare("text", session, wrapper, text_feeds)
    log(f"text tower: max |onnx - torch| = {diff:.3g}")
    dim = int(session.run(None, text_feeds[0])[0].shape[-1])
    tower = {"graph": "model.onnx", "golden": "golden.npz", "inputs": text_inputs, "output": "text_embeds",
             "dimension": dim, "layers": int(text_cfg.num_hidden_layers), "pooling": "none",
             "text": {"pad_to": max_pos if siglip else None, "pad_id": pad_id}}
    from converters.multimodal.quantize_towers import TEXT_AGREEMENT_STEP
    from converters.quantize import REAL_SENTENCES_SOURCE, real_sentences

    sentences = real_sentences()[::TEXT_AGREEMENT_STEP]
    samples = TowerSamples(text_feeds, lambda: text_feeds_of(sentences),
                           f"{len(sentences)} real sentences: every {TEXT_AGREEMENT_STEP}th of the "
                           f"{REAL_SENTENCES_SOURCE}")
    return (tower, {"model.onnx": path, "tokenizer.json": tok.to_str().encode("utf-8")},
            {"golden.npz": _goldens(session, text_feeds[:2], "text_embeds")},
            {"max_abs_diff": diff, "cases": cases}, max_pos, samples)


def _image_text(model: Any, src_dir: Path, work: Path, arch: str) -> tuple[dict, dict, dict, dict]:
    """(towers, files, goldens by golden file, extra) for a SigLIP or CLIP model."""
    import torch
    from transformers import AutoImageProcessor

    from edge_runtime.families.multimodal_embedding.features import image_pixels

    text, files, goldens, text_check, max_pos, text_samples = _text_tower(model, src_dir, work, arch)
    wrapper = _wrappers()["image"](model)
    spec = image_spec(src_dir)
    proc = AutoImageProcessor.from_pretrained(src_dir, use_fast=False)
    pixel_feeds, prep_diff = [], 0.0
    for img in sample_images():
        ours = image_pixels(img, spec)[None]
        ref = proc(img.convert("RGB"), return_tensors="np")["pixel_values"]
        prep_diff = max(prep_diff, float(np.max(np.abs(ours - ref))))
        pixel_feeds.append({"pixel_values": ours})
    log(f"image preprocessing: max |numpy - {type(proc).__name__}| = {prep_diff:.3g}")
    image_path = _export(wrapper, (torch.from_numpy(pixel_feeds[0]["pixel_values"]),),
                         work / "towers" / "image.onnx", ["pixel_values"], "image_embeds",
                         {"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}})
    image_session = tower_session(image_path)
    image_diff, image_cases = compare("image", image_session, wrapper, pixel_feeds)
    log(f"image tower: max |onnx - torch| = {image_diff:.3g}")
    vcfg = model.config.vision_config
    height, width = pixel_feeds[0]["pixel_values"].shape[2:]
    patches = (height // int(vcfg.patch_size)) * (width // int(vcfg.patch_size))
    towers = {
        "text": text,
        "image": {"graph": "towers/image.onnx", "golden": "towers/image.golden.npz", "inputs": ["pixel_values"],
                  "output": "image_embeds", "dimension": text["dimension"], "layers": int(vcfg.num_hidden_layers),
                  "pooling": "none", "preprocess": spec, "tokens": patches},
    }
    goldens["towers/image.golden.npz"] = _goldens(image_session, pixel_feeds[:2], "image_embeds")
    files["towers/image.onnx"] = image_path
    verification = {"text": text_check,
                    "image": {"max_abs_diff": image_diff, "cases": image_cases,
                              "preprocess_max_abs_diff": prep_diff,
                              "preprocess_reference": f"{type(proc).__name__} (slow, PIL)"}}
    from converters.multimodal.quantize_towers import AGREEMENT_IMAGES, agreement_images

    image_samples = TowerSamples(pixel_feeds, lambda: [{"pixel_values": image_pixels(img, spec)[None]}
                                                       for img in agreement_images()],
                                 f"{AGREEMENT_IMAGES} generated images (gradients with drawn shapes, 24-160 px, "
                                 "seed 101)")
    return towers, files, goldens, {"verification": verification, "max_tokens": max_pos,
                                    "samples": {"text": text_samples, "image": image_samples}}


def _clap(model: Any, src_dir: Path, work: Path) -> tuple[dict, dict, dict, dict]:
    """(towers, files, goldens, extra) for an unfused CLAP model: text and audio in one space."""
    import torch
    from transformers import ClapFeatureExtractor

    from edge_runtime.families.multimodal_embedding.features import clap_log_mel, clap_window

    acfg = model.config.audio_config
    if getattr(acfg, "enable_fusion", False):
        raise ConversionError("fused CLAP reads a data-dependent is_longer flag that ONNX Runtime cannot run; "
                              "export an unfused checkpoint (clap-htsat-unfused)")
    text, files, goldens, text_check, max_pos, text_samples = _text_tower(model, src_dir, work, "clap")
    spec = clap_spec(src_dir)
    fe = ClapFeatureExtractor.from_pretrained(src_dir)
    feeds, prep_diff = [], 0.0
    for clip in sample_clips(spec["sampling_rate"], spec["max_length_s"]):
        ours = clap_log_mel(clip, spec)[None]
        # The reference crops long clips at a random offset; compare on the window we take (offset 0).
        ref = fe._np_extract_fbank_features(clap_window(clip, spec), fe.mel_filters_slaney)[None, None]
        if len(clip) <= spec["max_length_s"] * spec["sampling_rate"]:
            ref = fe(clip, sampling_rate=spec["sampling_rate"], truncation="rand_trunc",
                     return_tensors="np")["input_features"]
        prep_diff = max(prep_diff, float(np.max(np.abs(ours - ref))))
        feeds.append({"input_features": ours})
    log(f"CLAP log-mel: max |numpy - ClapFeatureExtractor| = {prep_diff:.3g}")
    wrapper = _wrappers()["clap_audio"](model)
    path = _export(wrapper, (torch.from_numpy(feeds[0]["input_features"]),), work / "towers" / "audio.onnx",
                   ["input_features"], "audio_embeds", {"input_features": {0: "batch"}, "audio_embeds": {0: "batch"}})
    session = tower_session(path)
    diff, cases = compare("audio", session, wrapper, feeds)
    log(f"audio tower: max |onnx - torch| = {diff:.3g}")
    patches = (int(acfg.spec_size) // int(acfg.patch_size)) ** 2
    towers = {
        "text": text,
        "audio": {"graph": "towers/audio.onnx", "golden": "towers/audio.golden.npz", "inputs": ["input_features"],
                  "output": "audio_embeds", "dimension": text["dimension"], "layers": int(sum(acfg.depths)),
                  "pooling": "none", "tokens": patches, "long_audio": "windows", "preprocess": spec},
    }
    goldens["towers/audio.golden.npz"] = _goldens(session, feeds[:1], "audio_embeds")
    files["towers/audio.onnx"] = path
    verification = {"text": text_check,
                    "audio": {"max_abs_diff": diff, "cases": cases, "preprocess_max_abs_diff": prep_diff,
                              "preprocess_reference": "ClapFeatureExtractor (rand_trunc, first window)"}}
    from converters.multimodal.quantize_towers import AGREEMENT_CLIPS, agreement_clips

    rate, window_s = spec["sampling_rate"], spec["max_length_s"]
    audio_samples = TowerSamples(feeds, lambda: [{"input_features": clap_log_mel(c, spec)[None]}
                                                 for c in agreement_clips(rate, window_s)],
                                 f"{AGREEMENT_CLIPS} generated clips (chirps, harmonic stacks, noise bursts; "
                                 "seed 202)")
    return towers, files, goldens, {"verification": verification, "max_tokens": max_pos,
                                    "samples": {"text": text_samples, "audio": audio_samples}}


def _audio(model: Any, src_dir: Path, work: Path) -> tuple[dict, dict, dict, dict]:
    """(towers, files, goldens, extra) for a Whisper encoder; src_dir holds its feature extractor."""
    import torch
    from transformers import WhisperFeatureExtractor

    from edge_runtime.families.multimodal_embedding.features import log_mel, whisper_real_positions

    encoder = model if type(model).__name__ == "WhisperEncoder" else model.get_encoder()
    spec = audio_spec(src_dir)
    fe = WhisperFeatureExtractor.from_pretrained(src_dir)
    positions = int(model.config.max_source_positions)
    feeds, prep_diff, reals = [], 0.0, []
    for clip in sample_clips(spec["sampling_rate"], spec["chunk_length"]):
        ours = log_mel(clip, spec)[None]
        window = np.zeros(fe.n_samples, dtype=np.float32)
        window[: min(len(clip), fe.n_samples)] = clip[: fe.n_samples]
        ref = fe._np_extract_fbank_features(window[None], "cpu")
        prep_diff = max(prep_diff, float(np.max(np.abs(ours - ref))))
        feeds.append({"input_features": ours})
        reals.append(whisper_real_positions(len(clip), spec, positions))
    log(f"log-mel: max |numpy - WhisperFeatureExtractor (numpy path)| = {prep_diff:.3g}")
    wrapper = _wrappers()["audio"](encoder)
    path = _export(wrapper, (torch.from_numpy(feeds[0]["input_features"]),), work / "model.onnx",
                   ["input_features"], "last_hidden_state",
                   {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}})
    session = tower_session(path)

    # Each row is pooled over its own clip's real positions, alone and in the batch of all clips.
    def pool(hidden: np.ndarray, i: int, offset: int = 0) -> np.ndarray:
        return hidden[: reals[i + offset]].astype(np.float64).mean(axis=0)

    diff, cases = 0.0, 0
    for i, f in enumerate(feeds):
        d, n = compare("audio", session, wrapper, [f], pool=partial(pool, offset=i))
        diff, cases = max(diff, d), cases + n
    d, n = compare("audio", session, wrapper, feeds, pool=pool)
    diff, cases = max(diff, d), cases + n - len(feeds)  # the alone runs were counted above
    log(f"audio tower (mean over real frames): max |onnx - torch| = {diff:.3g}")
    dim = int(session.run(None, feeds[0])[0].shape[-1])
    towers = {"audio": {"graph": "model.onnx", "golden": "golden.npz", "inputs": ["input_features"],
                        "output": "last_hidden_state", "dimension": dim,
                        "layers": int(model.config.encoder_layers), "pooling": "mean_real_frames",
                        "positions": positions, "long_audio": "windows", "preprocess": spec}}
    goldens = {"golden.npz": _goldens(session, feeds[:1], "last_hidden_state")}
    verification = {"audio": {"max_abs_diff": diff, "cases": cases, "preprocess_max_abs_diff": prep_diff,
                              "preprocess_reference": "WhisperFeatureExtractor numpy path"}}
    from converters.multimodal.quantize_towers import AGREEMENT_CLIPS, agreement_clips

    rate, window_s = spec["sampling_rate"], spec["chunk_length"]
    clips = agreement_clips(rate, window_s)
    clip_reals = [whisper_real_positions(len(c), spec, positions) for c in clips]

    def pool_real(hidden: np.ndarray, i: int) -> np.ndarray:  # the runtime's mean over real positions
        return hidden[: clip_reals[i]].astype(np.float64).mean(axis=0)

    samples = TowerSamples(feeds, lambda: [{"input_features": log_mel(c, spec)[None]} for c in clips],
                           f"{AGREEMENT_CLIPS} generated clips (chirps, harmonic stacks, noise bursts; seed 202), "
                           "pooled over their real positions", pool_real)
    return towers, {"model.onnx": path}, goldens, {"verification": verification, "max_tokens": positions,
                                                   "samples": {"audio": samples}}


def _quantize(towers: dict[str, Any], files: dict[str, Any], goldens: dict[str, list],
              samples: dict[str, TowerSamples], work: Path, variant: str) -> tuple[dict[str, Any], list]:
    """The exact int8 of every tower: each tower's ``variants.int8`` (graph, golden, agreement, integer
    check), its files and goldens added in place; returns the card's variant entry and the primary
    tower's golden cases (the package variant's own)."""
    from converters import quantize
    from converters.multimodal import quantize_towers

    if variant != "int8":
        raise ConversionError(f"--quantize {variant} does not apply to multimodal packages (int8: the exact "
                              "per-token recipe; a dynamic one would make a row depend on its batch)")
    agreements: dict[str, dict[str, Any]] = {}
    primary_cases: list = []
    for name, tower in towers.items():
        sample = samples[name]
        primary = tower["graph"] == "model.onnx"
        graph = quantize.variant_file(variant) if primary else tower["graph"].replace(".onnx", f".{variant}.onnx")
        golden = f"golden.{variant}.npz" if primary else tower["golden"].replace(".golden.npz",
                                                                                f".{variant}.golden.npz")
        path, agreement, check, invariance = quantize_towers.quantize_tower(
            files[tower["graph"]], work / graph, sample.calibration, sample.agreement(), tower["output"],
            sample.described, sample.pool)
        log(f"{name} tower {variant}: agreement {agreement}; integer products exact over {check['gemms']} GEMMs; "
            f"batch invariance {invariance}")
        session = tower_session(path)
        output = tower["output"]
        cases = [(dict(f), {output: session.run([output], f)[0]}) for f, _ in goldens[tower["golden"]]]
        files[graph] = path
        if primary:
            primary_cases = cases
        else:
            goldens[golden] = cases
        tower["variants"] = {variant: {"graph": graph, "golden": golden, "agreement": agreement,
                                       "integer_products": check, "batch_invariance": invariance}}
        agreements[name] = agreement
    entry = quantize.variant_entry(variant, quantize_towers.variant_agreement(agreements), quantize_towers.RECIPE)
    return entry, primary_cases


def _goldens(session: Any, feeds_list: list[dict[str, np.ndarray]], output: str) -> list:
    return [(dict(f), {output: session.run([output], f)[0]}) for f in feeds_list]


@dataclass
class MultimodalSource:
    """A loaded source: the model (or a CTranslate2 Whisper encoder), where its processor settings are, its
    config."""

    src_dir: Path
    model: Any
    processor_dir: Path
    config: dict[str, Any]


def _source(src_dir: Path, opts: MultimodalOptions, work: Path, build: PackageBuild) -> MultimodalSource:
    """Load the model (a CTranslate2 Whisper directory: its encoder, with Whisper's standard features)."""
    if opts.kind == "audio-embedding" and is_ct2_whisper(src_dir):
        from transformers import WhisperFeatureExtractor

        from converters.multimodal.ctranslate2_whisper import whisper_encoder_from_ct2

        with build.step("load", f"reading the CTranslate2 Whisper encoder in {src_dir}"):
            encoder = whisper_encoder_from_ct2(src_dir)
        # CTranslate2 directories hold no preprocessor_config.json: Whisper's own defaults (30 s
        # windows at 16 kHz, 400-point FFT, hop 160) with the model's mel count.
        features = work / "ct2-features"
        WhisperFeatureExtractor(feature_size=int(encoder.config.num_mel_bins)).save_pretrained(features)
        config = {"model_type": "whisper", "architectures": ["WhisperEncoder (from CTranslate2 model.bin)"]}
        return MultimodalSource(src_dir, encoder, features, config)
    config = read_config(src_dir)
    model_type = config.get("model_type")
    wanted = {"image-text-embedding": ("siglip", "clip"), "audio-embedding": ("whisper", "clap")}[opts.kind]
    if model_type not in wanted:
        raise ConversionError(f"{src_dir}: model_type {model_type!r}; --kind {opts.kind} reads {', '.join(wanted)}")
    with build.step("load", "loading PyTorch and transformers"):
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        model = AutoModel.from_pretrained(src_dir, attn_implementation="eager").eval()
    return MultimodalSource(src_dir, model, src_dir, config)


def export_multimodal(src: str | Path, out: Path, opts: MultimodalOptions) -> ExportResult:
    """Export ``src`` (SigLIP, CLIP, CLAP, a Whisper encoder) as a multimodal embedding package at ``out``."""
    if opts.kind not in MULTIMODAL_KINDS:
        raise ConversionError(f"unknown kind {opts.kind!r} (one of {', '.join(MULTIMODAL_KINDS)})")
    with PackageBuild(out, "er-mm-export-") as build:
        source = _source(resolve_source(str(src)), opts, build.work, build)
        model_type = source.config.get("model_type")
        with build.step("export", "exporting and checking towers"):
            if opts.kind == "image-text-embedding":
                towers, files, goldens, extra = _image_text(source.model, source.processor_dir, build.work,
                                                            str(model_type))
            elif model_type == "clap":
                towers, files, goldens, extra = _clap(source.model, source.processor_dir, build.work)
            else:
                towers, files, goldens, extra = _audio(source.model, source.processor_dir, build.work)
        variants: dict[str, dict[str, Any]] = {"fp32": {"file": "model.onnx", "dtype": "fp32"}}
        variant_goldens: dict[str, list] = {"fp32": goldens["golden.npz"]}
        if opts.quantize is not None:
            with build.step("quantize", f"quantizing every tower to {opts.quantize} (exact recipe)"):
                variants[opts.quantize], variant_goldens[opts.quantize] = _quantize(
                    towers, files, goldens, extra["samples"], build.work, opts.quantize)
        card = _card(opts, source, towers, variants, extra)
        for rel, cases in goldens.items():
            if rel != "golden.npz":
                files[rel] = golden_bytes(cases)
        files.update(notice_files(source.src_dir, opts))
        return build.write(card, files, variant_goldens)


def _card(opts: MultimodalOptions, source: MultimodalSource, towers: dict[str, Any],
          variants: dict[str, dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    dim = next(iter(towers.values()))["dimension"]
    dims = sorted({dim, *[d for d in opts.dimensions if d < dim]}, reverse=True)
    if any(d > dim for d in opts.dimensions):
        raise ConversionError(f"--dimensions may not exceed the vector size {dim}")
    limits: dict[str, Any] = {"max_input_tokens": int(extra["max_tokens"])}
    for key, value in DEFAULT_LIMITS.items():
        if key.split("_")[0] in towers:
            limits[key] = opts.limits.get(key, value)
    if "text" not in towers:  # an audio-only package's token limit is its window's positions
        limits["max_input_tokens"] = towers["audio"]["positions"]
    src_dir = source.src_dir
    stamp = _stamp(src_dir)
    architecture = (source.config.get("architectures") or [type(source.model).__name__])[0]
    space = "-".join(sorted(towers, key=lambda t: (t == "text", t)))  # image-text, audio-text, audio
    worst = max(v["max_abs_diff"] for v in extra["verification"].values())
    return {
        **card_start(sanitize_name(opts.name or src_dir.name), "multimodal-embedding", opts.kind, identity_card(
            opts, src_dir, source_name=opts.source_name or src_dir.name, architecture=architecture, stamp=stamp,
            description=f"{architecture} {opts.kind} ({', '.join(sorted(towers))})"), modalities=sorted(towers)),
        # Dual encoders and Whisper are compared by cosine: the runtime returns unit vectors.
        "head": {"normalize": True, "dimension": dim, "dimensions": dims},
        "space": {"name": space, "towers": sorted(towers)},
        "towers": towers,
        "limits": limits,
        "graph": {"inputs": towers[_primary(towers)]["inputs"], "outputs": [towers[_primary(towers)]["output"]],
                  "opset": OPSET},
        "variants": variants,
        "verification": {
            "reference": torch_reference(f"{architecture} fp32, per tower"),
            "max_abs_diff": worst, "tolerance": TOLERANCE,
            "cases": sum(v["cases"] for v in extra["verification"].values()),
            "towers": extra["verification"],
        },
        "build": {"converter_version": CONVERTER_VERSION, "source_stamp": stamp,
                  "options": {"kind": opts.kind, "dimensions": dims, "quantize": opts.quantize}},
    }


def _stamp(src_dir: Path) -> str:
    """source_stamp for Hugging Face directories; for CTranslate2 ones, a sha256 over model.bin and config.json."""
    if is_ct2_whisper(src_dir):
        from edge_runtime.packages.manifest import compute_digest, file_sha256

        return compute_digest({rel: file_sha256(src_dir / rel) for rel in ("model.bin", "config.json")
                               if (src_dir / rel).is_file()})
    return source_stamp(src_dir, src_dir)


def _primary(towers: dict[str, Any]) -> str:
    return next(name for name, t in towers.items() if t["graph"] == "model.onnx")
