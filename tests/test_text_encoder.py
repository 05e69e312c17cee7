"""TextEncoder: specials, pairs, code-point offsets, reject / truncate / window, scan budgets."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from tokenizers import Tokenizer

from edge_runtime.text import Encoded, InputError, TextEncoder, Window
from edge_runtime.text.windows import longest_first, window_starts
from tests.support.tokenizers import ENGLISH, MINILM, spied_encoder, train_bytelevel_bpe, train_wordpiece


@functools.cache
def encoder(name: str, max_input_tokens: int = 512) -> TextEncoder:
    """Shared encoders (probed at most once per tokenizer in the test session)."""
    if max_input_tokens == 512:
        return spied_encoder(name)[1]
    if name == "minilm":
        return TextEncoder(MINILM, max_input_tokens)
    build = {"wordpiece": train_wordpiece, "bytelevel_bpe": train_bytelevel_bpe}[name]
    return TextEncoder.from_tokenizer(build(), max_input_tokens)


def reference(name: str) -> Tokenizer:
    """The same tokenizer, for the library's own answers (no padding, no truncation)."""
    tok = spied_encoder(name)[0].tokenizer
    assert tok.padding is None and tok.truncation is None
    return tok


NAMES = ["minilm", "wordpiece", "bytelevel_bpe"]


def _ok(result: Encoded | InputError) -> Encoded:
    assert isinstance(result, Encoded), result
    return result


def _err(result: Encoded | InputError, code: str) -> InputError:
    assert isinstance(result, InputError), result
    assert result.code == code
    return result


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text,pair", [
    ("Hello world, how are you?", None),
    ("", None),
    ("Résumé of 𝔘nicode 😀 text", "and a second 𝒮equence here"),
    ("question?", ""),
])
def test_rows_match_the_tokenizers_own_encoding(name: str, text: str, pair: str | None) -> None:
    ref = reference(name).encode(text, pair)
    row = _ok(encoder(name).encode(text, pair, max_tokens=512)).rows[0]
    assert row.ids.dtype == np.int64 and row.type_ids.dtype == np.int64 and row.offsets.dtype == np.int64
    assert row.ids.tolist() == ref.ids
    assert row.type_ids.tolist() == ref.type_ids
    assert row.sequence_ids == ref.sequence_ids
    assert [tuple(o) for o in row.offsets.tolist()] == ref.offsets
    assert row.offsets.shape == (len(ref.ids), 2)


def test_specials_and_pair_type_ids() -> None:
    enc = encoder("minilm")
    tok = reference("minilm")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    assert enc.num_special_tokens() == 2 and enc.num_special_tokens(pair=True) == 3
    row = _ok(enc.encode("a b", "c", max_tokens=512)).rows[0]
    assert row.ids[0] == cls and row.ids[-1] == sep and list(row.ids).count(sep) == 2
    assert row.sequence_ids[0] is None and row.sequence_ids[-1] is None
    assert row.type_ids.tolist() == [0, 0, 0, 0, 1, 1]  # [CLS] a b [SEP] c [SEP]:1
    specials = [i for i, s in enumerate(row.sequence_ids) if s is None]
    assert all(tuple(row.offsets[i]) == (0, 0) for i in specials)
    bpe = encoder("bytelevel_bpe")
    assert bpe.num_special_tokens() == 2 and bpe.num_special_tokens(pair=True) == 4


def test_baked_in_padding_and_truncation_are_off() -> None:
    # MiniLM's tokenizer.json pads to 128 and truncates at 128 (toolchain note P9)
    assert Tokenizer.from_file(str(MINILM)).padding is not None
    enc = TextEncoder(MINILM, 512)
    assert enc.tokenizer.padding is None and enc.tokenizer.truncation is None
    assert _ok(enc.encode("short", max_tokens=512)).rows[0].ids.shape == (3,)
    long_text = "word " * 300
    assert _ok(enc.encode(long_text, max_tokens=512)).rows[0].ids.shape == (302,)


