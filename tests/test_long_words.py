"""Long ASCII words are tokenized from their ends only, with the same ids and offsets as the whole text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from bench.harness.texts import shaped_text
from edge_runtime.text.bounds import BudgetReader
from edge_runtime.text.longwords import MIN_RUN, MIN_SPACE_RUN, SCAN_CHUNK, LongWords, long_runs, space_mask
from edge_runtime.text.tokenizer import analyze
from tests.support.tokenizers import load_minilm, train_bytelevel_bpe, train_wordpiece


@pytest.fixture(scope="module")
def sparrow_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    from converters.sparrow.export import build_sparrow_package

    package = build_sparrow_package(tmp_path_factory.mktemp("longwords-sparrow"))
    return Tokenizer.from_file(str(Path(package) / "tokenizer.json"))


def _whole(tok: Tokenizer, text: str) -> tuple[list[int], np.ndarray]:
    enc = tok.encode(text, add_special_tokens=False)
    return enc.ids, np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)


def _texts() -> list[str]:
    letters = "".join(chr(97 + (i * 7919) % 26) for i in range(3 * SCAN_CHUNK))
    hexrun = bytes(range(256)).hex() * 80  # 40,960 characters
    return [
        letters[: MIN_RUN * 3],  # the whole text is one word
        "Before it: " + letters[: 2 * SCAN_CHUNK + 5] + " and after it, words.",  # spans chunk edges
        letters[: MIN_RUN - 1] + " " + letters[: MIN_RUN] + "!" + letters[: MIN_RUN + 1],  # around the minimum
        # non-ASCII letters and marks at the ends of runs
        "caf\u00e9" + letters[:9000] + "\u00e9t\u00e9 \u4e2d\u6587" + hexrun.upper() + "\u0301\u0301 tail",
        "x" * 50_000 + "\U0001F600" + "Ab9" * 20_000 + "\ufffd" + "7" * 6000 + "\t" + "[UNK]" + "z" * 5000,
        "short words only, nothing long here. " * 400,
        ("w" * 5000 + " ") * 12,  # many runs, each shortened
        # white-space runs: long, at the ends, beside marks and CJK, between long words, just short
        " \u3000" * 400 + "lead \t\n\r\u00a0" * 300 + "word" + " " * 63 + "x" + "\n" * 64 + "y\u0301"
        + "\u00a0" * 5000 + "\u4e2d" + " " * 100 + letters[:MIN_RUN] + "\t" * 200 + "[SEP]" + " " * 90,
        shaped_text("whitespace runs", 300_000),
    ]


@pytest.mark.parametrize("name", ["sparrow", "minilm", "wordpiece"])
def test_shortened_long_words_read_as_the_whole_text(name: str, sparrow_tokenizer: Tokenizer) -> None:
    tok = {"sparrow": sparrow_tokenizer, "minilm": load_minilm(), "wordpiece": train_wordpiece()}[name]
    words = LongWords.for_tokenizer(tok)
    assert words is not None
    for text in _texts():
        enc, offsets = words.encode(tok, text)
        ids, want = _whole(tok, text)
        assert enc.ids == ids and np.array_equal(offsets, want), text[:40]
        if long_runs(text, words.min_len) or long_runs(text, MIN_SPACE_RUN, space_mask):
            assert len(words.shorten(text).text) < len(text)


def test_the_budget_reader_reads_one_long_word_from_its_ends(sparrow_tokenizer: Tokenizer) -> None:
    reader = BudgetReader(sparrow_tokenizer, analyze(sparrow_tokenizer))
    for text in ("q" * (8 << 20), "lead words " * 10 + "f00d" * (1 << 20) + ", then words" * 2000,
                 shaped_text("whitespace runs", 4 << 20)):
        got = reader.read(text, 512)
        ids, offsets = _whole(sparrow_tokenizer, text)
        assert np.array_equal(got.ids, ids[: len(got)]) and np.array_equal(got.offsets, offsets[: len(got)])
        assert len(got) >= min(512, len(ids))


def test_the_run_scan_finds_runs_across_chunks() -> None:
    text = "a" * (SCAN_CHUNK - 3) + "." + "b" * (SCAN_CHUNK + 10) + "\u00e9" + "c" * 99 + " " + "d" * 5000
    assert long_runs(text, 100) == [(0, SCAN_CHUNK - 3), (SCAN_CHUNK - 2, 2 * SCAN_CHUNK + 8),
                                    (2 * SCAN_CHUNK + 109, len(text))]
    assert long_runs(text, 99)[2] == (2 * SCAN_CHUNK + 9, 2 * SCAN_CHUNK + 108)
    assert long_runs("", 1) == [] and long_runs("\ud800" + "a" * 10, 10) == [(1, 11)]


def _with_pre_tokenizer(tok: Tokenizer, pre: object) -> Tokenizer:
    out = Tokenizer.from_str(tok.to_str())
    out.pre_tokenizer = pre
    return out


def test_tokenizers_that_could_split_or_match_inside_a_word_are_not_shortened() -> None:
    wordpiece = train_wordpiece()
    assert LongWords.for_tokenizer(train_bytelevel_bpe()) is None  # BPE spells a long word in pieces
    digits = pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Digits(individual_digits=True)])
    assert LongWords.for_tokenizer(_with_pre_tokenizer(wordpiece, digits)) is None
    no_pre = Tokenizer.from_str(wordpiece.to_str())
    spec = json.loads(no_pre.to_str())
    spec["pre_tokenizer"] = None
    assert LongWords.for_tokenizer(Tokenizer.from_str(json.dumps(spec))) is None
    added = Tokenizer.from_str(wordpiece.to_str())
    added.add_tokens([AddedToken("abc123", normalized=True)])  # could match inside a run of letters
    assert LongWords.for_tokenizer(added) is None
    spaced = Tokenizer.from_str(wordpiece.to_str())
    spaced.add_tokens([AddedToken("  ", normalized=False)])  # could match inside a run of spaces
    assert LongWords.for_tokenizer(spaced) is None
    word_level = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    assert LongWords.for_tokenizer(word_level) is None
