"""`fixture --kind task-heads-source | task-heads --layout L`: tiny random-weight sources of each ModernBERT
task layout the Router's catalogue holds, and packages exported from them, offline in seconds.

Each source has its model's real file layout, config shape and labels (reference/router-catalogue.md §3;
upstream's ``testing/task_heads.py`` and ``embed_packages.py``) with the depth, width and vocabulary shrunk:
4 layers (global attention every third, a local window of 8 tokens, so test texts cross both), hidden 64,
a byte-level BPE of a few hundred tokens framed as the real tokenizer frames texts and pairs. The mmBERT
layouts carry YaRN x4; ``mmbert-merged`` writes it in Transformers 5's ``rope_parameters`` spelling, the
others in ``rope_scaling``; the ModernBERT-base layouts (LettuceDetect, NLI) have plain RoPE with a local
theta of 10,000.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from converters.package_writer import ExportResult
from converters.samples import SAMPLE_PAIRS, SAMPLE_TEXTS, fixture_corpus
from converters.task_heads.export import TaskOptions, export_task_heads

FIXTURE_RELEASE_DATE = "2025-01-01"
DOMAIN = ["biology", "business", "chemistry", "computer science", "economics", "engineering", "health", "history",
          "law", "math", "other", "philosophy", "physics", "psychology"]
HAZARD = ["violence", "criminal_activity", "sexual_content", "child_exploitation", "hate", "harassment_abuse",
          "regulated_substances", "weapons", "self_harm", "privacy", "specialized_advice", "misinformation"]
PII_TYPES = ["AGE", "CREDIT_CARD", "DATE_TIME", "DOMAIN_NAME", "EMAIL_ADDRESS", "GPE", "IBAN_CODE", "IP_ADDRESS",
             "NRP", "ORGANIZATION", "PERSON", "PHONE_NUMBER", "STREET_ADDRESS", "TITLE", "US_DRIVER_LICENSE",
             "US_SSN", "ZIP_CODE"]
#: Hazard's operating point: windows of 64 tokens overlapping by 16, documents up to 4,096 tokens
SCORE_WINDOW, SCORE_DOCUMENT, GROUNDED_LIMIT = (64, 16), 4096, 512
YARN = {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 4.0, "original_max_position_embeddings": 8192,
        "rope_type": "yarn", "truncate": True}
VELA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
BASE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EMBED_CONTRACT = {"version": 1, "intermediate_normalization": "none", "final_normalization": "final_norm",
                  "pooling": "attention_mask_mean", "pooling_accumulation_dtype": "float32",
                  "truncate_before_l2_normalize": True}
RERANK_CONTRACT = {"version": 1, "pooling": "cls", "intermediate_normalization": "final_norm",
                   "final_normalization": "final_norm", "head_dtype": "float32"}


@dataclass(frozen=True)
class Layout:
    """One catalogue layout: architecture, labels, pooling, problem type, backbone family (mmBERT or
    ModernBERT-base) and what it stands in for."""

    architecture: str
    labels: tuple[str, ...] = ()
    pooling: str = "mean"
    problem: str | None = None
    base: str = "mmbert"
    stands_for: str = ""


SEQ, TOK, ENC = "ModernBertForSequenceClassification", "ModernBertForTokenClassification", "ModernBertModel"
LAYOUTS: dict[str, Layout] = {
    "domain": Layout(SEQ, tuple(DOMAIN), "cls", "single_label_classification",
                     stands_for="vllm-sr/Vela-1.0-Encoder-307M-Domain"),
    "guard": Layout(SEQ, ("benign", "jailbreak"), "cls", "single_label_classification",
                    stands_for="vllm-sr/Vela-1.0-Encoder-307M-Guard"),
    "safety": Layout(SEQ, ("safe", "unsafe"), "mean", "single_label_classification",
                     stands_for="vllm-sr/Vela-1.0-Encoder-307M-Safety"),
    "factcheck": Layout(SEQ, ("NO_FACT_CHECK_NEEDED", "FACT_CHECK_NEEDED"), "mean", "single_label_classification",
                        stands_for="vllm-sr/Vela-1.0-Encoder-307M-FactCheck"),
    "feedback": Layout(SEQ, ("SAT", "NEED_CLARIFICATION", "WRONG_ANSWER", "WANT_DIFFERENT", "NO_FEEDBACK"), "cls",
                       "single_label_classification", stands_for="vllm-sr/Vela-1.0-Encoder-307M-Feedback"),
    "modality": Layout(SEQ, ("AR", "DIFFUSION", "BOTH"), "mean", "single_label_classification",
                       stands_for="vllm-sr/Vela-1.0-Encoder-307M-Modality"),
    "hazard": Layout(SEQ, tuple(HAZARD), "mean", "multi_label_classification",
                     stands_for="vllm-sr/Vela-1.0-Encoder-307M-Hazard"),
    "pii": Layout(TOK, ("O", *(f"{t}-{k}" for k in PII_TYPES for t in "BI")),
                  stands_for="vllm-sr/Vela-1.0-Encoder-307M-PII"),
    "halu": Layout(TOK, ("supported", "hallucinated"), stands_for="vllm-sr/Vela-1.0-Encoder-307M-Halu"),
    "embedding": Layout(ENC, stands_for="vllm-sr/Vela-1.0-Encoder-307M-Embedding"),
    "reranker": Layout(ENC, stands_for="vllm-sr/Vela-1.0-Encoder-307M-Reranker"),
    "mmbert-merged": Layout(SEQ, ("benign", "jailbreak"), "mean", "single_label_classification",
                            stands_for="llm-semantic-router/mmbert32k-jailbreak-detector-merged "
                                       "(Transformers 5 rope_parameters)"),
    "lettucedetect": Layout(TOK, ("LABEL_0", "LABEL_1"), base="modernbert",
                            stands_for="KRLabsOrg/lettucedect-base-modernbert-en-v1"),
    "nli": Layout(SEQ, ("entailment", "neutral", "contradiction"), "mean", "single_label_classification",
                  base="modernbert", stands_for="tasksource/ModernBERT-base-nli"),
}
#: the longest row a fixture's parity check reads: 32 local windows of the fixtures' 8 tokens
FIXTURE_PARITY_TOKENS = 256
#: by depth: the Vela Embedding's exits beside the last layer, the Vela Reranker's scored layers and widths
#: (the fixtures' 4 layers of 64, and Vela 1.0's real 22 layers of 768)
EMBED_EXITS = {4: (1, 2), 22: (3, 6, 11)}
RERANK_EXITS = {4: ((2, 4), (64, 32)), 22: ((3, 6, 11, 22), (768, 512, 256, 128, 64))}


def _tokenizer(d: Path, base: str) -> tuple[Any, dict[str, int]]:
    """A byte-level BPE framed as mmBERT (``<bos> A <eos>``, ``<bos> A <eos> B <eos>``) or ModernBERT-base
    (``[CLS] A [SEP]``, ``[CLS] A [SEP] B [SEP]``) frames texts; saved with its Transformers files."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from converters.fixture_tokenizers import byte_level_bpe

    specials = VELA_SPECIALS if base == "mmbert" else BASE_SPECIALS
    corpus = [*fixture_corpus(), *SAMPLE_TEXTS, *(f"{q} {a}" for q, a in SAMPLE_PAIRS)]
    tok = byte_level_bpe(corpus * 2, specials, vocab_size=512)
    ids = {s: tok.token_to_id(s) for s in specials}
    first, last = ("<bos>", "<eos>") if base == "mmbert" else ("[CLS]", "[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", pair=f"{first} $A {last} $B {last}",
        special_tokens=[(first, ids[first]), (last, ids[last])])
    names = ({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
              "mask_token": "<mask>"} if base == "mmbert" else
             {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
              "mask_token": "[MASK]"})
    PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=8192, model_input_names=["input_ids",
                            "attention_mask"], **names).save_pretrained(d)
    return tok, ids


