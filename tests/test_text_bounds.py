"""The budget cut reads the same tokens as the whole text, and a long text costs only its budget."""

from __future__ import annotations

import base64
import tracemalloc
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from edge_runtime.text import TextEncoder
from edge_runtime.text.bounds import BudgetReader
from edge_runtime.text.chars import (
    BOUNDARY_CLASSES,
    CutClass,
    boundary_class,
    boundary_pattern,
    boundary_table,
    is_run_cut,
    starts_cleanly,
)
from edge_runtime.text.cuts import SCAN_CHUNK, Cutter
from edge_runtime.text.tokenizer import analyze
from tests.support.tokenizers import BUILDERS, CORPUS, ENGLISH, Spy, spied_encoder, train_bytelevel_bpe, train_wordpiece


@pytest.fixture(params=sorted(BUILDERS))
def spied(request: pytest.FixtureRequest) -> tuple[str, Spy, TextEncoder]:
    spy, encoder = spied_encoder(request.param)
    return request.param, spy, encoder


def _lcg_bytes(n: int, seed: int = 3) -> bytes:
    out, x = bytearray(), seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append(x >> 56)
    return bytes(out)


CODE = (
    "class Reader:\n    def read(self, text: str, need: int) -> list[int]:\n        if need <= 0:\n"
    "            return []\n        return self._encode(text[: need * 6 + 1024])  # prefix only\n"
    "x = {'a': [1, 2, 3], 'b': (4, 5)}; y = x['a'][0] ** 2 != 3 and not x.get('c')\n"
)
CJK = (
    "自然语言处理是计算机科学领域与人工智能领域中的一个重要方向它研究能实现人与计算机之间用自然语言进行有效通信的各种理论和方法"
    "東京都は日本の首都であり人口は約千四百万人ですこのもりにはたくさんのとりがいます"
    "한국어문장을띄어쓰기없이길게씁니다서울은한국의수도입니다"
)
EMOJI = (
    "😀😃😄 👨‍👩‍👧‍👦 family, flags 🇺🇸🇯🇵🇩🇪🏴󠁧󠁢󠁳󠁣󠁴󠁿, skin tones 👍🏽👋🏿, keycaps 1️⃣#️⃣, "
    "❤️‍🔥🔥🎉 ok😂😂😂 end. "
)
BASE64 = (
    "payload=" + base64.b64encode(_lcg_bytes(9000)).decode("ascii") + " hex=" + _lcg_bytes(2000, 5).hex() + " done. "
)

TEXTS = {
    "english": ENGLISH * 200,
    "code": CODE * 200,
    "cjk": CJK * 150,
    "emoji": EMOJI * 300,
    "base64": BASE64 * 2,
}


def _whole(tokenizer: Any, text: str) -> tuple[np.ndarray, np.ndarray]:
    enc = tokenizer.encode(text, add_special_tokens=False)
    return np.asarray(enc.ids, dtype=np.int64), np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)


@pytest.mark.parametrize("need", [40, 700])
@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_cut_keeps_the_whole_texts_first_tokens(spied: tuple[str, Spy, TextEncoder], kind: str, need: int) -> None:
    name, spy, encoder = spied
    text = TEXTS[kind]
    reader: BudgetReader = encoder._reader
    spy.chars = 0
    got = reader.read(text, need)
    read_chars = spy.chars
    ids, offsets = _whole(spy.tokenizer, text)
    n = len(got)
    assert n >= min(need, len(ids))
    assert np.array_equal(got.ids, ids[:n]), f"{name}/{kind}: ids differ from the whole text's"
    assert np.array_equal(got.offsets, offsets[:n]), f"{name}/{kind}: offsets differ from the whole text's"
    if got.complete:
        assert n == len(ids)
    else:
        assert read_chars < len(text)  # a real cut: the text was read only in part
    # every tokenizer here cuts English, code and the base64 text (it has + / = between runs)
    if kind in ("english", "code", "base64"):
        assert not got.complete, f"{name} read all of {kind}"


