"""Transformers 5's own Qwen3.5 text model as the parity reference (runs in .venv-ref only).

Run as ``.venv-ref/bin/python -m converters.decision3.reference --config C --weights W... --inputs I.npz
--out O.npz [--attention-mode M] [--dtype float32 --dtype bfloat16]``. It builds
``Qwen3_5TextModel`` from the text config (a ``text_config`` dict, or a full config holding one), loads
the weights (HF names; ``model.language_model.``/``language_model.`` prefixes stripped, other towers
ignored), applies upstream's noncausal hook when asked (the full-attention layers get the padding mask
alone, bidirectional; the GDN layers keep their padding mask), and writes ``last_hidden_state`` per dtype
(``float32``, ``bfloat16``: the model in BF16, as upstream's released runtime runs it, output upcast).

Inputs npz: ``inputs_embeds`` float32 [B, q, H] or ``input_ids`` int64 [B, q], ``attention_mask``
int64 [B, q] (rows right- or left-padded), optional ``position_ids`` int64 [B, 3, q]. With
``prefix_len`` (a 0-d array) the first ``prefix_len`` tokens of every row are run first (use_cache) and
the rest continue from Transformers' own cache: the output then covers the continuation only.

With ``--vision`` the model is the whole ``Qwen3_5Model`` (its vision tower, placeholder scatter and
``get_rope_index`` included; the noncausal hook on its language model) and the inputs npz holds, per case
``i``, ``{i}.input_ids`` int64 [n] (image placeholders expanded), ``{i}.pixel_values`` float32 [N, D] and
``{i}.image_grid_thw`` int64 [k, 3], ``{i}.image.{k}`` uint8 [h, w, 3] (the decoded images), or for a video case
``{i}.pixel_values_videos`` and ``{i}.video_grid_thw`` [1, 3] (its pairs, expanded in the ids), and ``processor``
(a JSON string: the converter's processor settings); each case runs alone (batch 1) and the output holds
``{i}`` = the float32 hidden state of its last token, and ``{i}.pixel_values`` / ``{i}.image_grid_thw`` from
Transformers' own ``Qwen2VLImageProcessorPil`` on the images.

Self-contained on purpose: torch, transformers, safetensors, numpy and json only (nothing of
edge_runtime or the exporter's environment, whose Transformers 4 has no Qwen3.5).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

STRIP = ("model.language_model.", "language_model.")
OTHER_TOWERS = ("visual.", "model.visual.", "lm_head.", "mtp.")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The text part of a config file's dict."""
    return dict(config.get("text_config", config))


def load_weights(paths: list[str]) -> dict[str, Any]:
    """The text model's tensors from safetensors files, prefixes stripped, other towers left out."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for path in paths:
        for name, tensor in load_file(path).items():
            if name.startswith(OTHER_TOWERS):
                continue
            for prefix in STRIP:
                if name.startswith(prefix):
                    name = name[len(prefix):]
                    break
            out[name] = tensor
    return out


def enable_noncausal(text_model: Any) -> None:
    """Upstream's hook: the full-attention mask becomes the padding mask alone (boolean, every real key of
    the row visible to every query); the linear-attention layers keep their 2-D padding mask."""
    masking = importlib.import_module("transformers.masking_utils")

    def mask_inputs(module: Any, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        embeddings = kwargs.get("inputs_embeds")
        if embeddings is None:
            embeddings = module.embed_tokens(kwargs["input_ids"])
        padding = kwargs["attention_mask"]
        kwargs["attention_mask"] = {
            "full_attention": padding[:, None, None, :].bool(),
            "linear_attention": masking.create_recurrent_attention_mask(
                config=module.config, inputs_embeds=embeddings, attention_mask=padding),
        }
        return args, kwargs

    text_model.register_forward_pre_hook(mask_inputs, with_kwargs=True)


def build_model(config: dict[str, Any], weights: dict[str, Any], attention_mode: str) -> Any:
    """Qwen3_5TextModel in fp32 (SDPA attention, eval) with every text tensor loaded."""
    import torch
    # imported by name: the exporter's environment (where mypy runs) has Transformers 4, without Qwen3.5
    qwen = importlib.import_module("transformers.models.qwen3_5")
    Qwen3_5TextConfig, Qwen3_5TextModel = qwen.Qwen3_5TextConfig, qwen.Qwen3_5TextModel  # noqa: N806

    cfg = Qwen3_5TextConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5TextModel(cfg).float().eval()
    if "embed_tokens.weight" not in weights:  # embeds-in parity needs no table; keep the random one
        weights = {**weights, "embed_tokens.weight": model.embed_tokens.weight.detach().clone()}
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"text weights do not match Qwen3_5TextModel: missing {sorted(missing)[:4]}, "
                         f"unexpected {sorted(unexpected)[:4]}")
    if attention_mode == "noncausal_full_attention":
        enable_noncausal(model)
    elif attention_mode != "causal":
        raise SystemExit(f"unknown attention mode {attention_mode!r}")
    torch.set_grad_enabled(False)
    return model


def full_weights(paths: list[str]) -> dict[str, Any]:
    """Every tensor of the text model and the vision tower, under Qwen3_5Model's names."""
    from safetensors.torch import load_file

    out: dict[str, Any] = {}
    for path in paths:
        for name, tensor in load_file(path).items():
            name = name[len("model."):] if name.startswith("model.") else name
            if name.startswith(("language_model.", "visual.")):
                out[name] = tensor
    return out