def _config(layout: Layout, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    """The layout's config.json, shrunk (Transformers 4 spelling)."""
    config: dict[str, Any] = {
        "architectures": [layout.architecture], "model_type": "modernbert", "attention_bias": False,
        "global_attn_every_n_layers": 3, "hidden_activation": "gelu", "hidden_size": 64, "intermediate_size": 96,
        "local_attention": 8, "mlp_bias": False, "norm_bias": False, "norm_eps": 1e-5, "num_attention_heads": 4,
        "num_hidden_layers": 4, "vocab_size": vocab, "classifier_activation": "gelu", "classifier_bias": False,
        "classifier_pooling": layout.pooling, "tie_word_embeddings": True,
    }
    if layout.base == "mmbert":
        config.update(global_rope_theta=160000.0, local_rope_theta=160000.0, max_position_embeddings=32768,
                      rope_scaling=dict(YARN), pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"],
                      eos_token_id=ids["<eos>"], cls_token_id=ids["<bos>"], sep_token_id=ids["<eos>"])
    else:
        config.update(global_rope_theta=160000.0, local_rope_theta=10000.0, max_position_embeddings=8192,
                      pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
                      cls_token_id=ids["[CLS]"], sep_token_id=ids["[SEP]"])
    if layout.labels:
        config["id2label"] = {str(i): label for i, label in enumerate(layout.labels)}
        config["label2id"] = {label: i for i, label in enumerate(layout.labels)}
    if layout.problem:
        config["problem_type"] = layout.problem
    return config


def transformers5_spelling(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as Transformers 5 writes ModernBERT: ``rope_parameters`` per layer type, ``layer_types``."""
    out = {k: v for k, v in config.items()
           if k not in ("global_rope_theta", "local_rope_theta", "rope_scaling", "global_attn_every_n_layers")}
    scaling = config.get("rope_scaling") or {"rope_type": "default"}
    out["rope_parameters"] = {"full_attention": {**scaling, "rope_theta": config["global_rope_theta"]},
                              "sliding_attention": {**scaling, "rope_theta": config["local_rope_theta"]}}
    every = int(config["global_attn_every_n_layers"])
    out["layer_types"] = ["full_attention" if i % every == 0 else "sliding_attention"
                          for i in range(int(config["num_hidden_layers"]))]
    return out


def _model(config: dict[str, Any], seed: int, std: float = 0.05) -> Any:
    """The layout's Transformers model with random weights: N(0, std) (norms 1 + that), heads N(0, 0.3)."""
    import torch
    from transformers import (
        ModernBertConfig,
        ModernBertForSequenceClassification,
        ModernBertForTokenClassification,
        ModernBertModel,
    )

    cls = {SEQ: ModernBertForSequenceClassification, TOK: ModernBertForTokenClassification}.get(
        config["architectures"][0], ModernBertModel)
    cfg = ModernBertConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "sdpa"
    model = cls(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            value = torch.randn(p.shape, generator=gen) * (0.3 if name.startswith(("head.", "classifier.")) else std)
            p.copy_(value + 1.0 if name.endswith("norm.weight") else value)
    return model


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def _sentence_transformers(d: Path, hidden: int, max_seq_length: int) -> None:
    _write_json(d / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    _write_json(d / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": False})
    (d / "2_Normalize").mkdir(exist_ok=True)
    _write_json(d / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})


def _operating_point(layout_name: str, labels: tuple[str, ...], seed: int) -> dict[str, Any] | None:
    import numpy as np

    if layout_name == "hazard":
        thresholds = (np.random.default_rng(seed + 3).random(len(labels)) * 0.8 + 0.1).round(4).tolist()
        size, overlap = SCORE_WINDOW
        return {"version": 2, "score_type": "independent_sigmoid", "comparison": "score >= threshold",
                "labels": list(labels), "thresholds": thresholds,
                "input_policy": {"strategy": "overlapping_content_windows",
                                 "window_tokens_including_special_tokens": size,
                                 "content_tokens_per_window": size - 2, "stride_content_tokens": size - 2 - overlap,
                                 "overlap_content_tokens": overlap,
                                 "max_document_tokens_including_special_tokens": SCORE_DOCUMENT,
                                 "aggregation": "per-label maximum sigmoid over all covering windows",
                                 "overflow": "reject"}}
    if layout_name == "halu":
        return {"max_input_tokens": GROUNDED_LIMIT, "token_threshold": 0.5, "threshold_comparison": "strictly_greater",
                "label2id": {label: i for i, label in enumerate(labels)},
                "input_pair": ["User request: {question}\n\n{context}", "answer"],
                "answer_offsets": "Unicode code points"}
    return None


def write_source(layout_name: str, out: Path, seed: int = 0, shape: dict[str, Any] | None = None,
                 weight_std: float = 0.05) -> Path:
    """Write the source directory of ``layout_name`` (LAYOUTS) into ``out`` (a new directory); ``shape``
    overrides config members (a benchmark's real depth and width), ``weight_std`` the backbone's spread."""
    import torch
    from safetensors.torch import save_file

    layout = LAYOUTS.get(layout_name)
    if layout is None:
        raise ConversionError(f"--layout {layout_name!r}: one of {', '.join(LAYOUTS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    tok, ids = _tokenizer(out, layout.base)
    config = {**_config(layout, tok.get_vocab_size(), ids), **(shape or {})}
    if layout_name == "embedding":
        config["representation_contract"] = EMBED_CONTRACT
    if layout_name == "reranker":
        config["representation_contract"] = RERANK_CONTRACT
    model = _model(config, seed, weight_std)
    model.save_pretrained(out, safe_serialization=True)
    _write_json(out / "config.json", transformers5_spelling(config) if layout_name == "mmbert-merged" else config)
    point = _operating_point(layout_name, layout.labels, seed)
    if point is not None:
        _write_json(out / "operating_point.json", point)
    depth, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    if layout_name == "embedding":
        _sentence_transformers(out, hidden, 8192)
        for layer in EMBED_EXITS[depth]:  # upstream names exits by the graphs it ships; their bytes are never read
            (out / "onnx").mkdir(exist_ok=True)
            (out / "onnx" / f"model_layer_{layer}.onnx").write_bytes(b"")
    if layout_name == "reranker":
        layers, dims = RERANK_EXITS[depth]
        _write_json(out / "matryoshka_config.json", {
            "layer_indices": list(layers), "dim_indices": list(dims), "hidden_size": hidden,
            "num_layers": depth, "pooling_strategy": "cls", "representation_contract": RERANK_CONTRACT})
        gen = torch.Generator().manual_seed(seed + 1)
        heads = {}
        for layer in layers:
            for dim in dims:
                heads[f"{layer}.{dim}.0.weight"] = torch.randn(dim // 2, dim, generator=gen) * 0.2
                heads[f"{layer}.{dim}.0.bias"] = torch.randn(dim // 2, generator=gen) * 0.1
                heads[f"{layer}.{dim}.3.weight"] = torch.randn(1, dim // 2, generator=gen) * 0.2
                heads[f"{layer}.{dim}.3.bias"] = torch.randn(1, generator=gen) * 0.1
        save_file(heads, str(out / "classification_heads.safetensors"))
    return out


def build_fixture_result(layout_name: str, out: Path, seed: int = 0, **options: Any) -> ExportResult:
    """Write the source of ``layout_name`` to a temporary directory and export it as a package at ``out``."""
    layout = LAYOUTS.get(layout_name)
    if layout is None:
        raise ConversionError(f"--layout {layout_name!r}: one of {', '.join(LAYOUTS)}")
    description = (f"Tiny random-weight {layout_name} task fixture (seed {seed}), shaped like "
                   f"{layout.stands_for}; for tests, not a real model")
    opts = TaskOptions(name=f"fixture-{layout_name}", version="0.0.1", release_date=FIXTURE_RELEASE_DATE,
                       license="Apache-2.0", description=description,
                       source_name=f"edge-runtime fixture {layout_name} (seed {seed})",
                       parity_tokens=FIXTURE_PARITY_TOKENS, **options)
    with tempfile.TemporaryDirectory(prefix="er-task-fixture-") as tmp:
        return export_task_heads(write_source(layout_name, Path(tmp) / layout_name, seed), Path(out), opts)