def test_cjk_and_emoji_are_cut_where_the_probe_allows(spied: tuple[str, Spy, TextEncoder]) -> None:
    name, spy, encoder = spied
    enabled = encoder.cut_report().enabled
    if CutClass.HAN in enabled or CutClass.RUN in enabled:
        assert not encoder._reader.read(TEXTS["cjk"], 200).complete
    if CutClass.WHITESPACE in enabled:
        assert not encoder._reader.read(TEXTS["emoji"], 200).complete


def test_probe_results_per_tokenizer() -> None:
    minilm = spied_encoder("minilm")[1]
    report = minilm.cut_report()
    assert minilm.chars_per_token is None  # WordPiece folds: no characters-per-token bound
    assert report.classes["run"].startswith("disabled")
    for cls in ("whitespace", "punctuation", "ascii_symbol", "han"):
        assert report.classes[cls] == "pass", report.classes
    # BERT does not split a run of emoji, kana or Hangul, and reads >100 characters as one [UNK]:
    # cutting inside such a run changes the tokens, and the probe must notice
    for cls in (CutClass.SYMBOL, CutClass.KANA, CutClass.HANGUL):
        assert report.classes[cls.value].startswith("fail"), report.classes
        assert cls not in report.enabled
    # the trained WordPiece spells other characters; its own spellable runs still expose the cut
    wordpiece = spied_encoder("wordpiece")[1].cut_report()
    for cls in (CutClass.SYMBOL, CutClass.KANA, CutClass.HANGUL):
        assert cls not in wordpiece.enabled, wordpiece.classes
    assert CutClass.WHITESPACE in wordpiece.enabled and CutClass.HAN in wordpiece.enabled

    bpe = spied_encoder("bytelevel_bpe")[1]
    assert bpe.traits.folds is False
    assert bpe.chars_per_token == bpe.traits.longest_token_chars
    assert CutClass.WHITESPACE in bpe.cut_report().enabled


def test_a_tokenizer_that_fails_every_cut_reads_whole_texts() -> None:
    spy = Spy(train_bytelevel_bpe())
    encoder = TextEncoder.from_tokenizer(spy, 512)  # type: ignore[arg-type]
    # a probe whose texts are unrelated to the cut classes enables nothing
    from edge_runtime.text import probe as probe_module

    report = probe_module.probe_cuts(spy, encoder.traits, 16, texts=lambda: [("none", "x")])  # type: ignore[arg-type]
    assert report.enabled == frozenset()
    reader = BudgetReader(spy, encoder.traits)  # type: ignore[arg-type]
    reader._report, reader._cutter = report, Cutter(report.enabled, 16)
    spy.chars = 0
    got = reader.read(TEXTS["english"], 10)
    assert got.complete and spy.chars == len(TEXTS["english"])


def test_long_added_tokens_widen_the_lookback() -> None:
    tok = train_bytelevel_bpe()
    marker = "<|an-added-token-longer-than-any-in-the-vocabulary|>" * 3
    assert len(marker) > analyze(tok).longest_token_chars
    tok.add_tokens([marker])
    encoder = TextEncoder.from_tokenizer(tok, 512)
    assert encoder._reader.lookback == len(marker) + 1
    text = ("see " + marker + " and more words here, " + marker + marker + " ") * 400
    got = encoder._reader.read(text, 300)
    ids, offsets = _whole(tok, text)
    assert not got.complete
    assert np.array_equal(got.ids, ids[: len(got)]) and np.array_equal(got.offsets, offsets[: len(got)])


def test_wordpiece_reads_an_unbroken_run_whole() -> None:
    spy, encoder = spied_encoder("minilm")
    run = _lcg_bytes(20000, 9).hex()  # 40,000 hex characters: one word, one [UNK]
    text = "start " + run + " and then ordinary words follow. " * 300
    spy.chars = 0
    got = encoder._reader.read(text, 100)
    ids, offsets = _whole(spy.tokenizer, text)
    assert np.array_equal(got.ids, ids[: len(got)]) and np.array_equal(got.offsets, offsets[: len(got)])
    assert spy.tokenizer.id_to_token(int(got.ids[1])) == "[UNK]" and tuple(got.offsets[1]) == (6, 6 + len(run))
    assert not got.complete
    # the run is read past its end, yet the tokenizer is handed only its ends (text.longwords):
    # the [UNK] above still spans all of it
    assert spy.chars < len(run)


