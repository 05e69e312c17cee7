"""A tiny random-weight decision-codes source (Qwen3 shape, byte-level BPE, ChatML template) and the
package built from it, for tests."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from converters.causal_lm import MAX_CODES, code_candidates
from converters.decision_codes.export import KIND, DecisionCodesOptions, export_decision_codes
from converters.decision_codes.verify import SAMPLES
from converters.errors import ConversionError
from converters.package_writer import ExportResult
from edge_runtime.families.code_options import SYSTEM

FIXTURE_RELEASE_DATE = "2025-01-01"


FIXTURE_VOCAB = 800


FIXTURE_MAX_POSITIONS = 1024


FIXTURE_LIMITS = {"validated_input_tokens": 768, "max_request_tokens": 1536}


FIXTURE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


#: ChatML as Qwen3 renders it with thinking off.
FIXTURE_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def train_fixture_tokenizer() -> Any:
    """A byte-level BPE trained with `tokenizers` on the fixture corpus and the prompt's words,
    plus merges that make every code (A..Z, AA.., 255 in all) one token."""
    from converters.fixture_tokenizers import byte_level_bpe
    from converters.samples import fixture_corpus
    from edge_runtime.families.code_options import DEFAULT_INSTRUCTIONS, REPLY

    corpus = [*fixture_corpus(), SYSTEM, REPLY, DEFAULT_INSTRUCTIONS, "State:\nQuestion:\nOptions:\nQuestions:\n"]
    corpus += [json.dumps(b, ensure_ascii=False) for b in SAMPLES]
    return byte_level_bpe(corpus, FIXTURE_SPECIALS, vocab_size=FIXTURE_VOCAB, nfc=True, min_frequency=2,
                          extra_tokens=code_candidates()[:MAX_CODES])


def build_fixture_source(d: Path, seed: int = 0, readout: str = "lm_head") -> Path:
    """A tiny random Qwen3ForCausalLM directory (hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, tied)."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = train_fixture_tokenizer()
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        max_position_embeddings=FIXTURE_MAX_POSITIONS, pad_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"), bos_token_id=None,
        initializer_range=0.2,  # wider than Qwen's 0.02 so that random codes get distinct probabilities
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_input_names=["input_ids", "attention_mask"],  # toolchain P4: no token_type_ids for a decoder
        model_max_length=FIXTURE_MAX_POSITIONS, chat_template=FIXTURE_CHAT_TEMPLATE)
    hf_tok.save_pretrained(d)
    if readout == "trained":
        from safetensors.numpy import save_file

        rng = np.random.default_rng(seed + 2)
        save_file({"weight": (rng.standard_normal((MAX_CODES, 64)) * 0.5).astype(np.float32)},
                  str(d / "readout.safetensors"))
        (d / "decision_config.json").write_text(json.dumps({"codes": code_candidates()[:MAX_CODES]}))
    elif readout != "lm_head":
        raise ConversionError(f"fixture readout must be lm_head or trained, not {readout!r}")
    return d


def build_decision_codes_fixture_result(
    out: Path, seed: int = 0, attention_mode: str = "causal", prompt_layout: str | None = None,
    temperature_by_questions: dict[str, list] | None = None, readout: str = "lm_head",
    source_dir: Path | None = None, **options: Any,
) -> ExportResult:
    """Build the fixture package at ``out``; ``source_dir`` keeps the Hugging Face source there."""
    fields = {
        "attention_mode": attention_mode,
        "prompt_layout": prompt_layout,
        "temperature_by_questions": temperature_by_questions,
        "name": f"fixture-{KIND}" + ("-state-once" if attention_mode == "prefix_causal" else ""),
        "description": (f"Tiny random-weight Qwen3 {KIND} fixture (seed {seed}, {attention_mode}); "
                        "for tests, not a real model"),
        "version": "0.0.1",
        "release_date": FIXTURE_RELEASE_DATE,
        "license": "Apache-2.0",
        "source_name": f"edge-runtime fixture qwen3-tiny (seed {seed})",
        "validated_input_tokens": FIXTURE_LIMITS["validated_input_tokens"],
        "max_request_tokens": FIXTURE_LIMITS["max_request_tokens"] if attention_mode == "prefix_causal" else None,
        **options,
    }
    try:
        opts = DecisionCodesOptions(**fields)
    except TypeError as e:
        raise ConversionError(f"fixture option: {e}") from None
    if source_dir is not None:
        return export_decision_codes(build_fixture_source(Path(source_dir), seed, readout), Path(out), opts)
    with tempfile.TemporaryDirectory(prefix="er-fixture-") as tmp:
        src = build_fixture_source(Path(tmp) / f"fixture-{KIND}", seed, readout)
        return export_decision_codes(src, Path(out), opts)


def build_decision_codes_fixture(out: Path, seed: int = 0, attention_mode: str = "causal",
                                 prompt_layout: str | None = None,
                                 temperature_by_questions: dict[str, list] | None = None, **options: Any) -> Path:
    """The decision-codes fixture package at ``out`` (see build_decision_codes_fixture_result)."""
    return build_decision_codes_fixture_result(out, seed, attention_mode, prompt_layout, temperature_by_questions,
                                               **options).path
