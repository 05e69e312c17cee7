"""`fixture --kind embedding | ...`: tiny random-weight encoder packages for tests, built offline in seconds.

A BERT-like encoder (hidden 32, 2 layers) with a WordPiece vocabulary trained with `tokenizers`
on a fixed, varied corpus (code, CJK, emoji included) is saved as an ordinary Hugging Face
directory and exported through the same path as a real model, parity check included. The same
seed gives the same package digest.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from converters.encoder.export import KINDS, ExportOptions, export_model
from converters.errors import ConversionError
from converters.fixture_tokenizers import word_piece
from converters.package_writer import ExportResult

FIXTURE_RELEASE_DATE = "2025-01-01"
HIDDEN = 32
LAYERS = 2
MAX_POSITIONS = 128
VOCAB_SIZE = 1200
_LABELS: dict[str, list[str]] = {
    "sequence-classification": ["negative", "neutral", "positive"],
    "multi-label": ["billing", "shipping", "technical", "urgent"],
    "token-classification": ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"],
    "rerank": ["relevance"],
}


def _write_sentence_transformer(d: Path, pooling: str, normalize: bool) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (d / "2_Normalize").mkdir()
    (d / "modules.json").write_text(json.dumps(modules, indent=2))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": pooling == "last",
    }, indent=2))
    (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_POSITIONS, "do_lower_case": False}))


def build_source(kind: str, d: Path, seed: int = 0, pooling: str = "mean", normalize: bool = True) -> Path:
    """Write a tiny random-weight Hugging Face model directory for ``kind`` into ``d``."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
        PreTrainedTokenizerFast,
    )

    tok = word_piece(VOCAB_SIZE)
    labels = _LABELS.get(kind, [])
    config = BertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
        pad_token_id=tok.token_to_id("[PAD]"),
        initializer_range=0.2,  # wider than BERT's 0.02 so that random heads give distinct outputs
    )
    if labels:
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    if kind == "multi-label":
        config.problem_type = "multi_label_classification"
    cls = {"embedding": BertModel, "token-classification": BertForTokenClassification}.get(
        kind, BertForSequenceClassification)
    torch.manual_seed(seed)
    model = cls(config).eval()
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]", model_max_length=MAX_POSITIONS)
    hf_tok.save_pretrained(d)
    if kind == "embedding":
        _write_sentence_transformer(d, pooling, normalize)
    return d


def build_fixture(kind: str, out: Path, seed: int = 0, quantize: bool | str | None = None, **options: Any) -> Path:
    """Build the fixture package for ``kind`` at ``out`` and return its path.

    ``quantize``: a variant name (``int8``, ``int8-dynamic``) to write too; True means ``int8``.

    ``options``: for embedding ``pooling`` (mean), ``normalize`` (True), ``layers`` ([1]) and
    ``dimensions`` ([32, 16]); any other ExportOptions field (``thresholds``, ``name``, ...).
    """
    return build_fixture_result(kind, out, seed=seed, quantize=quantize, **options).path


def build_fixture_result(kind: str, out: Path, seed: int = 0, quantize: bool | str | None = None,
                         **options: Any) -> ExportResult:
    """build_fixture, returning the whole ExportResult (digest, card, timings)."""
    if kind not in KINDS:
        raise ConversionError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    pooling = options.pop("pooling", "mean")
    normalize = options.pop("normalize", True)
    if kind == "embedding":
        options.setdefault("layers", [1])
        options.setdefault("dimensions", [HIDDEN, HIDDEN // 2])
    fields = {
        "kind": kind,
        "name": f"fixture-{kind}",
        "quantize": "int8" if quantize is True else (quantize or None),
        "description": f"Tiny random-weight {kind} fixture (seed {seed}); for tests, not a real model",
        "version": "0.0.1",
        "release_date": FIXTURE_RELEASE_DATE,
        "license": "Apache-2.0",
        "source_name": f"edge-runtime fixture bert-tiny (seed {seed})",
        **options,
    }
    try:
        opts = ExportOptions(**fields)
    except TypeError as e:
        raise ConversionError(f"fixture option: {e}") from None
    with tempfile.TemporaryDirectory(prefix="er-fixture-") as tmp:
        src = build_source(kind, Path(tmp) / f"fixture-{kind}", seed=seed, pooling=pooling, normalize=normalize)
        return export_model(src, Path(out), opts)