FIVE_MIB = 5 * 1024 * 1024


def _five_mib() -> str:
    block = ENGLISH + CODE + EMOJI + "机器学习是人工智能的一个分支。" + base64.b64encode(_lcg_bytes(600)).decode() + " "
    return (block * (FIVE_MIB // len(block) + 1))[:FIVE_MIB]


@pytest.mark.parametrize("overflow", ["reject", "truncate"])
def test_five_mib_costs_its_budget_not_its_length(spied: tuple[str, Spy, TextEncoder], overflow: str) -> None:
    name, spy, encoder = spied
    text = _five_mib()
    spy.chars = spy.calls = 0
    tracemalloc.start()
    try:
        result = encoder.encode(text, max_tokens=512, overflow=overflow)  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert spy.chars <= 64 * 1024, f"{name} tokenized {spy.chars:,} characters of a 5 MiB text"
    assert peak < 4 * 1024 * 1024, f"{name} allocated {peak:,} bytes (a copy of the text is 5 MiB)"
    if overflow == "reject":
        assert getattr(result, "code", None) == "max_length_exceeded"
    else:
        assert result.rows[0].ids.shape == (512,)  # type: ignore[union-attr]
        assert result.tokens > 512 and result.tokens_lower_bound  # type: ignore[union-attr]


def test_reject_over_the_character_bound_does_not_tokenize() -> None:
    spy, encoder = spied_encoder("bytelevel_bpe")
    bound = encoder.chars_per_token
    assert bound is not None
    room = 512 - encoder.num_special_tokens()
    spy.chars = 0
    result = encoder.encode("a" * (room * bound + 1), max_tokens=512)
    assert getattr(result, "code", None) == "max_length_exceeded" and spy.chars == 0
    assert "characters" in result.message  # type: ignore[union-attr]


def test_traits_of_the_test_tokenizers() -> None:
    wp = analyze(train_wordpiece())
    assert wp.folds and wp.chars_per_token is None
    bpe = analyze(train_bytelevel_bpe())
    assert not bpe.folds and not bpe.composes and bpe.chars_per_token == bpe.longest_token_chars
    nfc = train_bytelevel_bpe()
    nfc.normalizer = normalizers.NFC()
    assert analyze(nfc).chars_per_token == 4 * analyze(nfc).longest_token_chars  # NFC folds up to 4 into 1
    lowered = train_bytelevel_bpe()
    lowered.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.Lowercase()])
    assert analyze(lowered).chars_per_token is None


def test_cut_points_respect_normalization() -> None:
    assert boundary_class(" ") is CutClass.WHITESPACE and boundary_class("\u3000") is CutClass.WHITESPACE
    assert boundary_class(",") is CutClass.PUNCTUATION and boundary_class("\u3002") is CutClass.PUNCTUATION
    assert boundary_class("+") is CutClass.ASCII_SYMBOL and boundary_class("\U0001F600") is CutClass.SYMBOL
    assert boundary_class("\u4e2d") is CutClass.HAN and boundary_class("\u3042") is CutClass.KANA
    assert boundary_class("\uac00") is CutClass.HANGUL and boundary_class("a") is None
    # NFC/NFKC compose these with the character before them: never cut before them
    for ch in ("\u0301", "\u1161", "\u11a8", "\u0bbe", "\uff9e", "\u314f", "\u3099"):
        assert not starts_cleanly(ch) and boundary_class(ch) is None and not is_run_cut(ch), hex(ord(ch))
    assert is_run_cut("Q") and is_run_cut("7") and is_run_cut("\u4e2d") and not is_run_cut("\u200d")


