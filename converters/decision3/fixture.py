"""Tiny random-weight Decision 3.0 packages in the upstream format (upstream-formats.md §3.9), for tests.

What the released fixture writer writes, rebuilt from the format notes: a ``Qwen3_5Model`` checkpoint stored
in BF16 under ``language_model.`` (and ``visual.`` unless the ``text`` variant), a byte-level BPE tokenizer
built by hand in which every answer code (A..Z, AA, AB, ...) and 38 prompt words are single tokens, the
Qwen3.5 chat template, the 255-row readout (``randn * 0.5``, seed + 2), ``decision_config.json``, processor
configs, a bundled ``d3_runtime.py`` that raises (it must never be imported) and the manifest (``indent=1``,
with ``files_bytes``, the identity and the parameter counts). The ``pruned`` variant has the irregular
``[lin, lin, full, lin, full]`` layers of a pruned checkpoint. The converter reads these as a user's package.

The parameter names and shapes are Transformers' ``Qwen3_5TextModel`` / ``Qwen3_5VisionModel`` ones, derived
here from the config (the exporter's Transformers has no Qwen3.5); tests compare them with Transformers 5.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import string
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

from converters.decision3 import source as src
from converters.errors import ConversionError

VARIANTS = ("vision", "text", "pruned")
PRUNED_LAYERS = ("linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>", "<think>", "</think>")
#: listed only in tokenizer_config.json's added_tokens_decoder, as in the released packages
CONFIG_ONLY_SPECIALS = ("<|audio_pad|>",)
WORDS = ("State", "Question", "Options", "Reply", "with", "only", "the", "code", "of", "best", "option", "You",
         "are", "decision", "engine", "Treat", "state", "as", "data", "not", "instructions", "Read", "question",
         "and", "every", "then", "reply", "Choose", "matching", "No", "false", "Yes", "true", "system", "user",
         "assistant", "image", "request")
VISION_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_vision", "deepstack_visual_indexes": [], "depth": 2, "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 32, "in_channels": 3, "intermediate_size": 64, "num_heads": 2, "num_position_embeddings": 16,
    "patch_size": 16, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}, "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
PROCESSOR_CONFIG: dict[str, Any] = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}
VIDEO_PROCESSOR_CONFIG: dict[str, Any] = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor",
}
PACKAGE_CODE = 'raise RuntimeError("the runtime must never import package code")\n'
CHAT_TEMPLATE = "qwen3_5_chat_template.jinja"


def answer_codes() -> list[str]:
    """A..Z then AA, AB, ...: 255 codes."""
    two = ("".join(p) for p in itertools.product(string.ascii_uppercase, repeat=2))
    return [*string.ascii_uppercase, *itertools.islice(two, src.MAX_OPTIONS - 26)]


def qwen3_5_text_config(vocab: int, layers: Sequence[str] | None = None) -> dict[str, Any]:
    """The tiny Qwen3.5 text config of the Decision 2.0/3.0 fixtures (hidden 64, head_dim 32, M-RoPE)."""
    layer_types = list(layers or ("linear_attention", "linear_attention", "linear_attention", "full_attention"))
    return {
        "architectures": ["Qwen3_5TextModel"], "model_type": "qwen3_5_text", "attention_bias": False,
        "attn_output_gate": True, "full_attention_interval": 4, "head_dim": 32, "hidden_act": "silu",
        "hidden_size": 64, "intermediate_size": 128, "layer_types": layer_types, "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_value_head_dim": 16, "max_position_embeddings": 4096, "num_attention_heads": 4,
        "num_hidden_layers": len(layer_types), "num_key_value_heads": 2, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": True, "vocab_size": vocab,
    }


def text_parameter_shapes(text: dict[str, Any]) -> dict[str, list[int]]:
    """``Qwen3_5TextModel``'s parameter names and shapes for ``text`` (in module order)."""
    h, inter = text["hidden_size"], text["intermediate_size"]
    out: dict[str, list[int]] = {"embed_tokens.weight": [text["vocab_size"], h]}
    kh, vh = text["linear_num_key_heads"], text["linear_num_value_heads"]
    kd, vd = text["linear_key_head_dim"], text["linear_value_head_dim"]
    conv = 2 * kh * kd + vh * vd
    heads, kv, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    gate = 2 if text.get("attn_output_gate", True) else 1
    for i, kind in enumerate(text["layer_types"]):
        p = f"layers.{i}."
        if kind == "linear_attention":
            out |= {p + "linear_attn.dt_bias": [vh], p + "linear_attn.A_log": [vh],
                    p + "linear_attn.conv1d.weight": [conv, 1, text["linear_conv_kernel_dim"]],
                    p + "linear_attn.norm.weight": [vd], p + "linear_attn.out_proj.weight": [h, vh * vd],
                    p + "linear_attn.in_proj_qkv.weight": [conv, h], p + "linear_attn.in_proj_z.weight": [vh * vd, h],
                    p + "linear_attn.in_proj_b.weight": [vh, h], p + "linear_attn.in_proj_a.weight": [vh, h]}
        else:
            out |= {p + "self_attn.q_proj.weight": [heads * hd * gate, h], p + "self_attn.k_proj.weight": [kv * hd, h],
                    p + "self_attn.v_proj.weight": [kv * hd, h], p + "self_attn.o_proj.weight": [h, heads * hd],
                    p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]}
        out |= {p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                p + "mlp.down_proj.weight": [h, inter], p + "input_layernorm.weight": [h],
                p + "post_attention_layernorm.weight": [h]}
    out["norm.weight"] = [h]
    return out