@pytest.mark.parametrize("name", NAMES)
def test_offsets_count_code_points(name: str) -> None:
    text = "𝔘𝔫𝔦 x 😀😀 naïve 🇫🇷 end 中文"
    row = _ok(encoder(name).encode(text, max_tokens=512)).rows[0]
    content = [(int(s), int(e)) for (s, e), q in zip(row.offsets, row.sequence_ids) if q == 0]
    assert content and all(0 <= s <= e <= len(text) for s, e in content)
    # the tokens of a word after the non-BMP characters span exactly its code points
    for word in ("x", "naïve", "end"):
        at = text.index(word)
        inside = [(s, e) for s, e in content if s < at + len(word) and e > at]
        assert inside and min(s for s, _ in inside) == at and max(e for _, e in inside) == at + len(word)


def test_offsets_are_code_points_not_utf16_or_bytes() -> None:
    text = "😀 hello 𝔘 world"
    row = _ok(encoder("minilm").encode(text, max_tokens=512)).rows[0]
    spans = {text[s:e] for (s, e), q in zip(row.offsets.tolist(), row.sequence_ids) if q == 0}
    assert {"hello", "world"} <= spans  # UTF-16 or UTF-8 offsets would shift these


def test_reject_at_and_over_the_budget() -> None:
    enc = encoder("minilm")
    text = "one two three four five six"  # 6 tokens + 2 specials
    assert _ok(enc.encode(text, max_tokens=8)).rows[0].ids.shape == (8,)
    err = _err(enc.encode(text, max_tokens=7), "max_length_exceeded")
    assert "8 tokens" in err.message and "7 tokens" in err.message
    err = _err(enc.encode("a b c", "d e f", max_tokens=8), "max_length_exceeded")
    assert "9 tokens" in err.message
    assert _ok(enc.encode("a b c", "d e", max_tokens=8)).tokens == 8


def test_reject_of_a_long_text_says_at_least() -> None:
    err = _err(encoder("minilm").encode(ENGLISH * 400, max_tokens=64), "max_length_exceeded")
    assert "at least" in err.message and "64 tokens" in err.message


def test_max_tokens_is_capped_by_the_model() -> None:
    enc = encoder("minilm", 16)
    _err(enc.encode("word " * 20, max_tokens=512), "max_length_exceeded")
    row = _ok(enc.encode("word " * 20, max_tokens=512, overflow="truncate")).rows[0]
    assert row.ids.shape == (16,)


def test_budget_below_the_specials() -> None:
    err = _err(encoder("minilm").encode("", max_tokens=1), "max_length_exceeded")
    assert "special" in err.message
    assert _ok(encoder("minilm").encode("", max_tokens=2)).rows[0].ids.shape == (2,)


@pytest.mark.parametrize("name", NAMES)
def test_truncate_keeps_the_first_tokens(name: str) -> None:
    text = ENGLISH * 3
    ref = reference(name).encode(text, add_special_tokens=False)
    enc = encoder(name)
    specials = enc.num_special_tokens()
    result = _ok(enc.encode(text, max_tokens=40, overflow="truncate"))
    row = result.rows[0]
    assert row.ids.shape == (40,)
    content = [i for i, s in enumerate(row.sequence_ids) if s == 0]
    assert row.ids[content].tolist() == ref.ids[: 40 - specials]
    assert [tuple(o) for o in row.offsets[content].tolist()] == ref.offsets[: 40 - specials]
    # read whole: the count is exact; the usage counts every token read, not only those kept
    assert result.tokens == len(ref.ids) + specials and not result.tokens_lower_bound


def test_truncate_of_a_long_text_counts_the_tokens_read() -> None:
    spy, enc = spied_encoder("minilm")  # probed already: the probe's reading is not the input's
    spy.chars = 0
    text = ENGLISH * 2000
    result = _ok(enc.encode(text, max_tokens=128, overflow="truncate"))
    assert result.tokens_lower_bound and result.tokens > 128
    assert result.rows[0].ids.shape == (128,)
    assert spy.chars < len(text) // 10
    full = spy.tokenizer.encode(text[:20000], add_special_tokens=False).ids
    assert result.rows[0].ids[1:-1].tolist() == full[:126]


