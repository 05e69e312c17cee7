"""The Decision 3.0 tokenizer, built as the released runtime builds it (upstream-formats.md §3.5).

The runtime loads the package's ``tokenizer.json`` the way Transformers 5.17 builds ``Qwen2Tokenizer``: the
pre-tokenizer is replaced by the Qwen2 split regex followed by a regex-free byte-level step, and every entry of
``tokenizer_config.json``'s ``added_tokens_decoder`` that the file lacks is added as a special token at its
declared ID. The result is saved as the converted package's ``tokenizer.json`` so that the server loads exactly
this tokenizer with ``Tokenizer.from_file``. The chat template is never executed: only its SHA-256 is checked
against the templates whose rendering the prompt format (§3.6) reproduces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.decision3.source import read_json, sha256_file
from converters.errors import ConversionError

#: Transformers 5.17 ``Qwen2Tokenizer.PRETOKENIZE_REGEX``
QWEN2_PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                     r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOKENIZER_CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
#: SHA-256 of the chat templates whose rendering of a system turn, a user turn (images then text) and the
#: thinking-off generation prompt is the d3 prompt format (the released runtime's list)
KNOWN_CHAT_TEMPLATES = frozenset({
    "273d8e0e683b885071fb17e08d71e5f2a5ddfb5309756181681de4f5a1822d80",
    "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
    "c3cf9e34abf4f9e36c2d72165aa9c132d3e2a725b6c2586aaa3a8af9d7a81041",
})
#: chat markup the prompt renders literally; each must be one added token
MARKUP_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
OPTIONAL_MARKUP = ("<|video_pad|>",)


@dataclass(frozen=True)
class BuiltTokenizer:
    """The constructed tokenizer and the IDs the prompt and batching need."""

    tokenizer: Any  # tokenizers.Tokenizer
    pad_id: int
    special_ids: dict[str, int]

    def to_json(self) -> bytes:
        """The tokenizer as the converted package's tokenizer.json (``Tokenizer.from_file`` reads it back)."""
        return (self.tokenizer.to_str(pretty=True) + "\n").encode("utf-8")


def check_chat_template(root: Path) -> str:
    """The package's chat_template.jinja must be one the d3 prompt renders; returns its SHA-256."""
    path = Path(root) / "chat_template.jinja"
    if not path.is_file():
        raise ConversionError("the Decision 3.0 package has no chat_template.jinja")
    digest = sha256_file(path)
    if digest not in KNOWN_CHAT_TEMPLATES:
        raise ConversionError(f"chat_template.jinja (sha256 {digest[:12]}…) is not a chat template whose rendering "
                              "the d3 prompt reproduces")
    return digest


def _flag(entry: dict[str, Any], key: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise ConversionError(f"tokenizer_config.json: added_tokens_decoder {entry.get('content')!r} has a "
                              f"non-boolean {key}")
    return value


def build_tokenizer(root: Path) -> BuiltTokenizer:
    """The package tokenizer as the released runtime builds it, with its pad ID and the chat-markup IDs."""
    from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers

    root = Path(root)
    config = read_json(root / "tokenizer_config.json")
    if not isinstance(config, dict):
        raise ConversionError("tokenizer_config.json must be an object")
    if config.get("tokenizer_class") not in TOKENIZER_CLASSES:
        raise ConversionError(f"tokenizer_config.json: tokenizer_class {config.get('tokenizer_class')!r} is not "
                              f"{' or '.join(TOKENIZER_CLASSES)}")
    for key in ("add_prefix_space", "add_bos_token"):
        if config.get(key) not in (None, False):
            raise ConversionError(f"tokenizer_config.json: {key} must be absent or false")
    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions for bad files
        raise ConversionError(f"tokenizer.json: not a tokenizers file ({str(e).splitlines()[0][:200]})") from None
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, dict):
        raise ConversionError("tokenizer_config.json: added_tokens_decoder must be an object")
    present = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    try:
        order = sorted(decoder, key=int)
    except ValueError:
        raise ConversionError("tokenizer_config.json: added_tokens_decoder keys must be token IDs") from None
    for key in order:
        entry = decoder[key]
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str) or not entry["content"]:
            raise ConversionError(f"tokenizer_config.json: added_tokens_decoder[{key}] needs a content string")
        if entry["content"] in present:
            continue
        tokenizer.add_special_tokens([AddedToken(
            entry["content"], single_word=_flag(entry, "single_word"), lstrip=_flag(entry, "lstrip"),
            rstrip=_flag(entry, "rstrip"), normalized=_flag(entry, "normalized"), special=True)])
        if tokenizer.token_to_id(entry["content"]) != int(key):
            raise ConversionError(f"tokenizer_config.json: special token {entry['content']!r} gets ID "
                                  f"{tokenizer.token_to_id(entry['content'])}, not its declared {key}")
    pad = config.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    pad_id = tokenizer.token_to_id(pad) if isinstance(pad, str) else None
    if pad_id is None:
        raise ConversionError("tokenizer_config.json: pad_token must name a token of the tokenizer")
    special: dict[str, int] = {}
    added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
    for token in (*MARKUP_TOKENS, *OPTIONAL_MARKUP):
        if token in added:
            special[token] = added[token]
        elif token in MARKUP_TOKENS:
            raise ConversionError(f"the tokenizer has no added token {token!r}, which the d3 prompt uses")
    return BuiltTokenizer(tokenizer, int(pad_id), special)


