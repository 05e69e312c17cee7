"""Checking each kind of cut against whole-text tokenization, once per tokenizer.

The probe tokenizes texts whole: fixed sections (English, code, CJK without spaces, emoji with ZWJ
sequences and flags, base64 and hex runs, combining marks, mixed scripts, symbol runs and runs of
one repeated character), each between the tail of one section and the head of another (two
orders), plus, per class, long runs of characters the tokenizer itself spells as one word. For
every cut class it then cuts those texts at positions of that class, spread evenly and at fixed
depths into the longest runs, and requires the exact tokens of each cut (ids and offsets) to be
the whole text's first tokens. Only classes that pass everywhere are enabled, and their union is
checked again; a tokenizer that drops or folds characters never cuts inside a run."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from edge_runtime.text.chars import BOUNDARY_CLASSES, CutClass, boundary_class, is_run_cut
from edge_runtime.text.cuts import RUN_MARGIN, Cut, Cutter
from edge_runtime.text.tokenizer import TokenizerTraits

SAMPLES_PER_TEXT = 6  # cut positions spread evenly over each text, per class
CONTEXT_CHARS = 200  # of the neighbouring sections around each probe text
SPELL_CANDIDATES = 400  # characters per class tried for spellable runs
RUN_DISTINCT_CHARS = 24  # distinct characters per spellable run
LONGEST_RUNS = 2  # stretches of one class per text that also get cuts at fixed depths


def lcg_bytes(seed: int, n: int) -> bytes:
    """Deterministic pseudo-random bytes (a 64-bit LCG), the same on every platform and Python."""
    out = bytearray()
    x = seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(x >> 56)
    return bytes(out)


def _sections() -> list[tuple[str, str]]:
    english = (
        "The quick brown fox didn't jump over the lazy dog; it's 3.14 times faster, isn't it? "
        "On 2024-05-01, about 1,000 people (roughly 12.5%) e-mailed support@example.com or visited "
        "https://example.com/path/to/page?q=long+input&lang=en#section-2 to ask \u201chow long is "
        "too long?\u201d \u2014 and the answer was\u2026 it depends.  Two  spaces, a\ttab,\nnewlines\n\n"
        "and Mr. O'Neill's co-operative re-entry. ALL CAPS SHOUTING, CamelCaseWords, snake_case_words, "
        "antidisestablishmentarianism, pneumonoultramicroscopicsilicovolcanoconiosis and "
        "supercalifragilisticexpialidocious are long words. "
    ) * 2
    code = (
        "#include <stdio.h>\nint main(int argc, char **argv) {\n    for (int i = 0; i < argc; ++i) {\n"
        "        printf(\"%s\\n\", argv[i]); /* print each argument */\n    }\n    return 0x1F << 2;\n}\n"
        "def merge_sorted_lists(left: list[int], right: list[int]) -> list[int]:\n"
        "    \"\"\"Merge two sorted lists in O(n + m).\"\"\"\n    i = j = 0\n    out = []\n"
        "    while i < len(left) and j < len(right):\n        if left[i] <= right[j]:\n"
        "            out.append(left[i]); i += 1\n        else:\n            out.append(right[j]); j += 1\n"
        "    return out + left[i:] + right[j:]\n"
        "const x = a !== b ? (c ?? d) : e?.f || g && h; // ========== --> <== ::: ...\n"
        "if (x >= 10 && y <= -3) { z ^= 0b1010; w |= ~v; u >>>= 1; } $var @decorator `tpl ${x}`\n"
        "SELECT id, name FROM users WHERE email LIKE '%@example.com' ORDER BY created_at DESC;\n"
        "veryLongIdentifierNameThatKeepsGoingAndGoingWithoutAnySeparatorsAtAllForTesting = 42\n"
    )
    cjk = (
        "自然语言处理是人工智能和语言学领域的分支学科此领域探讨如何处理及运用自然语言自然语言处理包括多方面和步骤"
        "基本有认知理解生成等部分自然语言认知和理解是让电脑把输入的语言变成有意思的符号和关系然后根据目的再处理"
        "。日本語の文章は単語の間にスペースを入れずに書かれますひらがなとカタカナと漢字が混ざっています"
        "ひらがなだけのながいぶんしょうもこのようにつづけてかくことができますがよみにくいかもしれません"
        "カタカナダケノナガイブンショウモコノヨウニツヅケテカクコトガデキマスガヨミニクイカモシレマセン"
        "。한국어는띄어쓰기를하지않으면읽기가어렵지만이렇게길게붙여서쓸수도있습니다한글은음절단위로모아씁니다"
        "대한민국의수도는서울이며인구는약천만명입니다 한국어 문장은 보통 띄어쓰기를 합니다. "
        "中文也可以有标点符号，例如逗号、句号。还有引号「这样」和书名号《那样》！"
    )
    # Unbroken runs longer than WordPiece's 100-character word limit, of the commonest characters
    # (a vocabulary most likely has them as word pieces, so a cut run does not turn into [UNK]).
    cjk += " " + " ".join(
        (run * 20)[:240]
        for run in (
            "このもりにはたくさんのとりがいますそしてかわのみずはきれいです",
            "カタカナノナガイブンショウヲヨム",
            "이다는의가에을를하고서도한국사람이있다",
            "한국어문장을띄어쓰기없이길게씁니다",
            "漢字だけの長い文章を読むテスト",
        )
    ) + "。"
    emoji = (
        "Family: \U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466 flags: "
        "\U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5\U0001F1E9\U0001F1EA\U0001F3F4\U000E0067\U000E0062"
        "\U000E0065\U000E006E\U000E0067\U000E007F skin: \U0001F44D\U0001F3FD\U0001F44B\U0001F3FF "
        "keycap: 1\uFE0F\u20E3 #\uFE0F\u20E3 heart: \u2764\uFE0F love \U0001F60D\U0001F525\U0001F389 ok. "
        + "\U0001F600\U0001F603\U0001F604\U0001F601\U0001F468\u200D\U0001F4BB\U0001F1EC\U0001F1E7"
        "\u2764\uFE0F\U0001F44D\U0001F3FD" * 14
        + " text\U0001F600between\U0001F602emoji \U0001F9D1\U0001F3FB\u200D\U0001F91D\u200D"
        "\U0001F9D1\U0001F3FF the end. "
    )
    raw = lcg_bytes(7, 1200)
    b64 = base64.b64encode(raw).decode("ascii")
    b64url = base64.urlsafe_b64encode(raw[:300]).decode("ascii")
    hexrun = raw[:700].hex()
    alnum = base64.b64encode(lcg_bytes(11, 1000)).decode("ascii").replace("+", "q").replace("/", "Z").rstrip("=")
    runs = f"data:image/png;base64,{b64} and {b64url} sha256={hexrun} token={alnum} " + "0123456789" * 20 + " end."
    combining = (
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u: Vie\u0302\u0323t Nam, ca\u0301c da\u0302\u0301u. "
        "Decomposed e\u0301le\u0300ve cafe\u0301 nai\u0308ve re\u0301sume\u0301 \u00e9l\u00e8ve. "
        "Zalgo: Z\u0337\u0322\u034ea\u0338\u0327\u032fl\u0335\u0321g\u0336\u0328o\u0334\u031b "
        "t\u0336\u0351e\u0334\u0350x\u0335\u0357t\u0337\u0346. Greek: \u03b1\u0313\u0300\u0345 "
        "\u1f82 \u03a9\u0313\u0342\u0345 \u1f10\u03bd \u1f00\u03c1\u03c7\u1fc7 "
        "\u1f26\u03bd \u1f41 \u03bb\u03cc\u03b3\u03bf\u03c2. "
        "Jamo: " + "\u1100\u1161\u11a8\u1102\u1165\u11ab\u1103\u1169" * 10 + " "
        "Compat: \u3131\u314f\u3134\u3153 halfwidth: \uff76\uff9e\uff77\uff9e\uff8a\uff9f fullwidth: "
        "\uff21\uff22\uff23\uff11\uff12\uff13 ligatures: \ufb01\ufb02 \ufdfa. Devanagari: "
        "\u0939\u093f\u0928\u094d\u0926\u0940 \u0915\u094d\u0937 \u0928\u092e\u0938\u094d\u0924\u0947. "
        "Thai: \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e40\u0e02\u0e35\u0e22\u0e19\u0e15\u0e34\u0e14"
        "\u0e01\u0e31\u0e19\u0e42\u0e14\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07"
        "\u0e27\u0e48\u0e32\u0e07 "
    ) * 2
    mixed = (
        "English, \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0647\u064a \u0644\u063a\u0629, "
        "\u05e2\u05d1\u05e8\u05d9\u05ea \u05e9\u05e4\u05d4, \u0440\u0443\u0441\u0441\u043a\u0438\u0439 "
        "\u044f\u0437\u044b\u043a, \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac, "
        "\u0540\u0561\u0575\u0565\u0580\u0565\u0576, \u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8, "
        "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd, \u09ac\u09be\u0982\u09b2\u09be mixedWith\u4e2d\u6587and\u65e5\u672c"
        "\u8a9e123\u0661\u0662\u0663 \u200fRTL\u200e mark\u00a0nbsp\u3000ideographic\u2009thin"
        "\u200bzero\u00adsoft\u0001ctl\u007fdel \u2028line\u2029para x\u2060y \ufeffbom "
        "\u00c5ngstr\u00f6m \u212b \u0130stanbul \u0049\u0307 stra\u00dfe \ufb06 \u1e9e. "
        "[CLS] [SEP] [MASK] [UNK] <s> </s> <unk> <|endoftext|> <mask> "
    ) * 2
    symbols = (
        "\u20ac" * 130 + " prices: $5, \u20ac6, \u00a37, \u00a58, \u20b9 9 \u2211\u222b\u221a\u2264"
        "\u2265\u2260\u00b1\u00d7\u00f7 \u250c\u2500\u2500\u2500\u2510\u2502 \u2502\u2514\u2500\u2500"
        "\u2500\u2518 " + "=" * 60 + " " + "-" * 40 + " " + "." * 30 + " !!!???***### ~~~^^^|||"
        + "\u00a9\u00ae\u2122\u00b0" * 30 + " \u2605\u2606\u2665\u2660 " + "+-" * 40 + " end. "
        # one character repeated: BPE merges such runs into the vocabulary's longest tokens
        + "=" * 200 + " " + "\U0001F600" * 100 + " " * 150 + "x" + "\n" * 60 + "-" * 130 + " "
    )
    return [
        ("english", english), ("code", code), ("cjk", cjk), ("emoji", emoji), ("runs", runs),
        ("combining", combining), ("mixed", mixed), ("symbols", symbols),
    ]


def probe_texts() -> list[tuple[str, str]]:
    """Each section after the tail of another and before the head of a third (two orders)."""
    sections = _sections()
    out = []
    for i, (name, text) in enumerate(sections):
        before = sections[i - 1][1][-CONTEXT_CHARS:]
        after = sections[(i + 1) % len(sections)][1][:CONTEXT_CHARS]
        out.append((name, before + "\n" + text + "\n" + after))
    return out


def spellable_runs(
    tokenizer: Tokenizer, texts: Sequence[str], unknown_ids: Sequence[int] = ()
) -> list[tuple[str, str]]:
    """Per cut class, long unbroken runs of characters of that class the tokenizer can spell.

    A run spelt in word pieces is where a cut inside one pre-token shows (a WordPiece word over 100
    characters is one [UNK], a prefix of it is not), and fixed texts cannot know which characters a
    vocabulary spells. Candidates are the class's characters in the probe texts and the vocabulary;
    a character counts as spellable when four of it in a row stay one word with no unknown token.
    """
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    candidates: dict[CutClass, set[str]] = {}
    for ch in set("".join(vocab)) | set("".join(texts)):
        cls = boundary_class(ch)
        if cls is not None and cls is not CutClass.WHITESPACE:
            candidates.setdefault(cls, set()).add(ch)
    unknown = set(unknown_ids)
    out = []
    for cls in BOUNDARY_CLASSES:
        chars = sorted(candidates.get(cls, ()))[:SPELL_CANDIDATES]
        if not chars:
            continue
        encs = tokenizer.encode_batch([ch * 4 for ch in chars], add_special_tokens=False)
        spelt = [ch for ch, e in zip(chars, encs) if len(set(e.word_ids)) == 1 and not unknown & set(e.ids)]
        spelt = spelt[:: max(1, len(spelt) // RUN_DISTINCT_CHARS)][:RUN_DISTINCT_CHARS]
        if len(spelt) >= 2:
            run = "".join(spelt)
            forward, backward = (run * 240)[:240], (run[::-1] * 240)[:240]
            out.append((f"spelt {cls.value}", f"words before {forward} and {backward} after."))
    return out


@dataclass(frozen=True)
class ProbeReport:
    """Which cut classes a tokenizer passed, and the characters-per-token bound it keeps."""

    classes: dict[str, str]  # class -> "pass" | "fail: ..." | "disabled: ..." | "untested"
    enabled: frozenset[CutClass]
    chars_per_token: int | None
    cuts_checked: int
    seconds: float
    notes: tuple[str, ...] = field(default=())


@dataclass
class _Whole:
    name: str
    text: str
    ids: list[int]
    offsets: np.ndarray
    classes: list[CutClass | None]  # boundary class of each character
    run_cuts: list[bool]  # a cut inside a run may go before this character
    picks: dict[CutClass, list[int]] = field(default_factory=dict)  # cut positions per class
    prefixes: dict[int, tuple[list[int], np.ndarray]] = field(default_factory=dict)  # end -> tokens

    def tokenize(self, tokenizer: Tokenizer, ends: Sequence[int]) -> None:
        """Tokenize the prefixes not seen yet (each prefix once, whichever classes cut there)."""
        todo = sorted({e for e in ends if e not in self.prefixes})
        if todo:
            encs = tokenizer.encode_batch([self.text[:e] for e in todo], add_special_tokens=False)
            for e, enc in zip(todo, encs):
                self.prefixes[e] = (list(enc.ids), np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2))

    def exact(self, cut: Cut) -> bool:
        """Are the cut's exact tokens the whole text's first tokens (ids and offsets)?"""
        ids, offsets = self.prefixes[cut.end]
        over = np.nonzero(offsets[:, 1] > cut.keep)[0]
        n = int(over[0]) if len(over) else len(offsets)
        return ids[:n] == self.ids[:n] and np.array_equal(offsets[:n], self.offsets[:n])


def _sample(positions: list[int]) -> list[int]:
    if len(positions) <= SAMPLES_PER_TEXT:
        return positions
    step = len(positions) / SAMPLES_PER_TEXT
    return [positions[int(i * step + step / 2)] for i in range(SAMPLES_PER_TEXT)]


def _targeted(positions: list[int], offsets: Sequence[int]) -> list[int]:
    """Cuts at fixed distances into the longest stretches of consecutive positions, where a cut
    most likely falls inside what the tokenizer reads as one word (WordPiece's 100-character limit,
    a BPE merge across the run)."""
    runs: list[tuple[int, int]] = []
    for p in positions:
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    picks: list[int] = []
    for start, stop in sorted(runs, key=lambda r: r[0] - r[1])[:LONGEST_RUNS]:
        picks += [start + d for d in offsets if start + d < stop]
    return picks


def _pick(whole: _Whole, cls: CutClass, lookback: int) -> list[int]:
    """Cut positions of one class in one text: spread evenly, plus deep inside its longest runs."""
    at = whole.classes
    if cls is CutClass.RUN:
        inside = [p for p in range(RUN_MARGIN + 1, len(at)) if whole.run_cuts[p] and at[p - 1] is None]
        return sorted(set(_sample(inside)) | set(_targeted(inside, (0, 101, 777))))
    positions = [p for p in range(lookback + 1, len(at)) if at[p] is cls]
    depths = (1, lookback + 1, 50, 160)  # 50: inside WordPiece's 100-character word limit
    return sorted(set(_sample(positions)) | set(_targeted(positions, depths)))


def _check(tokenizer: Tokenizer, wholes: list[_Whole], classes: frozenset[CutClass], lookback: int
           ) -> tuple[bool, int, str]:
    """Cut every text at the picked positions of ``classes``, with the keep limits of all of them."""
    cutter = Cutter(classes, lookback)
    checked = 0
    for whole in wholes:
        positions = [(cls, p) for cls in sorted(classes) for p in whole.picks[cls]]
        whole.tokenize(tokenizer, [p for _, p in positions])
        for cls, p in positions:
            cut = Cut(p, p - RUN_MARGIN) if cls is CutClass.RUN else Cut(p, cutter.keep_limit(whole.text, p))
            checked += 1
            if not whole.exact(cut):
                return False, checked, f"{whole.name} cut at {p} ({cls.value})"
    return True, checked, ""


def probe_cuts(
    tokenizer: Tokenizer,
    traits: TokenizerTraits,
    lookback: int,
    texts: Callable[[], list[tuple[str, str]]] | None = None,
) -> ProbeReport:
    """Probe every cut class on ``tokenizer`` and enable the ones that keep tokens exact.

    ``texts`` replaces the probe texts (the fixed ones plus the vocabulary runs)."""
    started = time.perf_counter()
    if texts is None:
        fixed = probe_texts()
        texts = lambda: fixed + spellable_runs(tokenizer, [t for _, t in fixed], traits.unknown_ids)  # noqa: E731
    candidates = list(BOUNDARY_CLASSES) + ([] if traits.folds else [CutClass.RUN])
    wholes = []
    for name, text in texts():
        enc = tokenizer.encode(text, add_special_tokens=False)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        whole = _Whole(
            name, text, list(enc.ids), offsets, [boundary_class(ch) for ch in text], [is_run_cut(ch) for ch in text]
        )
        whole.picks = {cls: _pick(whole, cls, lookback) for cls in candidates}
        wholes.append(whole)
    results: dict[str, str] = {}
    if traits.folds:
        results[CutClass.RUN.value] = "disabled: " + "; ".join(traits.reasons)
    passed: list[CutClass] = []
    checked = 0
    for cls in candidates:
        ok, n, where = _check(tokenizer, wholes, frozenset({cls}), lookback)
        checked += n
        if n == 0:
            results[cls.value] = "untested"
        elif ok:
            results[cls.value] = "pass"
            passed.append(cls)
        else:
            results[cls.value] = f"fail: {where}"
    notes: list[str] = []
    enabled: set[CutClass] = set(passed)
    ok, n, where = _check(tokenizer, wholes, frozenset(enabled), lookback) if enabled else (True, 0, "")
    checked += n
    if not ok:
        # classes that pass alone but not together: add them one at a time in a fixed order
        notes.append(f"the passing classes fail together ({where}); kept those that pass jointly")
        enabled = set()
        for cls in passed:
            ok, n, _ = _check(tokenizer, wholes, frozenset(enabled | {cls}), lookback)
            checked += n
            if ok:
                enabled.add(cls)
            else:
                results[cls.value] = "fail: with the other classes"
    bound = traits.chars_per_token
    if bound is not None:
        for whole in wholes:
            if len(whole.ids) * bound < len(whole.text):
                notes.append(f"{whole.name}: fewer tokens than the characters-per-token bound allows")
                bound = None
                break
    return ProbeReport(
        classes=results,
        enabled=frozenset(enabled),
        chars_per_token=bound,
        cuts_checked=checked,
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
    )