@pytest.mark.parametrize("n1,n2,budget", [
    (3, 4, 10), (8, 2, 6), (2, 8, 6), (9, 9, 7), (9, 9, 8), (10, 7, 9), (7, 10, 9), (20, 5, 11),
    (5, 20, 11), (12, 13, 11), (13, 12, 11), (1, 30, 4), (30, 1, 4), (6, 6, 5), (0, 9, 4), (9, 0, 4),
])
def test_pairs_truncate_longest_first_like_the_tokenizers_library(n1: int, n2: int, budget: int) -> None:
    assert sum(longest_first(n1, n2, budget)) == min(n1 + n2, budget)
    enc = encoder("minilm")
    text, pair = " ".join(["apple"] * n1), " ".join(["pear"] * n2)
    lib = Tokenizer.from_str(reference("minilm").to_str())
    lib.no_padding()
    lib.enable_truncation(budget + 3, strategy="longest_first")
    expected = lib.encode(text, pair)
    row = _ok(enc.encode(text, pair, max_tokens=budget + 3, overflow="truncate")).rows[0]
    assert row.ids.tolist() == expected.ids
    assert row.type_ids.tolist() == expected.type_ids
    assert row.sequence_ids == expected.sequence_ids


def test_pairs_read_in_part_still_truncate_longest_first() -> None:
    enc = encoder("minilm")
    short, long_ = "tiny text here", ENGLISH * 400
    row = _ok(enc.encode(short, long_, max_tokens=64, overflow="truncate")).rows[0]
    seq = row.sequence_ids
    assert seq.count(0) == 3 and seq.count(1) == 64 - 3 - 3
    result = _ok(enc.encode(long_, long_, max_tokens=65, overflow="truncate"))
    seq = result.rows[0].sequence_ids
    assert (seq.count(0), seq.count(1)) == (31, 31) and result.tokens_lower_bound
    result = _ok(enc.encode(long_, long_, max_tokens=64, overflow="truncate"))
    seq = result.rows[0].sequence_ids
    # both read in part: equal lengths as far as anyone read, the odd token goes second
    assert (seq.count(0), seq.count(1)) == (30, 31)


def test_window_starts() -> None:
    assert window_starts(5, 10, 2) == [0]
    assert window_starts(10, 10, 2) == [0]
    assert window_starts(11, 10, 2) == [0, 1]
    assert window_starts(30, 10, 2) == [0, 8, 16, 20]
    assert window_starts(26, 10, 2) == [0, 8, 16]
    with pytest.raises(ValueError):
        window_starts(30, 10, 10)


@pytest.mark.parametrize("name", NAMES)
def test_windows_cover_the_content_with_the_stride(name: str) -> None:
    enc = encoder(name)
    text = ENGLISH * 4
    ref = reference(name).encode(text, add_special_tokens=False)
    specials = enc.num_special_tokens()
    size, overlap = 64, 16
    result = _ok(enc.encode(text, max_tokens=4096, overflow="window", window=Window(size, overlap)))
    content = size - specials
    stride = content - overlap
    n = len(ref.ids)
    assert len(result.rows) == len(window_starts(n, content, overlap)) > 2
    for k, row in enumerate(result.rows):
        assert row.ids.shape == (size,)
        seq = [i for i, s in enumerate(row.sequence_ids) if s == 0]
        (start,) = row.sequence_starts
        assert start == (k * stride if k < len(result.rows) - 1 else n - content)
        assert row.ids[seq].tolist() == ref.ids[start:start + content]
        assert [tuple(o) for o in row.offsets[seq].tolist()] == ref.offsets[start:start + content]
        assert row.sequence_ids[0] is None and row.sequence_ids[-1] is None
    assert result.rows[-1].sequence_starts[0] + content == n  # the last window ends at the content's end
    # the input's own tokens, each read (once) by some window; windows in content-token ranges
    assert result.tokens == result.processed == n + specials and not result.truncated
    assert result.windows == [(r.sequence_starts[0], r.sequence_starts[0] + content) for r in result.rows]


def test_a_text_that_fits_one_window_is_one_row() -> None:
    result = _ok(encoder("minilm").encode("just a few words", max_tokens=512, overflow="window",
                                          window=Window(128, 32)))
    assert len(result.rows) == 1 and result.rows[0].ids.shape == (6,) and result.tokens == 6
    assert result.windows == [(0, 4)]  # one window over the 4 content tokens