def vision_parameter_shapes(vision: dict[str, Any]) -> dict[str, list[int]]:
    """``Qwen3_5VisionModel``'s parameter names and shapes (no deepstack mergers)."""
    d, inter, c = vision["hidden_size"], vision["intermediate_size"], vision["in_channels"]
    p, t, m = vision["patch_size"], vision["temporal_patch_size"], vision["spatial_merge_size"]
    merged = d * m * m
    out: dict[str, list[int]] = {"patch_embed.proj.weight": [d, c, t, p, p], "patch_embed.proj.bias": [d],
                                 "pos_embed.weight": [vision["num_position_embeddings"], d]}
    for i in range(vision["depth"]):
        b = f"blocks.{i}."
        out |= {b + "norm1.weight": [d], b + "norm1.bias": [d], b + "norm2.weight": [d], b + "norm2.bias": [d],
                b + "attn.qkv.weight": [3 * d, d], b + "attn.qkv.bias": [3 * d], b + "attn.proj.weight": [d, d],
                b + "attn.proj.bias": [d], b + "mlp.linear_fc1.weight": [inter, d], b + "mlp.linear_fc1.bias": [inter],
                b + "mlp.linear_fc2.weight": [d, inter], b + "mlp.linear_fc2.bias": [d]}
    out |= {"merger.norm.weight": [d], "merger.norm.bias": [d], "merger.linear_fc1.weight": [merged, merged],
            "merger.linear_fc1.bias": [merged], "merger.linear_fc2.weight": [vision["out_hidden_size"], merged],
            "merger.linear_fc2.bias": [vision["out_hidden_size"]]}
    return out


def _random_tensors(shapes: dict[str, list[int]], prefix: str, seed: int) -> dict[str, Any]:
    """randn * 0.05 in BF16; A_log = log(U*15 + 1); dt_bias, the gated norm and the vision LayerNorm weights
    1 + randn * 0.05 (the text RMSNorm weights stay small: Qwen3.5 stores them zero-centred)."""
    import torch

    torch.manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        value = torch.randn(shape) * 0.05
        if name.endswith("A_log"):
            value = torch.log(torch.rand(shape) * 15 + 1)
        elif name.endswith(("dt_bias", "linear_attn.norm.weight", "norm1.weight", "norm2.weight",
                            "merger.norm.weight")):
            value = torch.ones(shape) + value
        out[prefix + name] = value.to(torch.bfloat16)
    return out