def test_cutter_plans_before_a_boundary_and_keeps_whole_words() -> None:
    cutter = Cutter({CutClass.WHITESPACE}, 16)
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
    cut = cutter.plan(text, 40)
    assert cut is not None and text[cut.end] == " " and cut.end <= 40
    assert cut.keep <= cut.end - 16 and (text[cut.keep] == " " or text[cut.keep - 1] == " ")
    assert cutter.plan(text, len(text)) is None  # the whole text fits: read it whole
    run = Cutter({CutClass.WHITESPACE, CutClass.RUN}, 16)
    long_run = "x " + "ab1" * 3000
    cut = run.plan(long_run, 6000)
    assert cut is not None and cut.keep == cut.end - 1024 and is_run_cut(long_run[cut.end])


@pytest.mark.parametrize("classes", [
    frozenset(BOUNDARY_CLASSES),
    frozenset({CutClass.WHITESPACE, CutClass.PUNCTUATION, CutClass.ASCII_SYMBOL, CutClass.HAN}),  # WordPiece's
    frozenset({CutClass.SYMBOL, CutClass.KANA}),
])
def test_the_boundary_table_is_the_boundary_pattern(classes: frozenset[CutClass]) -> None:
    pattern, table = boundary_pattern(classes), boundary_table(classes)
    assert pattern is not None and table is not None
    every = "".join(chr(cp) for cp in range(0x110000))  # lone surrogates included
    matched = np.zeros(0x110000, dtype=bool)
    matched[[m.start() for m in pattern.finditer(every)]] = True
    assert np.array_equal(matched, table)


def test_the_forward_scan_finds_the_first_boundary_across_chunks() -> None:
    classes = {CutClass.WHITESPACE, CutClass.PUNCTUATION, CutClass.ASCII_SYMBOL, CutClass.HAN}
    cutter = Cutter(classes, 16)
    pattern = boundary_pattern(frozenset(classes))
    assert pattern is not None
    word = "a\ud800\U0001f600\u00e9" * (SCAN_CHUNK // 2)  # letters, a lone surrogate, emoji: no boundary
    for at in (0, 5, SCAN_CHUNK - 1, SCAN_CHUNK, SCAN_CHUNK + 1, 3 * SCAN_CHUNK - 7):
        for mark in (" ", "!", "\u4e2d", "+"):
            text = word[:at] + mark + word[at:]
            for start in (0, 3, at, at + 1):
                m = pattern.search(text, start)
                assert cutter._next_boundary(text, start) == (m.start() if m else None), (at, mark, start)
    assert cutter._next_boundary(word, 0) is None and cutter._next_boundary(word, len(word) + 5) is None


def train_bpe_with_long_runs() -> Tokenizer:
    """A byte-level BPE whose vocabulary merged long runs of one character (as GPT-2's has)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    runs = ["=" * n for n in (8, 16, 32, 64, 128)] * 30 + ["-" * 64 + " " * 32 + "word"] * 30 + ["😀" * 40] * 20
    tok.train_from_iterator(CORPUS + runs, trainers.BpeTrainer(
        vocab_size=1500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    ))
    return tok


def test_long_vocabulary_tokens_widen_the_lookback() -> None:
    tok = train_bpe_with_long_runs()
    encoder = TextEncoder.from_tokenizer(tok, 512)
    assert encoder.traits.longest_token_chars >= 128
    assert encoder._reader.lookback == encoder.traits.longest_token_chars + 1
    # need 200 puts the first cut at character 2,224, inside the run of '=': the whole text tiles it
    # with 128-character tokens, a prefix ending 40-100 characters into it with shorter ones that
    # end well before the cut; a lookback of 16 would keep those
    for lead in (2124, 2150, 2170):
        text = ("ab " * 800)[:lead] + "=" * 3000 + " tail"
        ids, offsets = _whole(tok, text)
        got = encoder._reader.read(text, 200)
        assert not got.complete
        assert np.array_equal(got.ids, ids[: len(got)]) and np.array_equal(got.offsets, offsets[: len(got)])