def test_scan_budget() -> None:
    enc = encoder("minilm")
    text = "word " * 300  # 300 tokens + 2
    ok = _ok(enc.encode(text, max_tokens=302, overflow="window", window=Window(64, 8)))
    assert len(ok.rows) > 1
    err = _err(enc.encode(text, max_tokens=301, overflow="window", window=Window(64, 8)), "scan_budget_exceeded")
    assert "none of it was read" in err.message and "301" in err.message
    # scan_tokens, when given, is the scan budget
    _err(enc.encode(text, max_tokens=512, overflow="window", window=Window(64, 8), scan_tokens=100),
         "scan_budget_exceeded")
    assert _ok(enc.encode(text, max_tokens=64, overflow="window", window=Window(64, 8), scan_tokens=1000))


def test_scan_budget_reads_a_long_text_only_in_part() -> None:
    spy, enc = spied_encoder("minilm")
    spy.chars = 0
    text = ENGLISH * 5000
    err = _err(enc.encode(text, max_tokens=512, overflow="window", window=Window(128, 16), scan_tokens=2048),
               "scan_budget_exceeded")
    assert "at least" in err.message and spy.chars < 100_000 < len(text)


def test_scan_budget_over_the_character_bound_does_not_tokenize() -> None:
    enc = encoder("bytelevel_bpe")
    bound = enc.chars_per_token
    assert bound is not None
    _err(enc.encode("z" * (bound * 1000 + 10), max_tokens=512, overflow="window", window=Window(64, 8),
                    scan_tokens=1002), "scan_budget_exceeded")


def test_window_with_an_overlap_that_leaves_no_stride() -> None:
    enc = encoder("minilm")
    err = _err(enc.encode("word " * 50, max_tokens=512, overflow="window", window=Window(10, 8)),
               "max_length_exceeded")
    assert "overlap" in err.message
    # the same window is fine when the text fits in one
    assert len(_ok(enc.encode("word " * 5, max_tokens=512, overflow="window", window=Window(10, 8))).rows) == 1


def test_window_is_capped_by_the_model() -> None:
    enc = encoder("minilm", 32)
    result = _ok(enc.encode("word " * 100, max_tokens=512, overflow="window", window=Window(128, 4)))
    assert all(r.ids.shape == (32,) for r in result.rows)


def test_pair_windows_move_the_longer_sequence() -> None:
    enc = encoder("minilm")
    question, context = "who wrote it?", ENGLISH * 2
    ref_q = reference("minilm").encode(question, add_special_tokens=False).ids
    ref_c = reference("minilm").encode(context, add_special_tokens=False).ids
    for text, pair, moving in ((context, question, 0), (question, context, 1)):
        result = _ok(enc.encode(text, pair, max_tokens=4096, overflow="window", window=Window(48, 8)))
        assert len(result.rows) > 2
        content = 48 - 3 - len(ref_q)
        for row in result.rows:
            assert row.ids.shape == (48,)
            fixed = [i for i, s in enumerate(row.sequence_ids) if s == 1 - moving]
            moved = [i for i, s in enumerate(row.sequence_ids) if s == moving]
            assert row.ids[fixed].tolist() == ref_q  # the short one repeats whole
            start = row.sequence_starts[moving]
            assert row.sequence_starts[1 - moving] == 0
            assert row.ids[moved].tolist() == ref_c[start:start + content]
        assert result.rows[-1].sequence_starts[moving] + content == len(ref_c)
        types = result.rows[0].type_ids[[i for i, s in enumerate(result.rows[0].sequence_ids) if s == 1]]
        assert set(types.tolist()) == {1}


def test_pair_window_without_room_for_the_fixed_sequence() -> None:
    enc = encoder("minilm")
    err = _err(enc.encode(ENGLISH, ENGLISH * 2, max_tokens=4096, overflow="window", window=Window(64, 8)),
               "max_length_exceeded")
    assert "window" in err.message


def test_bad_overflow_arguments_are_programming_errors() -> None:
    enc = encoder("minilm")
    with pytest.raises(ValueError):
        enc.encode("x", max_tokens=8, overflow="window")
    with pytest.raises(ValueError):
        enc.encode("x", max_tokens=8, overflow="spill")  # type: ignore[arg-type]
