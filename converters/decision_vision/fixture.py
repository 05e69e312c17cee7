"""A tiny random-weight decision-vision source (a Qwen2-VL-shaped model, a byte-level BPE with the vision
specials) and the package built from it, for tests."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from converters.causal_lm import MAX_CODES, code_candidates
from converters.decision_vision.export import KIND, QWEN_SPLIT, SPECIALS, DecisionVisionOptions, export_decision_vision
from converters.package_writer import ExportResult
from edge_runtime.families.code_options import SYSTEM

FIXTURE_MAX_PIXELS = 128 * 128


FIXTURE_MIN_PIXELS = 32 * 32


FIXTURE_VOCAB = 900


FIXTURE_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
)


def train_fixture_tokenizer() -> Any:
    """A byte-level BPE with the Qwen2 split regex (digits one per token), the vision specials,
    and merges that make every code (A..Z, AA.., 255 in all) one token."""
    from tokenizers import Regex, pre_tokenizers

    from converters.fixture_tokenizers import byte_level_bpe
    from converters.samples import fixture_corpus
    from edge_runtime.families.code_options import DEFAULT_INSTRUCTIONS, REPLY

    corpus = [*fixture_corpus(), SYSTEM, REPLY, DEFAULT_INSTRUCTIONS, "State:\nQuestion:\nOptions:\n",
              "What does the picture show? Which colour dominates? mostly red green blue seconds",
              '{"bbox_2d": [12, 340, 560, 1000]}']
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *SPECIALS, "<think>", "</think>"]
    split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return byte_level_bpe(corpus, specials, vocab_size=FIXTURE_VOCAB, pre_tokenizer=split, nfc=True, min_frequency=2,
                          extra_tokens=code_candidates()[:MAX_CODES])


def build_fixture_source(d: Path, seed: int = 0, deepstack: Sequence[int] = (),
                         text: Mapping[str, Any] | None = None, vision: Mapping[str, Any] | None = None) -> Path:
    """A tiny random Qwen3VLForConditionalGeneration directory with its tokenizer and processor.

    ``text`` and ``vision`` override members of the text and vision configs (a benchmark builds a
    real model's shape this way, with the fixture's tokenizer and processor)."""
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    tok = train_fixture_tokenizer()
    ids = {name: tok.token_to_id(name) for name in SPECIALS}
    config = Qwen3VLConfig(
        text_config={"vocab_size": tok.get_vocab_size(), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 2048, "rope_theta": 10000.0,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True},
                     "initializer_range": 0.2, "pad_token_id": tok.token_to_id("<|endoftext|>"),
                     **(text or {})},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 16,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
                       "num_position_embeddings": 64, "deepstack_visual_indexes": list(deepstack),
                       "initializer_range": 0.2, **(vision or {})},
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(config).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            model_input_names=["input_ids", "attention_mask"], model_max_length=2048,
                            chat_template=FIXTURE_CHAT_TEMPLATE).save_pretrained(d)
    Qwen2VLImageProcessor(size={"shortest_edge": FIXTURE_MIN_PIXELS, "longest_edge": FIXTURE_MAX_PIXELS},
                          min_pixels=FIXTURE_MIN_PIXELS, max_pixels=FIXTURE_MAX_PIXELS,
                          patch_size=16, merge_size=2, temporal_patch_size=2,
                          image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]).save_pretrained(d)
    return d


def fixture_options(seed: int = 0, deepstack: Sequence[int] = (), **options: Any) -> DecisionVisionOptions:
    """The fixture package's options; ``options`` override them."""
    fields = {"name": f"fixture-{KIND}" + ("-deepstack" if deepstack else ""),
              "description": f"Tiny random-weight Qwen3-VL {KIND} fixture (seed {seed}); for tests, not a real model",
              "version": "0.0.1", "release_date": "2025-01-01", "license": "Apache-2.0",
              "source_name": f"edge-runtime fixture qwen3-vl-tiny (seed {seed})",
              "max_input_tokens": 1024, "video_max_pixels": 64 * 64, "video_max_tokens": 256,
              "box_video_max_seconds": 3.0, **options}
    return DecisionVisionOptions(**fields)


def build_decision_vision_fixture_result(out: Path, seed: int = 0, deepstack: Sequence[int] = (),
                                         source_dir: Path | None = None, **options: Any) -> ExportResult:
    """Build the fixture package at ``out``; ``source_dir`` keeps the Hugging Face source there."""
    opts = fixture_options(seed, deepstack, **options)
    if source_dir is not None:
        return export_decision_vision(build_fixture_source(Path(source_dir), seed, deepstack), Path(out), opts)
    with tempfile.TemporaryDirectory(prefix="er-fixture-") as tmp:
        return export_decision_vision(build_fixture_source(Path(tmp) / f"fixture-{KIND}", seed, deepstack),
                                      Path(out), opts)
