"""The trainers of the fixtures' tokenizers: byte-level BPE (Qwen- and ModernBERT-style), tiny
vocabularies trained on a fixture corpus, with the special tokens first and, where a family reads
codes, extra tokens appended as whole tokens (each with the merge that makes it); and a BERT-style
WordPiece (the encoder and dual-encoder fixtures)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

WORD_PIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def byte_level_bpe(corpus: Iterable[str], specials: Sequence[str], *, vocab_size: int,
                   pre_tokenizer: Any = None, nfc: bool = False, min_frequency: int = 0,
                   extra_tokens: Sequence[str] = ()) -> Any:
    """A trained byte-level BPE ``tokenizers.Tokenizer``.

    ``pre_tokenizer`` defaults to ByteLevel (GPT-2's regex); ``nfc`` adds the NFC normalizer Qwen's
    tokenizers have; ``extra_tokens`` (two characters each) join the vocabulary after training, so a
    fixture's codes are single tokens whatever the corpus held. The special tokens keep the ids the
    trainer gives them (the first ones), which is checked.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(corpus), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), min_frequency=min_frequency,
        show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if not extra_tokens:
        return tok
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges: list[Any] = spec["model"]["merges"]
    as_pairs = bool(merges) and isinstance(merges[0], list)
    for token in extra_tokens:
        if token not in vocab:
            vocab[token] = max(vocab.values()) + 1
            merges.append([token[0], token[1]] if as_pairs else f"{token[0]} {token[1]}")
    if any(vocab.get(entry["content"]) != entry["id"] for entry in spec["added_tokens"]):
        raise RuntimeError("fixture tokenizer: special tokens are not where the trainer put them")
    return Tokenizer.from_str(json.dumps(spec))


def word_piece(vocab_size: int = 1200) -> Any:
    """A BERT-style uncased WordPiece tokenizer built from the fixture corpus, deterministically.

    tokenizers' WordPieceTrainer breaks ties between equally frequent merges in hash-map order, so
    its vocabulary changes from one process to the next. The vocabulary here is assembled from
    parts that do not: the words ranked by tokenizers' WordLevelTrainer (count, then word), every
    character of the corpus as a word start and as a ``##`` continuation (so no corpus text is
    [UNK] and unseen words split into pieces), and the most frequent word endings as ``##`` pieces.
    """
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from converters.samples import fixture_corpus

    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    corpus = fixture_corpus()
    words = [w for text in corpus for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]

    counter = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    counter.normalizer, counter.pre_tokenizer = normalizer, pre_tokenizer
    counter.train_from_iterator(corpus, trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=[], min_frequency=1, show_progress=False))
    ranked = sorted(counter.get_vocab().items(), key=lambda kv: kv[1])  # WordLevel ids follow the ranking

    chars = sorted({c for w in words for c in w})
    endings = Counter(w[-n:] for w in words for n in (2, 3, 4) if len(w) > n + 1)
    common_endings = sorted((e for e, c in endings.items() if c >= 3), key=lambda e: (-endings[e], e))[:100]
    vocab: dict[str, int] = {}
    for token in [*WORD_PIECE_SPECIALS, *chars, *(f"##{c}" for c in chars), *(f"##{e}" for e in common_endings),
                  *(w for w, _ in ranked)]:
        if token not in vocab and len(vocab) < vocab_size:
            vocab[token] = len(vocab)

    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok
