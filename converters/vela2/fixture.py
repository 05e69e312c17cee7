"""Tiny random-weight Vela 2.0 sources in the upstream unified format (the input of export --kind vela2),
and the package built from one, for tests."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from converters.package_writer import ExportResult
from converters.samples import DECISION_FIXTURE_CORPUS
from converters.vela2.export import DEFAULT_CHECK_REQUESTS, Vela2Options, export_vela2
from converters.vela2.source import (
    ENCODER_PREFIX,
    LOADED_FILES,
    MODEL_TYPE,
)
from edge_runtime.families.vela2.layout import MARKERS
from edge_runtime.packages.manifest import file_sha256

PII_TYPES = ["AGE", "CREDIT_CARD", "DATE_TIME", "DOMAIN_NAME", "EMAIL_ADDRESS", "GPE", "IBAN_CODE", "IP_ADDRESS",
             "NRP", "ORGANIZATION", "PERSON", "PHONE_NUMBER", "STREET_ADDRESS", "TITLE", "US_DRIVER_LICENSE",
             "US_SSN", "ZIP_CODE"]




PROJECTION = 32


def fixture_calibration() -> dict[str, Any]:
    """The upstream fixture's calibration.json (§2.1 fixture values)."""
    return {
        "temperature": {"choice": 1.3, "score": 1.1, "set": 1.05, "span": 0.4},
        "thresholds": {"set:*": 0.3, "span:toxic": 0.1, "span:halu": 0.55, "span:*": 0.5},
        "pii_types": PII_TYPES,
        "pii_length_rule": {"anchors": [{"n_tokens": 21, "threshold": 0.75}, {"n_tokens": 126, "threshold": 0.05},
                                        {"n_tokens": 1022, "threshold": 0.005919}]},
        "pii_sparse_gate": {"K": 3, "t_sparse": 0.1, "probe_threshold": 0.5},
        "pii_schema": {"text": "Which spans are personal information?",
                       "labels": {name: name.lower().replace("_", " ") for name in PII_TYPES}},
        "halu_schema": {"text": "Which spans of the answer are not supported by the context?",
                        "labels": {"unsupported": "a claim not supported by the context"}},
        "relevance_schema": {
            "text": "How relevant is this candidate to the query?",
            "levels": {"not_relevant": "The candidate does not help with the query.",
                       "partially_relevant": "The candidate partly helps.",
                       "highly_relevant": "The candidate directly helps with the query."},
            "values": {"not_relevant": 0.0, "partially_relevant": 0.5, "highly_relevant": 1.0},
        },
    }


def fixture_encoder_config(vocab: int, **overrides: Any) -> dict[str, Any]:
    """The upstream fixture's ModernBERT config (global every 3rd layer, local 8, YaRN x4)."""
    cfg = {
        "architectures": ["ModernBertModel"], "model_type": "modernbert", "attention_bias": False,
        "bos_token_id": 2, "cls_token_id": 1, "eos_token_id": 1, "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000, "hidden_activation": "gelu", "hidden_size": 64, "intermediate_size": 96,
        "local_attention": 8, "local_rope_theta": 160000, "max_position_embeddings": 32768, "mlp_bias": False,
        "norm_bias": False, "norm_eps": 1e-5, "num_attention_heads": 4, "num_hidden_layers": 4, "pad_token_id": 0,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 8192,
                         "rope_type": "yarn", "truncate": True},
        "sep_token_id": 1, "vocab_size": vocab,
    }
    cfg.update(overrides)
    return cfg


def _fixture_tokenizer(root: Path) -> int:
    from converters.fixture_tokenizers import byte_level_bpe

    tok = byte_level_bpe(DECISION_FIXTURE_CORPUS * 4, ["<pad>", "<eos>", "<bos>"], vocab_size=384)
    tok.add_special_tokens(list(MARKERS))
    tok.save(str(root / "tokenizer.json"))
    return tok.get_vocab_size()


