"""The ASCII word path gives exactly the tokenizer's ids and offsets, or declines the text or the tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, normalizers

from edge_runtime.text.ascii_words import MAX_CACHED_WORDS, MAX_CHARS, AsciiWords
from edge_runtime.text.bounds import BudgetReader
from edge_runtime.text.tokenizer import analyze
from tests.support.tokenizers import load_minilm, train_bytelevel_bpe, train_wordpiece


@pytest.fixture(scope="module")
def sparrow_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    from converters.sparrow.export import build_sparrow_package

    package = build_sparrow_package(tmp_path_factory.mktemp("ascii-words-sparrow"))
    return Tokenizer.from_file(str(Path(package) / "tokenizer.json"))


def minilm() -> Tokenizer:
    """all-MiniLM-L6-v2's tokenizer as the server loads it: its file pads and truncates to 128."""
    tok = load_minilm()
    tok.no_truncation()
    tok.no_padding()
    return tok


def cased_wordpiece() -> Tokenizer:
    tok = train_wordpiece()
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    return tok


def with_added_tokens() -> Tokenizer:
    """Added tokens matched before normalizing ([CLS]-like) and after it (normalized=True)."""
    tok = train_wordpiece()
    tok.add_special_tokens(["<ctl>"])
    tok.add_tokens([AddedToken("Hello World", normalized=True), AddedToken("zz", single_word=True)])
    return tok


def random_texts(rng: random.Random, words: list[str], count: int) -> list[str]:
    """Printable ASCII with tabs and newlines: vocabulary words, their case variants, runs of one
    character class, punctuation clusters and long words around the WordPiece limit."""
    alphabet = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\r"]
    pieces: list[str] = []
    out = []
    for _ in range(count):
        pieces.clear()
        for _ in range(rng.randint(0, 40)):
            kind = rng.random()
            if kind < 0.45:
                w = rng.choice(words)
                pieces.append(w.upper() if rng.random() < 0.15 else w.title() if rng.random() < 0.2 else w)
            elif kind < 0.75:
                pieces.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))))
            elif kind < 0.9:
                pieces.append(rng.choice(" \t\n\r  ") * rng.randint(1, 3))
            else:
                pieces.append(rng.choice("abcxyz019") * rng.choice([1, 20, 99, 100, 101, 150]))
        out.append(rng.choice(["", " "]).join(pieces))
    return out


@pytest.mark.parametrize("name", ["sparrow", "minilm", "wordpiece", "cased", "added"])
def test_ids_equal_the_tokenizers_on_random_ascii(name: str, sparrow_tokenizer: Tokenizer) -> None:
    builders = {"minilm": minilm, "wordpiece": train_wordpiece, "cased": cased_wordpiece,
                "added": with_added_tokens}
    tok = sparrow_tokenizer if name == "sparrow" else builders[name]()
    words = AsciiWords.for_tokenizer(tok)
    assert words is not None
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    vocab = [w for w in tok.get_vocab() if w.isascii() and not w.startswith("##") and w not in added]
    rng = random.Random(name)
    texts = random_texts(rng, vocab, 1500)
    texts += ["Hello World and hello world", "<ctl> control", "a zz b", "azz zzb", "[CLS] [unk] [SEP]"]
    read = 0
    for text in texts * 2:  # the second pass reads from the cache
        got = words.ids(text)
        encoded = words.encode(text)
        if got is None:
            assert encoded is None
            continue
        read += 1
        want = tok.encode(text, add_special_tokens=False)
        assert got == want.ids, repr(text)
        assert encoded is not None and encoded[0] == want.ids, repr(text)
        assert encoded[1].tolist() == [list(o) for o in want.offsets], repr(text)
    # declined: exactly the texts that hold an added token's text, as written or lowercased
    holding = [t for t in texts if any(a in t or a.lower() in t.lower() for a in added)]
    assert read == 2 * (len(texts) - len(holding))


def test_texts_it_declines_and_the_cache_bound(sparrow_tokenizer: Tokenizer) -> None:
    words = AsciiWords.for_tokenizer(sparrow_tokenizer)
    assert words is not None
    for text in ["caf\u00e9", "ctrl\x00char", "bell\x07", "vt\x0bff\x0c", "del\x7f", "x" * (MAX_CHARS + 1)]:
        assert words.ids(text) is None, repr(text)
    assert words.ids("x" * MAX_CHARS) == sparrow_tokenizer.encode("x" * MAX_CHARS, add_special_tokens=False).ids
    many = [f"w{i}q" for i in range(MAX_CACHED_WORDS + 10)]
    for w in many:
        words.ids(w)
    assert len(words._words) <= MAX_CACHED_WORDS
    assert words.ids(" ".join(many[:50])) == sparrow_tokenizer.encode(" ".join(many[:50]),
                                                                      add_special_tokens=False).ids


def test_tokenizers_it_does_not_take() -> None:
    assert AsciiWords.for_tokenizer(train_bytelevel_bpe()) is None
    assert AsciiWords.for_tokenizer(load_minilm()) is None  # pads and truncates
    truncating = train_wordpiece()
    truncating.enable_truncation(8)
    assert AsciiWords.for_tokenizer(truncating) is None
    dirty = train_wordpiece()
    dirty.normalizer = normalizers.BertNormalizer(clean_text=False)
    assert AsciiWords.for_tokenizer(dirty) is None


def test_the_budget_reader_reads_through_it(sparrow_tokenizer: Tokenizer) -> None:
    reader = BudgetReader(sparrow_tokenizer, analyze(sparrow_tokenizer))
    text = "The parcel never came, and I was charged twice! Order #4471-B; call me at 555-0100."
    want = sparrow_tokenizer.encode(text, add_special_tokens=False).ids
    assert reader.ids(text, 1000) == (want, False)
    assert reader.ids(text, 5) == (want[:5], True)
    assert reader.ids("\u00e9t\u00e9 " + text, 1000)[0] == sparrow_tokenizer.encode(
        "\u00e9t\u00e9 " + text, add_special_tokens=False).ids
    # read(): ids and offsets, whole and cut at a budget, as the tokenizer gives them
    enc = sparrow_tokenizer.encode(text, add_special_tokens=False)
    whole = reader.read(text, 1000)
    assert whole.complete and whole.ids.tolist() == enc.ids
    assert whole.offsets.tolist() == [list(o) for o in enc.offsets]
    long_text = " ".join([text] * 400)  # past the first prefix: read through a cut
    long_enc = sparrow_tokenizer.encode(long_text, add_special_tokens=False)
    first = reader.read(long_text, 12)
    assert not first.complete and len(first) >= 12
    assert first.ids.tolist() == long_enc.ids[:len(first)]
    assert first.offsets.tolist() == [list(o) for o in long_enc.offsets[:len(first)]]
