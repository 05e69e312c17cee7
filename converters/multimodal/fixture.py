"""Tiny random-weight multimodal sources (SigLIP, CLIP, Whisper, CLAP) and their fixture packages.

Each source is an ordinary Hugging Face directory (config, safetensors, tokenizer, processor)
exported through converters.multimodal.export_multimodal, parity check included. ``siglip-base-vision``
is SigLIP base's vision tower at its real shape (random weights) for benchmarks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from converters.multimodal.export import MultimodalOptions, export_multimodal
from converters.package_writer import ExportResult

# ---- fixtures ---------------------------------------------------------------------------------

FIXTURE_ARCHS = ("siglip", "clip", "whisper", "clap", "siglip-base-vision")


def build_multimodal_source(arch: str, d: Path, seed: int = 0) -> Path:
    """A tiny random-weight SigLIP, CLIP, Whisper or CLAP directory (config, weights, tokenizer, processor)."""
    import torch
    from transformers import (
        ClapConfig,
        ClapFeatureExtractor,
        ClapModel,
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        PreTrainedTokenizerFast,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperModel,
    )

    from converters.fixture_tokenizers import word_piece

    d.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)
    if arch == "siglip-base-vision":
        # For benchmarks: SigLIP base's vision tower at its real shape (google/siglip-base-patch16-224:
        # hidden 768, 12 layers, 224 px in 16 px patches), random weights, beside a tiny text tower.
        tok = word_piece()
        text = dict(tiny, vocab_size=tok.get_vocab_size(), max_position_embeddings=16, projection_size=768,
                    pad_token_id=tok.token_to_id("[PAD]"), eos_token_id=tok.token_to_id("[SEP]"))
        vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                      image_size=224, patch_size=16)
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                sep_token="[SEP]", model_max_length=16).save_pretrained(d)
        SiglipImageProcessor(size={"height": 224, "width": 224}).save_pretrained(d)
    elif arch in ("siglip", "clip"):
        tok = word_piece()
        text = dict(tiny, vocab_size=tok.get_vocab_size(), max_position_embeddings=16,
                    pad_token_id=tok.token_to_id("[PAD]"), eos_token_id=tok.token_to_id("[SEP]"),
                    bos_token_id=tok.token_to_id("[CLS]"))
        vision = dict(tiny, image_size=32, patch_size=8)
        proc: Any
        if arch == "siglip":
            model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision)).eval()
            proc = SiglipImageProcessor(size={"height": 32, "width": 32})
        else:
            model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)).eval()
            proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                         cls_token="[CLS]", sep_token="[SEP]", model_max_length=16)
        hf_tok.save_pretrained(d)
        proc.save_pretrained(d)
    elif arch == "clap":
        tok = word_piece()
        text = dict(tiny, vocab_size=tok.get_vocab_size(), max_position_embeddings=40,
                    pad_token_id=tok.token_to_id("[PAD]"))
        # HTSAT at a tiny scale: a 64 x 64 spectrogram image (16 mels x 4 folds), 4 x 4 patches.
        audio = dict(spec_size=64, num_mel_bins=16, window_size=4, patch_size=4, patch_stride=[4, 4], depths=[1, 1],
                     num_attention_heads=[1, 2], patch_embeds_hidden_size=16, hidden_size=32, enable_fusion=False)
        model = ClapModel(ClapConfig(text_config=text, audio_config=audio, projection_dim=32)).eval()
        hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                         cls_token="[CLS]", sep_token="[SEP]", model_max_length=38)
        hf_tok.save_pretrained(d)
        ClapFeatureExtractor(feature_size=16, sampling_rate=16000, hop_length=160, max_length_s=2,
                             fft_window_size=400, frequency_min=50, frequency_max=8000, truncation="rand_trunc",
                             padding="repeatpad").save_pretrained(d)
    elif arch == "whisper":
        config = WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=2, decoder_layers=1,
                               decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=80,
                               max_source_positions=100, max_target_positions=32, vocab_size=64,
                               pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
        model = WhisperModel(config).eval()
        # A 2-second window (200 mel frames, 100 encoder positions) keeps the fixture fast.
        WhisperFeatureExtractor(feature_size=80, chunk_length=2).save_pretrained(d)
    else:
        raise ConversionError(f"unknown fixture architecture {arch!r} (one of {', '.join(FIXTURE_ARCHS)})")
    model.save_pretrained(d, safe_serialization=True)
    return d


def build_multimodal_fixture(arch: str, out: Path, seed: int = 0, source_dir: Path | None = None,
                             quantize: str | None = None) -> ExportResult:
    """Build the tiny fixture package of ``arch`` at ``out`` through export_multimodal (``quantize``:
    "int8" adds the exact int8 of every tower).

    ``source_dir``: where to write (and keep) the Hugging Face source, for tests that compare with
    PyTorch; by default it lives in a temporary directory.
    """
    kind = "audio-embedding" if arch in ("whisper", "clap") else "image-text-embedding"
    opts = MultimodalOptions(kind=kind, name=f"fixture-{arch}", version="0.0.1", release_date="2025-01-01",
                             license="Apache-2.0", source_name=f"edge-runtime fixture {arch}-tiny (seed {seed})",
                             description=f"Tiny random-weight {arch} {kind} fixture (seed {seed}); for tests",
                             dimensions=[8],  # a Matryoshka size, so truncation is exercised per modality
                             limits={"audio_max_seconds": 8, "image_source_max_pixels": 4_000_000,
                                     "image_max_bytes": 2 * 1024 * 1024, "audio_max_bytes": 2 * 1024 * 1024},
                             quantize=quantize)
    if arch == "siglip-base-vision":  # the benchmark shape: no Matryoshka size, default limits
        opts.dimensions, opts.limits = [], {}
    if source_dir is not None:
        return export_multimodal(build_multimodal_source(arch, Path(source_dir), seed=seed), out, opts)
    with tempfile.TemporaryDirectory(prefix="er-mm-fixture-") as tmp:
        src = build_multimodal_source(arch, Path(tmp) / f"fixture-{arch}", seed=seed)
        return export_multimodal(src, out, opts)
