"""The one trainer of the fixtures' byte-level BPE tokenizers (Qwen- and ModernBERT-style): tiny
vocabularies trained on a fixture corpus, with the special tokens first and, where a family reads
codes, extra tokens appended as whole tokens (each with the merge that makes it)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any


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
