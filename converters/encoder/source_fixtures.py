"""Tiny random-weight sources in the file layouts of the Router's catalogue models the encoder converter
reads (reference/router-catalogue.md §3.3, §3.4, §2), for tests; `export` converts them as it would the
real ones. Depth and vocabulary are shrunk (and a sliding or local window to 8, so that short test texts
cross it); the widths, heads and head dimensions are the catalogue's (§3), and so is the structure.

- ``qwen3-embedding-source``: Qwen3-Embedding-0.6B. ``Qwen3ForCausalLM`` config over ``Qwen3Model``
  weights (bf16, no ``model.`` prefix), an explicit ``head_dim`` unlike hidden / heads, grouped KV
  heads, tied embeddings; a byte-level BPE whose post-processor appends ``<|endoftext|>``; a tokenizer
  ``model_max_length`` of 131072 over 32768 positions and no sentence_bert_config.json; last-token
  pooling, Normalize, and the query / document prompts.
- ``embeddinggemma-source``: EmbeddingGemma-300m. ``Gemma3TextModel``, bidirectional attention, one KV
  head, ``head_dim`` unlike hidden / heads, five sliding layers then one full, a sliding window of 8
  written as the model defines it (Transformers 4.57 saves the halved value, which a reload would halve
  again), ``<bos> text <eos>``; mean pooling, Dense 4x up and back down (no bias, identity), Normalize,
  the model card's prompts.
- ``lora-source``: a Router ``-lora`` adapter directory (PEFT SEQ_CLS over an mmBERT-shaped
  ``ModernBertForMaskedLM``: YaRN x4, global attention every third layer, a local window of 8) with
  its tokenizer and label_mapping.json, and its base in a Hugging Face cache at ``<out>-hub`` under
  the repo id the adapter names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from converters.command_line import source_fixture_out

KINDS = ("qwen3-embedding-source", "embeddinggemma-source", "lora-source")
QWEN3_PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
                          "Query:", "document": ""}
GEMMA_PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: ",
                 "Clustering": "task: clustering | query: ", "STS": "task: sentence similarity | query: "}
GEMMA_SLIDING_WINDOW = 8
#: the repo id the LoRA fixture's adapter names as its base (the Router's default, catalogue §2)
LORA_BASE = "llm-semantic-router/mmbert-32k-yarn"
LORA_BASE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
LORA_LABELS = ["biology", "business", "law", "other"]
#: the Router's default rank and alpha (2 x rank), catalogue §2
LORA_RANK = 32
_ST = "sentence_transformers.models."


#: kind -> (layers, vocabulary rows) of the real model, for ``full_size`` (catalogue §3)
FULL_SIZE = {"qwen3-embedding-source": (28, 151669), "embeddinggemma-source": (24, 262144),
             "lora-source": (22, 256000)}


def write_source_fixture(kind: str, out: Path, seed: int = 0, full_size: bool = False) -> Path:
    """Write the ``kind`` source fixture into the new directory ``out``; returns ``out``. ``full_size``
    keeps the real model's depth and embedding rows too (the tokenizer stays tiny), for measurements."""
    out = source_fixture_out(out)
    writer = {"qwen3-embedding-source": _qwen3, "embeddinggemma-source": _gemma, "lora-source": _lora}[kind]
    out.mkdir(parents=True)
    writer(out, seed, FULL_SIZE[kind] if full_size else None)
    return out


def _size(full: tuple[int, int] | None, layers: int, tok: Any) -> dict[str, int]:
    """num_hidden_layers and vocab_size: the shrunk ones, or the real model's."""
    return {"num_hidden_layers": full[0] if full else layers, "vocab_size": full[1] if full else tok.get_vocab_size()}


def _randomized(model: Any, seed: int, bf16: bool = False) -> dict[str, Any]:
    """The model's tensors drawn anew: matrices at 1 / sqrt(fan-in), so that activations stay near 1 at the
    real widths and random layers still give distinct outputs; norm weights near their identity (Gemma's
    RMSNorm scales by 1 + w); biases small."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    offset = 0.0 if "Gemma" in type(model).__name__ else 1.0
    weights = {}
    for name, p in model.state_dict().items():
        v = torch.randn(p.shape, generator=gen)
        if "norm" in name:
            v = v * 0.1 + offset
        elif p.dim() == 2:
            v = v * (1.0 if "embed" in name else p.shape[1] ** -0.5)
        else:
            v = v * 0.02
        weights[name] = v.to(torch.bfloat16) if bf16 else v
    return weights


def _save(model: Any, weights: dict[str, Any], out: Path) -> None:
    from safetensors.torch import save_file

    model.config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


def _patch_config(out: Path, **values: Any) -> None:
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    cfg.update(values)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _tokenizer(out: Path, specials: list[str], bos: str | None, eos: str, **config: Any) -> Any:
    """A byte-level BPE on the fixture corpus that frames text as ``[bos] text eos`` (pairs as
    ``[bos] a eos b eos``), saved as tokenizer.json and tokenizer_config.json."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from converters.fixture_tokenizers import byte_level_bpe
    from converters.samples import fixture_corpus

    tok = byte_level_bpe(fixture_corpus(), specials, vocab_size=700)
    lead = f"{bos} " if bos else ""
    tok.post_processor = processors.TemplateProcessing(
        single=f"{lead}$A {eos}", pair=f"{lead}$A {eos} $B:1 {eos}:1",
        special_tokens=[(t, tok.token_to_id(t)) for t in dict.fromkeys(filter(None, (bos, eos)))])
    PreTrainedTokenizerFast(tokenizer_object=tok, **config).save_pretrained(out)
    return tok


def _sentence_transformers(out: Path, modules: list[tuple[str, str]], pooling: dict[str, Any],
                           prompts: dict[str, str], max_seq_length: int | None) -> None:
    entries = [{"idx": 0, "name": "0", "path": "", "type": _ST + "Transformer"}]
    for i, (folder, kind) in enumerate(modules, start=1):
        entries.append({"idx": i, "name": str(i), "path": folder, "type": _ST + kind})
        (out / folder).mkdir(exist_ok=True)
        if kind == "Pooling":
            (out / folder / "config.json").write_text(json.dumps(pooling, indent=2), encoding="utf-8")
    (out / "modules.json").write_text(json.dumps(entries, indent=2), encoding="utf-8")
    (out / "config_sentence_transformers.json").write_text(json.dumps(
        {"__version__": {"sentence_transformers": "5.1.0"}, "prompts": prompts, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}, indent=2), encoding="utf-8")
    if max_seq_length is not None:
        (out / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}), encoding="utf-8")


def _pooling(hidden: int, mode: str) -> dict[str, Any]:
    modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")
    return {"word_embedding_dimension": hidden, **{f"pooling_mode_{m}": m == mode for m in modes},
            "include_prompt": True}


def _qwen3(out: Path, seed: int, full: tuple[int, int] | None) -> None:
    from transformers import Qwen3Config, Qwen3Model

    tok = _tokenizer(out, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|endoftext|>",
                     eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=131072,
                     padding_side="left")
    config = Qwen3Config(**_size(full, 2, tok), hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16",
                         eos_token_id=tok.token_to_id("<|endoftext|>"), bos_token_id=tok.token_to_id("<|endoftext|>"))
    model = Qwen3Model(config)
    _save(model, _randomized(model, seed, bf16=True), out)
    _patch_config(out, architectures=["Qwen3ForCausalLM"])
    _sentence_transformers(out, [("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")], _pooling(1024, "lasttoken"),
                           QWEN3_PROMPTS, None)