def write_tokenizer(root: Path) -> tuple[dict[str, int], list[str]]:
    """A byte-level BPE in which each answer code and each of WORDS is one token; returns special IDs, codes."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    codes = answer_codes()
    for word in (*codes, *WORDS):
        current = word[0]
        for char in word[1:]:
            merged = current + char
            if merged not in vocab:
                merges.append((current, char))
                vocab[merged] = len(vocab)
            current = merged
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tokenizer.save(str(root / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIALS}
    ids |= {t: tokenizer.get_vocab_size() + k for k, t in enumerate(CONFIG_ONLY_SPECIALS)}
    entry = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    config = {"add_bos_token": False, "add_prefix_space": False,
              "added_tokens_decoder": {str(ids[t]): {"content": t, **entry} for t in (*SPECIALS,
                                                                                       *CONFIG_ONLY_SPECIALS)},
              "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "tokenizer_class": "Qwen2Tokenizer"}
    (root / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return ids, codes


def _save(tensors: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def chat_template_bytes() -> bytes:
    """The Qwen3.5 chat template (sha256 c3cf9e34…, one of the three the d3 prompt format covers)."""
    return files("converters.decision3").joinpath(CHAT_TEMPLATE).read_bytes()


def write_source_fixture(out: Path, variant: str = "vision", seed: int = 0,
                         attention_mode: str = "noncausal_full_attention", readout_dtype: str = "float32",
                         max_length: int = 4096) -> Path:
    """Write an upstream-format Decision 3.0 package to the new directory ``out`` and return it."""
    import torch
    from tokenizers import Tokenizer

    if variant not in VARIANTS:
        raise ConversionError(f"decision3 fixture variants are {', '.join(VARIANTS)}, not {variant!r}")
    if attention_mode not in src.ATTENTION_MODES:
        raise ConversionError(f"attention_mode must be one of {', '.join(src.ATTENTION_MODES)}")
    root = Path(out)
    if root.exists():
        raise ConversionError(f"{root} exists; a source fixture is written to a new directory")
    root.mkdir(parents=True)
    ids, codes = write_tokenizer(root)
    text = qwen3_5_text_config(max(ids.values()) + 1, PRUNED_LAYERS if variant == "pruned" else None)
    tensors = _random_tensors(text_parameter_shapes(text), "language_model.", seed)
    config: dict[str, Any] = {
        "architectures": ["Qwen3_5Model"], "model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True,
        "image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
    }
    if variant != "text":
        config["vision_config"] = {**VISION_CONFIG, "out_hidden_size": text["hidden_size"]}
        tensors |= _random_tensors(vision_parameter_shapes(config["vision_config"]), "visual.", seed + 1)
        (root / "preprocessor_config.json").write_text(json.dumps(PROCESSOR_CONFIG, indent=2) + "\n", "utf-8")
        (root / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PROCESSOR_CONFIG, indent=2) + "\n",
                                                             "utf-8")
    _save(tensors, root / "model.safetensors")
    torch.manual_seed(seed + 2)
    _save({"weight": torch.randn(src.MAX_OPTIONS, text["hidden_size"]) * 0.5}, root / "readout.safetensors")
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (root / "chat_template.jinja").write_bytes(chat_template_bytes())
    backend = Tokenizer.from_file(str(root / "tokenizer.json"))
    decision = {"format_version": src.FORMAT_VERSION, "format_id": src.FORMAT_ID, "prompt": "d3",
                "base_model": "fixture", "revision": "0" * 40, "codes": codes,
                "token_ids": [backend.token_to_id(c) for c in codes], "temperature": 0.75,
                "attention_mode": attention_mode, "pooling": "last", "max_length": max_length,
                "readout_dtype": readout_dtype}
    (root / "decision_config.json").write_text(json.dumps(decision, indent=2) + "\n", encoding="utf-8")
    (root / "d3_runtime.py").write_text(PACKAGE_CODE, encoding="utf-8")
    counts = {"text": 0, "vision": 0}
    for name, tensor in tensors.items():
        counts["vision" if name.startswith("visual.") else "text"] += tensor.numel()
    readout = src.MAX_OPTIONS * text["hidden_size"]
    identity_files = {n: _sha256(root / n) for n in ("model.safetensors", *src.IDENTITY_FILES)}
    names = sorted(p.name for p in root.iterdir() if p.is_file())
    manifest = {
        "schema": src.MANIFEST_SCHEMA, "model_name": root.name, "format_id": src.FORMAT_ID, "prompt": "d3",
        "attention_mode": attention_mode, "max_input_tokens": max_length,
        "identity": {"model_sha256": src.model_identity(identity_files, decision), "files_sha256": identity_files,
                     "decision": {k: decision[k] for k in src.INFERENCE_FIELDS}},
        "parameters": {**counts, "readout": readout, "loaded": counts["text"] + counts["vision"] + readout},
        "licence": {"spdx": "apache-2.0", "components": [{"component": root.name, "licence": "apache-2.0"}]},
        "files_sha256": {n: _sha256(root / n) for n in names},
        "files_bytes": {n: (root / n).stat().st_size for n in names},
    }
    (root / src.MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return root
