"""`fixture`: tiny random-weight encoder packages for tests, built offline in seconds.

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

from converters.errors import ConversionError
from converters.export import KINDS, ExportOptions, ExportResult, export_model
from converters.samples import fixture_corpus

FIXTURE_RELEASE_DATE = "2025-01-01"
HIDDEN = 32
LAYERS = 2
MAX_POSITIONS = 128
VOCAB_SIZE = 1200
_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_LABELS: dict[str, list[str]] = {
    "sequence-classification": ["negative", "neutral", "positive"],
    "multi-label": ["billing", "shipping", "technical", "urgent"],
    "token-classification": ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"],
    "rerank": ["relevance"],
}


def train_tokenizer() -> Any:
    """A BERT-style uncased WordPiece tokenizer built from the fixture corpus, deterministically.

    tokenizers' WordPieceTrainer breaks ties between equally frequent merges in hash-map order, so
    its vocabulary changes from one process to the next. The vocabulary here is assembled from
    parts that do not: the words ranked by tokenizers' WordLevelTrainer (count, then word), every
    character of the corpus as a word start and as a ``##`` continuation (so no corpus text is
    [UNK] and unseen words split into pieces), and the most frequent word endings as ``##`` pieces.
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    corpus = fixture_corpus()
    words = [w for text in corpus for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]

    counter = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    counter.normalizer, counter.pre_tokenizer = normalizer, pre_tokenizer
    counter.train_from_iterator(corpus, trainers.WordLevelTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[], min_frequency=1, show_progress=False))
    ranked = sorted(counter.get_vocab().items(), key=lambda kv: kv[1])  # WordLevel ids follow the ranking

    chars = sorted({c for w in words for c in w})
    endings = Counter(w[-n:] for w in words for n in (2, 3, 4) if len(w) > n + 1)
    common_endings = sorted((e for e, c in endings.items() if c >= 3), key=lambda e: (-endings[e], e))[:100]
    vocab: dict[str, int] = {}
    for token in [*_SPECIALS, *chars, *(f"##{c}" for c in chars), *(f"##{e}" for e in common_endings),
                  *(w for w, _ in ranked)]:
        if token not in vocab and len(vocab) < VOCAB_SIZE:
            vocab[token] = len(vocab)

    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


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

    tok = train_tokenizer()
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


def build_fixture(kind: str, out: Path, seed: int = 0, quantize: bool = False, **options: Any) -> Path:
    """Build the fixture package for ``kind`` at ``out`` and return its path.

    ``options``: for embedding ``pooling`` (mean), ``normalize`` (True), ``layers`` ([1]) and
    ``dimensions`` ([32, 16]); any other ExportOptions field (``thresholds``, ``name``, ...).
    """
    return build_fixture_result(kind, out, seed=seed, quantize=quantize, **options).path


def build_fixture_result(kind: str, out: Path, seed: int = 0, quantize: bool = False, **options: Any) -> ExportResult:
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
        "quantize": "int8" if quantize else None,
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
