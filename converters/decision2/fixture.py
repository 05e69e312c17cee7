"""A tiny random-weight Decision 2.0 package in the upstream format (qwen-full with score bias, or a qwen-
adapter over its base), the input of export --kind decision2, for tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from converters.decision2.source import (
    LORA_FORMAT,
    MANIFEST,
    MANIFEST_SCHEMA,
    POINTER,
    PROMPT_VERSION,
    checkpoint_files,
    safetensors_elements,
    sha256_json,
    source_files,
)
from edge_runtime.packages.manifest import file_sha256


def _qwen3_config(vocab: int) -> dict[str, Any]:
    return {"architectures": ["Qwen3Model"], "model_type": "qwen3", "attention_bias": False, "head_dim": 16,
            "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
            "layer_types": ["full_attention", "full_attention"], "max_position_embeddings": 4096,
            "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": vocab}


def write_decision2_fixture(out: Path, seed: int = 0, adapter: bool = False, max_input_tokens: int = 2048) -> Path:
    """A tiny qwen3 Decision 2.0 package (qwen-full with score bias, or qwen-adapter over ``<out>-base``)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3Model

    from converters.fixture_tokenizers import byte_level_bpe
    from converters.samples import DECISION_FIXTURE_CORPUS

    root = Path(out)
    root.mkdir(parents=True, exist_ok=False)
    tok = byte_level_bpe(DECISION_FIXTURE_CORPUS[:7] * 4, ["<|endoftext|>"], vocab_size=384)
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": 4096}, indent=2) + "\n")
    cfg = _qwen3_config(tok.get_vocab_size())
    model = Qwen3Model(Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}))
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, p in model.named_parameters():
        v = torch.randn(p.shape, generator=gen) * 0.05
        if name.endswith("norm.weight"):
            v = v + 1.0
        weights[name] = v.to(torch.bfloat16) if name in linear else v
    dcfg: dict[str, Any] = {
        "architecture": "qwen3-text-endpoints-global-query-shared-bilinear-mlp", "head_variant": "shared",
        "backbone_model_type": "qwen3", "prompt_version": PROMPT_VERSION, "head_dim": 32, "max_options": 255,
        "parameter_dtype": "float32", "autocast_dtype": "bfloat16", "head_compute_dtype": "float32",
        "attention": "sdpa"}
    base_root = None
    if adapter:
        base_root = root.parent / f"{root.name}-base"
        base_root.mkdir(parents=True, exist_ok=False)
        (base_root / "config.json").write_text(json.dumps(
            {"model_type": "qwen3_vl_wrapper", "architectures": ["Wrapper"], "text_config": cfg}, indent=2) + "\n")
        base = {f"model.language_model.{k}": v for k, v in weights.items()}
        base["model.visual.patch_embed.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
        save_file(base, str(base_root / "model-00001-of-00001.safetensors"))
        targets = [f"layers.{i}.mlp.{p}" for i in range(cfg["num_hidden_layers"])
                   for p in ("gate_proj", "up_proj", "down_proj")]
        gen_lora = torch.Generator().manual_seed(seed + 1)
        lora, dims = {}, {}
        for t in targets:
            out_f, in_f = weights[f"{t}.weight"].shape
            dims[t] = [in_f, out_f]
            lora[f"base_model.model.{t}.lora_A.weight"] = torch.randn((4, in_f), generator=gen_lora) * 0.05
            lora[f"base_model.model.{t}.lora_B.weight"] = torch.randn((out_f, 4), generator=gen_lora) * 0.05
        (root / "adapter").mkdir()
        save_file(lora, str(root / "adapter" / "adapter_model.safetensors"))
        (root / "adapter" / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "bias": "none",
             "target_modules": ["down_proj", "gate_proj", "up_proj"]}, indent=2) + "\n")
        dcfg.update(checkpoint_format=LORA_FORMAT, lora={
            "rank": 4, "alpha": 8, "dropout": 0.05, "target_modules": targets, "target_dimensions": dims,
            "source_kind": "posttrained", "base_revision": "0" * 39 + "1",
            "source_fingerprint": {"source_name": base_root.name, "files_sha256": source_files(base_root)}})
    else:
        dcfg["checkpoint_format"] = "full"
        (root / "backbone").mkdir()
        (root / "backbone" / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        save_file(weights, str(root / "backbone" / "model.safetensors"))
    gen_head = torch.Generator().manual_seed(seed + 2)
    h, d = cfg["hidden_size"], 32
    shapes = {"candidate_norm.weight": (h,), "candidate_norm.bias": (h,), "query_norm.weight": (h,),
              "query_norm.bias": (h,), "key.weight": (d, h), "query.weight": (d, h), "candidate_mlp.weight": (d, h),
              "candidate_mlp.bias": (d,), "query_mlp.weight": (d, h), "scalar.weight": (1, d)}
    save_file({k: torch.randn(s, generator=gen_head) * 0.2 for k, s in shapes.items()},
              str(root / "decision_head.safetensors"))
    (root / "decision_config.json").write_text(json.dumps(dcfg, indent=2) + "\n")
    hashes = checkpoint_files(root)
    if adapter:
        assert base_root is not None
        hashes = {**{f"checkpoint/{k}": v for k, v in hashes.items()},
                  **{f"source/{k}": v for k, v in source_files(base_root).items()}}
    identity = sha256_json(hashes)
    bias_entry = None
    if not adapter:
        offsets = {"3": [0.05, -0.02, 0.01], "5": [0.04, 0.2, 0.08, -0.15, -0.17]}
        (root / "score_bias.json").write_text(json.dumps({"format": "dev2-score-bias-v1", "model_sha256": identity,
                                                          "offsets": offsets, "fit": {"source": "fixture"}}, indent=2))
        bias_entry = {"file": "score_bias.json", "offsets": offsets, "sha256": file_sha256(root / "score_bias.json")}
    (root / "decision2").mkdir()
    (root / "decision2" / "__init__.py").write_text('raise RuntimeError("package code must never be imported")\n')
    model_name = "Decision-2.0-Tiny-Qwen3" + ("-LoRA" if adapter else "")
    groups = {"head": ["decision_head.safetensors"], "residual": []}
    groups["adapter" if adapter else "backbone"] = ["adapter/adapter_model.safetensors" if adapter
                                                    else "backbone/model.safetensors"]
    packaged = {g: sum(safetensors_elements(root / n) for n in names) for g, names in groups.items()}
    (root / "config.json").write_text(json.dumps({**POINTER, "model_name": model_name,
                                                  "runtime_family": "decision2-qwen-adapter" if adapter
                                                  else "decision2-qwen-full", "manifest": MANIFEST,
                                                  "max_input_tokens": max_input_tokens}, indent=2) + "\n")
    files = {p.relative_to(root).as_posix(): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA, "kind": "fixture", "model_name": model_name,
        "profile": "qwen-adapter" if adapter else "qwen-full", "files_sha256": files,
        "identity": {"model_sha256": identity}, "max_input_tokens": max_input_tokens,
        "licence": {"spdx": "apache-2.0", "components": []}, "calibration": None,
        "parameters": {"packaged": packaged, "packaged_files": groups,
                       "loaded": packaged["head"] + sum(v.numel() for v in weights.values())},
    }
    if bias_entry:
        manifest["score_bias"] = bias_entry
    if adapter:
        assert base_root is not None
        manifest["base"] = {"repo_id": "edge-runtime-fixtures/tiny-base", "revision": "0" * 39 + "1",
                            "files_sha256": {p.name: file_sha256(p) for p in sorted(base_root.iterdir())
                                             if p.is_file()}}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return root