def _gemma(out: Path, seed: int, full: tuple[int, int] | None) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3TextConfig, Gemma3TextModel

    tok = _tokenizer(out, ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"], "<bos>", "<eos>", bos_token="<bos>",
                     eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
                     model_max_length=2048)
    config = Gemma3TextConfig(
        **_size(full, 6, tok), hidden_size=768, intermediate_size=1152, num_attention_heads=3,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
        max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        sliding_window=GEMMA_SLIDING_WINDOW, use_bidirectional_attention=True, hidden_activation="gelu_pytorch_tanh",
        pad_token_id=0, eos_token_id=1, bos_token_id=2, torch_dtype="float32")
    model = Gemma3TextModel(config)
    _save(model, _randomized(model, seed), out)
    # Transformers 4.57 holds (and saves) the window halved for bidirectional attention: written as defined
    _patch_config(out, architectures=["Gemma3TextModel"], sliding_window=GEMMA_SLIDING_WINDOW)
    _sentence_transformers(out, [("1_Pooling", "Pooling"), ("2_Dense", "Dense"), ("3_Dense", "Dense"),
                                 ("4_Normalize", "Normalize")], _pooling(768, "mean_tokens"), GEMMA_PROMPTS, 2048)
    gen = torch.Generator().manual_seed(seed + 1)
    for folder, (n_in, n_out) in (("2_Dense", (768, 3072)), ("3_Dense", (3072, 768))):
        (out / folder / "config.json").write_text(json.dumps(
            {"in_features": n_in, "out_features": n_out, "bias": False,
             "activation_function": "torch.nn.modules.linear.Identity"}), encoding="utf-8")
        save_file({"linear.weight": torch.randn((n_out, n_in), generator=gen) * n_in ** -0.5},
                  str(out / folder / "model.safetensors"))


def _lora(out: Path, seed: int, full: tuple[int, int] | None) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    hub = out.with_name(out.name + "-hub") / f"models--{LORA_BASE.replace('/', '--')}"
    base = hub / "snapshots" / LORA_BASE_COMMIT
    base.mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text(LORA_BASE_COMMIT, encoding="utf-8")
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    framing = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
               "mask_token": "<mask>", "cls_token": "<bos>", "sep_token": "<eos>", "model_max_length": 8192}
    tok = _tokenizer(base, specials, "<bos>", "<eos>", **framing)
    config = ModernBertConfig(
        **_size(full, 4, tok), hidden_size=768, intermediate_size=1152, num_attention_heads=12,
        global_attn_every_n_layers=3, local_attention=8, global_rope_theta=160000.0,
        local_rope_theta=160000.0, max_position_embeddings=32768, norm_bias=False, mlp_bias=False,
        attention_bias=False, classifier_pooling="mean", classifier_bias=False, hidden_activation="gelu",
        pad_token_id=0, eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1, tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192})
    mlm = ModernBertForMaskedLM(config)
    weights = _randomized(mlm, seed)
    weights["decoder.weight"] = weights["model.embeddings.tok_embeddings.weight"]  # tied, as saved
    _save(mlm, {k: v for k, v in weights.items() if k != "decoder.weight"}, base)
    _patch_config(base, architectures=["ModernBertForMaskedLM"])
    # the adapter: PEFT's SEQ_CLS layout (factors of each target, the classifier as a saved module)
    _tokenizer(out, specials, "<bos>", "<eos>", **framing)
    gen = torch.Generator().manual_seed(seed + 1)
    tensors = {}
    targets = {name: tuple(module.weight.shape[::-1]) for name, module in mlm.named_modules()
               if name.endswith(("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo"))}
    for target, (n_in, n_out) in targets.items():
        # trained factors: B is not zero (PEFT initialises it so), and moves the outputs
        stem = f"base_model.model.{target}"
        tensors[f"{stem}.lora_A.weight"] = torch.randn((LORA_RANK, n_in), generator=gen) * n_in ** -0.5
        tensors[f"{stem}.lora_B.weight"] = torch.randn((n_out, LORA_RANK), generator=gen) * 0.02
    tensors["base_model.model.classifier.weight"] = torch.randn((len(LORA_LABELS), 768), generator=gen) * 0.2
    tensors["base_model.model.classifier.bias"] = torch.randn((len(LORA_LABELS),), generator=gen) * 0.5
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "base_model_name_or_path": LORA_BASE, "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "lora_alpha": 2 * LORA_RANK, "lora_dropout": 0.1,
        "modules_to_save": ["classifier", "score"],
        "peft_type": "LORA", "r": LORA_RANK, "rank_pattern": {}, "alpha_pattern": {}, "revision": None,
        "target_modules": ["Wqkv", "Wo", "Wi"], "task_type": "SEQ_CLS", "use_dora": False, "use_rslora": False},
        indent=2), encoding="utf-8")
    mapping = {"category_to_idx": {label: i for i, label in enumerate(LORA_LABELS)},
               "idx_to_category": {str(i): label for i, label in enumerate(LORA_LABELS)}}
    (out / "label_mapping.json").write_text(json.dumps(mapping, indent=2), encoding="utf-8")