def build_full_model(config: dict[str, Any], weights: dict[str, Any], attention_mode: str) -> Any:
    """Qwen3_5Model in fp32 (SDPA attention, eval), text and vision tensors loaded."""
    import torch
    qwen = importlib.import_module("transformers.models.qwen3_5")

    cfg = qwen.Qwen3_5Config(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "sdpa"
    cfg.text_config._attn_implementation = "sdpa"
    cfg.vision_config._attn_implementation = "sdpa"
    model = qwen.Qwen3_5Model(cfg).float().eval()
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=False)
    if missing or unexpected:
        raise SystemExit(f"weights do not match Qwen3_5Model: missing {sorted(missing)[:4]}, "
                         f"unexpected {sorted(unexpected)[:4]}")
    if attention_mode == "noncausal_full_attention":
        enable_noncausal(model.language_model)
    elif attention_mode != "causal":
        raise SystemExit(f"unknown attention mode {attention_mode!r}")
    torch.set_grad_enabled(False)
    return model


def run_vision(model: Any, inputs: dict[str, np.ndarray], image_token_id: int,
               video_token_id: int = -1) -> dict[str, np.ndarray]:
    """Each case's last-token hidden state, the model given the pixels and grids (batch 1, no padding)."""
    import torch

    out = {}
    for key in sorted(k for k in inputs if k.endswith(".input_ids")):
        case = key[:-len(".input_ids")]
        ids = torch.from_numpy(np.asarray(inputs[key], dtype=np.int64))[None]
        media: dict[str, Any] = {}
        if f"{case}.pixel_values" in inputs:
            media["pixel_values"] = torch.from_numpy(np.asarray(inputs[f"{case}.pixel_values"], dtype=np.float32))
            media["image_grid_thw"] = torch.from_numpy(np.asarray(inputs[f"{case}.image_grid_thw"], dtype=np.int64))
        if f"{case}.pixel_values_videos" in inputs:  # a video, expanded in the ids (timestamped pairs)
            media["pixel_values_videos"] = torch.from_numpy(
                np.asarray(inputs[f"{case}.pixel_values_videos"], dtype=np.float32))
            media["video_grid_thw"] = torch.from_numpy(np.asarray(inputs[f"{case}.video_grid_thw"], dtype=np.int64))
        types = (ids == image_token_id).int() + 2 * (ids == video_token_id).int()
        result = model(input_ids=ids, attention_mask=torch.ones_like(ids), **media, mm_token_type_ids=types,
                       use_cache=False)
        out[case] = result.last_hidden_state[0, -1].float().numpy()
        images = [inputs[k] for k in sorted((k for k in inputs if k.startswith(f"{case}.image.")),
                                            key=lambda k: int(k.rsplit(".", 1)[1]))]
        if images and "processor" in inputs:
            pixels = processor(json.loads(str(inputs["processor"])), images)
            out[f"{case}.pixel_values"], out[f"{case}.image_grid_thw"] = pixels
    return out