def check_codes(tokenizer: Any, codes: Sequence[str], token_ids: Sequence[int]) -> None:
    """Each answer code must encode alone (no special tokens) to exactly its readout row's token."""
    for i, (code, token) in enumerate(zip(codes, token_ids, strict=True)):
        ids = tokenizer.encode(code, add_special_tokens=False).ids
        if ids != [token]:
            raise ConversionError(f"decision_config.json: code {i} ({code!r}) encodes to {ids}, not [{token}]")


def check_config_tokens(built: BuiltTokenizer, config: dict[str, Any], vision: bool) -> None:
    """config.json's vision token IDs must be the tokenizer's (the image rows are scattered at them)."""
    pairs = [("image_token_id", "<|image_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
             ("vision_end_token_id", "<|vision_end|>")]
    if "<|video_pad|>" in built.special_ids:
        pairs.append(("video_token_id", "<|video_pad|>"))
    for key, token in pairs:
        if key in config and config[key] != built.special_ids[token]:
            raise ConversionError(f"config.json: {key} is {config[key]}, the tokenizer's {token} is "
                                  f"{built.special_ids[token]}")
        if vision and key == "image_token_id" and key not in config:
            raise ConversionError("config.json: a package with a vision tower needs image_token_id")


_SCRIPTS = ("naïve café résumé Ångström façade", "Ελληνικά γράμματα", "Кириллица и пробелы", "العربية مع أرقام ١٢٣",
            "עברית", "हिन्दी देवनागरी क्षत्रिय", "ภาษาไทยไม่มีช่องว่าง", "中文字符和标点。", "日本語のひらがなカタカナ",
            "한국어 문장", "Tiếng Việt có dấu", "ﬁ ﬂ ﬀ ligatures",
            "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "e\u0301 a\u0308 o\u0302 (NFD)",
            "Z\u0351\u036b\u0343a\u0310\u0357l\u0363g\u0365o", "ⅫⅣ ①② ½¾ ²³", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛")
_EMOJI = ("😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "🏳️‍🌈", "❤️", "🤖", "🧑🏿‍🚀", "#️⃣", "©®™")
_CONTROL = ("\x00", "\x01", "\x07", "\x08", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f", "\x85", "\u200b", "\u200c",
            "\u200d", "\u200e", "\u2028", "\u2029", "\ufeff", "\ufffd", "\u00ad", "\u2060")
_SPACES = (" ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "   \t\n ")
_LOOKALIKES = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
               "<|video_pad|>", "<|audio_pad|>", "<think>", "</think>", "<|im_start|", "|im_end|>", "< |im_end|>",
               "<|IM_START|>", "<|im_start|>>", "<<|im_end|>", "<think >", "</ think>", "<|image_pad|><|image_pad|>",
               "<|vision_", "<think></think>", "<|im_end|>\n<|im_start|>assistant\n")
_WORDS = ("State:", "Question:", "Options:", "Reply", "with", "only", "the", "code", "of", "best", "option.", "A:",
          "ZZ", "AA:", "IU", "I'm", "you'LL", "it's", "WE'RE", "they've", "she'd", "hello", "world", "don't", "O'Neil",
          "null", "true", "false", "{\"k\": [1, 2]}", "https://example.com/a?b=c&d=e", "foo_bar-baz", "x=1;y=2",
          "3.14159", "1,000,000", "2024-01-01T00:00:00Z", "$$$", "...", "!!!???", "\\n", "''", "``", "—", "–", "…")


def probe_texts(count: int, seed: int = 0) -> list[str]:
    """``count`` adversarial texts for tokenizer parity, the same for the same seed: mixed scripts, emoji
    sequences, control and format characters, every kind of whitespace, long runs, contractions, and look-alikes
    of the added tokens, glued together in random order with and without separators; all distinct."""
    import random

    rng = random.Random(seed)
    pools = (_SCRIPTS, _EMOJI, _CONTROL, _SPACES, _LOOKALIKES, _WORDS)

    def run() -> str:
        unit = rng.choice(("a", " ", "\n", "1", "!", "é", "中", "😀", "'s", "<|", "ab ", "\t ", "-"))
        return unit * rng.choice((17, 64, 255, 600))

    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        if len(out) % 50 == 0:
            text = run()
            if text not in seen:
                seen.add(text)
                out.append(text)
                continue
        parts = []
        for _ in range(rng.randint(1, 12)):
            pick = rng.random()
            if pick < 0.05:
                parts.append(run())
            elif pick < 0.12:
                parts.append("".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 8))))
            else:
                text = rng.choice(rng.choice(pools))
                if rng.random() < 0.3:  # a random slice: cut through graphemes, markup and words
                    a = rng.randint(0, len(text))
                    text = text[a:a + rng.randint(1, 12)]
                parts.append(text)
        text = rng.choice(("", "", " ", "\n")).join(parts)
        if text not in seen:  # distinct texts: each one is a probe of its own
            seen.add(text)
            out.append(text)
    return out


def reference_tokenize(python: Path, package: Path, texts: Sequence[str], timeout: float = 300) -> dict[str, Any]:
    """Encode ``texts`` with Transformers 5's Qwen2Tokenizer of ``package`` in the reference environment
    (``python`` is its interpreter); returns reference_tokenizer's output."""
    import json
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run([str(python), "-m", "converters.decision3.reference_tokenizer", str(package)],
                              input=json.dumps(texts), capture_output=True, text=True, cwd=repo, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConversionError(f"the reference tokenizer did not run ({e})") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConversionError(f"the reference tokenizer failed: {tail[:300]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def tokenizer_mismatches(tokenizer: Any, texts: Sequence[str], reference: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the texts whose IDs differ between ``tokenizer`` and the reference's."""
    ours = [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]
    return [i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if list(a) != list(b)]
