"""Tiny random Qwen3.5 text models for the decision3 graph tests (numpy only: no torch needed to build one).

Values follow upstream's fixture writer: randn * 0.05, ``A_log = log(U * 15 + 1)``, ``dt_bias`` and the GDN
gated norm ``1 + randn * 0.05``, every tensor rounded to BF16 (as released checkpoints store them).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

LIN, FULL = "linear_attention", "full_attention"
#: A pruned backbone's irregular pattern (upstream's d3 "pruned" fixture): layer_types must be followed.
IRREGULAR = (LIN, LIN, FULL, LIN, FULL)


def tiny_text_config(layer_types: Sequence[str] = IRREGULAR, vocab: int = 96, **overrides: Any) -> dict[str, Any]:
    """A qwen3_5_text config small enough for a test: hidden 64, GDN 2 key heads / 4 value heads."""
    config: dict[str, Any] = {
        "model_type": "qwen3_5_text",
        "attention_bias": False,
        "head_dim": 32,
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 128,
        "layer_types": list(layer_types),
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 16,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_hidden_layers": len(layer_types),
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": True,
        "vocab_size": vocab,
    }
    config.update(overrides)
    return config


def bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest BF16 (ties to even), kept as float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def weight_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every HF Qwen3_5TextModel tensor of the config with its shape."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hk, hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv = 2 * hk * dk + hv * dv
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (cfg["vocab_size"], h), "norm.weight": (h,)}
    for i, kind in enumerate(cfg["layer_types"]):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                   p + "mlp.down_proj.weight": (h, inter)}
        if kind == LIN:
            a = p + "linear_attn."
            shapes |= {a + "in_proj_qkv.weight": (conv, h), a + "in_proj_z.weight": (hv * dv, h),
                       a + "in_proj_b.weight": (hv, h), a + "in_proj_a.weight": (hv, h),
                       a + "out_proj.weight": (h, hv * dv),
                       a + "conv1d.weight": (conv, 1, cfg["linear_conv_kernel_dim"]),
                       a + "A_log": (hv,), a + "dt_bias": (hv,), a + "norm.weight": (dv,)}
        else:
            a = p + "self_attn."
            shapes |= {a + "q_proj.weight": (heads * hd * 2, h), a + "k_proj.weight": (kv * hd, h),
                       a + "v_proj.weight": (kv * hd, h), a + "o_proj.weight": (h, heads * hd),
                       a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)}
    return shapes


def random_text_weights(cfg: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """BF16-rounded random weights (float32 arrays) under HF Qwen3_5TextModel names."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(cfg).items():
        value = rng.standard_normal(shape).astype(np.float32) * np.float32(0.05)
        if name.endswith("A_log"):
            value = np.log(rng.random(shape) * 15 + 1).astype(np.float32)
        elif name.endswith(("dt_bias", "linear_attn.norm.weight")):
            value = value + np.float32(1)
        out[name] = bf16_round(value)
    return out


def save_safetensors(weights: dict[str, np.ndarray], path: Any) -> None:
    """Write the weights as BF16 safetensors (exact: they are BF16-rounded), as a checkpoint holds them."""
    # numpy has no bfloat16: store the upper 16 bits under the BF16 dtype, in the safetensors layout
    header: dict[str, Any] = {}
    blobs = []
    offset = 0
    for name, value in weights.items():
        raw = (np.ascontiguousarray(value, dtype=np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        data = raw.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(value.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def reference_environment() -> Path | None:
    """The Transformers 5 reference interpreter (.venv-ref, or EDGE_RUNTIME_REFERENCE_PYTHON), None if absent."""
    from converters.decision3.export import reference_python
    from converters.errors import ConversionError

    try:
        return reference_python()
    except ConversionError:
        return None


#: Marks a test that compares with Transformers 5: skipped, with the reason, where .venv-ref is absent.
NO_REFERENCE = "no .venv-ref: scripts/reference_env.sh builds it"
needs_reference = pytest.mark.skipif(reference_environment() is None, reason=NO_REFERENCE)


#: The questions the d3 tests ask: one of each type the family answers, and a keyed choice.
QUESTIONS: dict[str, Any] = {
    "domain": {"type": "choice", "instructions": "Which domain does this request belong to?",
               "criteria": {"code": "Programming", "math": "Mathematics", "other": "Anything else"}},
    "reasoning": {"type": "noul", "instructions": "Does answering this request need multi-step reasoning?"},
    "difficulty": {"type": "score", "instructions": "How difficult is this request?",
                   "criteria": ["Trivial", "Moderate", "Hard"]},
    "tone": {"type": "choice", "instructions": {"task": "tone"},
             "choices": [{"key": "formal"}, {"key": "casual", "description": {"register": ["chat", "slang"]}}]},
}