def processor(settings: dict[str, Any], images: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Transformers 5's Pillow Qwen2-VL image processor (the slow semantics) on uint8 RGB images."""
    from PIL import Image
    qwen2_vl = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")

    hf = qwen2_vl.Qwen2VLImageProcessorPil(
        size={"shortest_edge": settings["min_pixels"], "longest_edge": settings["max_pixels"]},
        image_mean=settings["image_mean"], image_std=settings["image_std"], patch_size=settings["patch_size"],
        temporal_patch_size=settings["temporal_patch_size"], merge_size=settings["merge_size"],
        rescale_factor=settings["rescale_factor"])
    out = hf(images=[Image.fromarray(a, "RGB") for a in images], return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), np.asarray(out["image_grid_thw"], dtype=np.int64)


def run(model: Any, inputs: dict[str, np.ndarray], dtype: str) -> np.ndarray:
    """last_hidden_state float32 [B, q(-prefix), H] of the model in ``dtype`` on ``inputs``."""
    import torch

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = model.to(torch_dtype)
    mask = torch.from_numpy(np.asarray(inputs["attention_mask"], dtype=np.int64))
    kwargs: dict[str, Any] = {}
    if "inputs_embeds" in inputs:
        kwargs["inputs_embeds"] = torch.from_numpy(np.asarray(inputs["inputs_embeds"], dtype=np.float32)).to(
            torch_dtype)
    else:
        kwargs["input_ids"] = torch.from_numpy(np.asarray(inputs["input_ids"], dtype=np.int64))
    positions = None
    if "position_ids" in inputs:  # [B, 3, q] -> Transformers' [3, B, q]
        positions = torch.from_numpy(np.asarray(inputs["position_ids"], dtype=np.int64)).transpose(0, 1)
    prefix = int(inputs["prefix_len"]) if "prefix_len" in inputs else 0
    if prefix:
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(config=model.config)
        first = {k: v[:, :prefix] for k, v in kwargs.items()}
        model(attention_mask=mask[:, :prefix], past_key_values=cache, use_cache=True,
              position_ids=None if positions is None else positions[:, :, :prefix], **first)
        rest = {k: v[:, prefix:] for k, v in kwargs.items()}
        out = model(attention_mask=mask, past_key_values=cache, use_cache=True,
                    position_ids=None if positions is None else positions[:, :, prefix:], **rest)
    else:
        out = model(attention_mask=mask, position_ids=positions, use_cache=False, **kwargs)
    hidden: np.ndarray = out.last_hidden_state.float().numpy()
    return hidden


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="config.json (text_config inside, or the text config)")
    parser.add_argument("--weights", required=True, nargs="+", help="safetensors files")
    parser.add_argument("--inputs", required=True, help="npz of inputs (see the module docstring)")
    parser.add_argument("--out", required=True, help="npz to write: one last_hidden_state per dtype")
    parser.add_argument("--attention-mode", default="causal", choices=("causal", "noncausal_full_attention"))
    parser.add_argument("--dtype", action="append", choices=("float32", "bfloat16"))
    parser.add_argument("--vision", action="store_true", help="Qwen3_5Model with images (see the docstring)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    save: Any = np.savez  # numpy's stub types **kwds as its own flags
    if args.vision:
        full = json.loads(Path(args.config).read_text())
        vision_model = build_full_model(full, full_weights(args.weights), args.attention_mode)
        with np.load(args.inputs) as data:
            save(args.out, **run_vision(vision_model, {k: data[k] for k in data.files}, int(full["image_token_id"]),
                                          int(full.get("video_token_id", -1))))
        return 0
    config = text_config(json.loads(Path(args.config).read_text()))
    model = build_model(config, load_weights(args.weights), args.attention_mode)
    with np.load(args.inputs) as data:
        inputs = {k: data[k] for k in data.files}
    # float32 first: the model is cast down for bfloat16, never back up
    dtypes = sorted(set(args.dtype or ["float32"]), key=lambda d: d != "float32")
    results = {dtype: run(model, inputs, dtype) for dtype in dtypes}
    save(args.out, **results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