def _backbone_weights(encoder: dict[str, Any], seed: int, std: float = 0.05) -> dict[str, Any]:
    """Random backbone: randn * std, norm weights 1 + that; Linear weights rounded to bf16."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    model = ModernBertModel(ModernBertConfig(**encoder))
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        value = torch.randn(p.shape, generator=gen) * std
        if name.endswith("norm.weight"):
            value = value + 1.0
        out[f"{ENCODER_PREFIX}{name}"] = value.to(torch.bfloat16) if name in linear else value
    return out


def _head_weights(hidden: int, proj: int, readout: str, seed: int) -> dict[str, Any]:
    """Marker head: every tensor N(0, 0.2^2), then log_tau = -2.8 and log_tau_span = -2.6."""
    import torch

    shapes: dict[str, tuple[int, ...]] = {"norm.weight": (hidden,), "norm.bias": (hidden,)}
    for p in ("w_o", "w_q", "w_p"):
        shapes[f"{p}.weight"], shapes[f"{p}.bias"] = (proj, hidden), (proj,)
    shapes["log_tau"] = ()
    for p in ("w_t", "w_e"):
        shapes[f"{p}.weight"], shapes[f"{p}.bias"] = (proj, hidden), (proj,)
    shapes["log_tau_span"] = ()
    if readout != "cosine":
        shapes.update({"cls_mlp.0.weight": (2 * hidden, hidden), "cls_mlp.0.bias": (2 * hidden,),
                       "cls_mlp.3.weight": (1, 2 * hidden), "cls_mlp.3.bias": (1,)})
    gen = torch.Generator().manual_seed(seed)
    out = {name: torch.randn(shape, generator=gen) * 0.2 for name, shape in shapes.items()}
    out["log_tau"] = torch.tensor(-2.8)
    out["log_tau_span"] = torch.tensor(-2.6)
    return out


def write_source_fixture(out: Path, seed: int = 0, max_length: int = 2048, window_overlap: int = 64,
                         readout: str = "both", sums: bool = True, weight_std: float = 0.05,
                         **encoder_overrides: Any) -> Path:
    """Write a tiny upstream-format Vela 2.0 encoder package at ``out`` (which must not exist).

    ``weight_std`` scales the random backbone; a deep, wide backbone (the 0.3B's 22 layers of 768)
    needs ModernBERT's own 0.02 to keep float32 rounding within the converter's parity tolerance.
    """
    from safetensors.torch import save_file

    root = Path(out)
    root.mkdir(parents=True, exist_ok=False)
    vocab = _fixture_tokenizer(root)
    encoder = fixture_encoder_config(vocab, **encoder_overrides)
    marker_ids = {name: vocab - len(MARKERS) + i for i, name in enumerate(MARKERS)}
    tensors = _backbone_weights(encoder, seed, weight_std)
    tensors.update(_head_weights(encoder["hidden_size"], PROJECTION, readout, seed + 1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(root / "model.safetensors"))
    config = {
        "architectures": ["Vela2Model"], "model_type": MODEL_TYPE, "format_version": 1,
        "encoder_config": encoder, "proj_dim": PROJECTION, "readout": readout, "markers": list(MARKERS),
        "marker_ids": marker_ids, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
        "max_length": max_length, "window_overlap": window_overlap, "model_name": "Vela-2.0-Tiny-Fixture",
    }
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (root / "calibration.json").write_text(json.dumps(fixture_calibration(), indent=2) + "\n", encoding="utf-8")
    # bundled upstream engine code: a converter must never run it
    (root / "vela2_inference.py").write_text('raise RuntimeError("package code must never be imported")\n',
                                             encoding="utf-8")
    if sums:
        lines = [f"{file_sha256(root / n)}  {n}" for n in sorted(LOADED_FILES)]
        (root / "SHA256SUMS").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


FIXTURE_RELEASE_DATE = "2025-01-01"


def build_vela2_fixture_result(out: Path, seed: int = 0, check_requests: int = DEFAULT_CHECK_REQUESTS,
                               **source_options: Any) -> ExportResult:
    """A converted vela2 fixture: the upstream-format fixture written to a temp dir, then exported."""
    with tempfile.TemporaryDirectory(prefix="er-vela2-src-") as tmp:
        src = write_source_fixture(Path(tmp) / "vela2-tiny", seed=seed, **source_options)
        opts = Vela2Options(name="fixture-vela2", description=f"Tiny random-weight Vela 2.0 fixture (seed {seed}); "
                            "for tests, not a real model", version="0.0.1", release_date=FIXTURE_RELEASE_DATE,
                            license="Apache-2.0", source_name=f"edge-runtime fixture vela2-tiny (seed {seed})",
                            check_requests=check_requests, seed=seed)
        return export_vela2(src, Path(out), opts)
