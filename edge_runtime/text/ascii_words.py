"""The ids of short ASCII texts for BERT WordPiece tokenizers, a word at a time from a cache.

On printable ASCII (and tab, newline, carriage return) a BERT tokenizer's pipeline is simple
enough to write down exactly:

- ``BertNormalizer``: ``clean_text`` turns the three white-space controls into spaces and removes
  no printable character; ``lowercase`` is ``str.lower``; accents and CJK spacing leave ASCII as it
  is.
- ``BertPreTokenizer``: words are the maximal runs of letters and digits, every ASCII punctuation
  character is a word of its own, and white space only separates.
- ``WordPiece`` reads each word alone, so a word's ids never depend on its neighbours.

So the ids of such a text are the concatenated ids of its words, and a word's ids (with their
offsets in the word, which the word's start in the text shifts) come from the tokenizer's own model
(``tokenizer.model.tokenize``), cached: the Router's states repeat their
vocabulary, and a hit costs a dictionary lookup where the whole pipeline costs ~2 us a token
(normalizing with alignments). Texts that hold anything else (other characters, an added token's
text) are left to the tokenizer. :meth:`AsciiWords.for_tokenizer` accepts only the exact pipeline
above, then checks itself against the tokenizer on a sample before it is used.
"""

from __future__ import annotations

import re

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

# Texts longer than this go to the tokenizer, which releases the GIL on them (text.bounds).
MAX_CHARS = 4096
MAX_CACHED_WORDS = 32768  # the cache is emptied when full: hot words come back at once
MAX_CACHED_WORD_CHARS = 48  # longer words are rare and would only crowd the cache

# Anything but printable ASCII and the white space clean_text maps to a space.
_OTHER = re.compile(r"[^\t\n\r\x20-\x7e]")
_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")

#: A word's WordPiece tokens: their ids, and their offsets within the word flattened (start, end, ...).
Pieces = tuple[tuple[int, ...], tuple[int, ...]]

# Texts the pipeline is checked on at construction: every printable character, long and unknown
# words, white space of each kind, digits against letters.
_SAMPLE = (
    "".join(chr(c) for c in range(0x20, 0x7F)),
    "Hello, World! It's 3:45pm -- e-mail me at a.b@c.com (or don't).\tTabs\nand\r\nnewlines.",
    "UNAFFABLE unaffable Unaffable x" + "y" * 120 + " z " + "q" * 101 + " " + "w" * 99,
    "   leading and trailing   ",
    "a1b2c3 123456789 3.14159 $100,000 #hashtag @user [brackets] {braces} <angle> ~tilde `tick`",
    "",
)


def _is_bert_wordpiece(tokenizer: Tokenizer) -> bool:
    # Read from the pipeline's objects, not its JSON: serializing a large BPE vocabulary to find out
    # it is not BERT's would cost every such model's loading ~0.1 s.
    normalizer = tokenizer.normalizer
    return (
        isinstance(normalizer, normalizers.BertNormalizer)
        and normalizer.clean_text
        and isinstance(tokenizer.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
        and isinstance(tokenizer.model, models.WordPiece)
        and tokenizer.truncation is None
        and tokenizer.padding is None
    )


class AsciiWords:
    """Exact ``encode(text, add_special_tokens=False)`` ids and offsets for short ASCII texts, a word at a time."""

    def __init__(self, tokenizer: Tokenizer, lowercase: bool) -> None:
        self._tokenizer = tokenizer
        self._lowercase = lowercase
        # An added token's text anywhere in a text sends it to the tokenizer (it matches added
        # tokens before normalizing, and some after): compared both as written and lowercased.
        self._added = tuple({form for token in tokenizer.get_added_tokens_decoder().values()
                             for form in (token.content, token.content.lower())})
        self._words: dict[str, Pieces] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> AsciiWords | None:
        """The fast path for a BERT WordPiece tokenizer that agrees with it on the sample; else None."""
        if not _is_bert_wordpiece(tokenizer):
            return None
        words = cls(tokenizer, bool(tokenizer.normalizer.lowercase))
        for text in _SAMPLE:
            enc = tokenizer.encode(text, add_special_tokens=False)
            got = words.encode(text)
            if got is None or got[0] != enc.ids or got[1].tolist() != [list(o) for o in enc.offsets]:
                return None
        words._words.clear()
        return words

    def _readable(self, text: str) -> str | None:
        """The text as this path splits it (lowercased when the tokenizer lowercases), or None when
        the text is not one this path reads."""
        if len(text) > MAX_CHARS or not text.isascii() or _OTHER.search(text):
            return None
        lowered = text.lower()
        if self._added and any(form in text or form in lowered for form in self._added):
            return None
        return lowered if self._lowercase else text  # ASCII lowercasing keeps every character where it was

    def _pieces(self, word: str) -> Pieces:
        """A word's pieces from the tokenizer's model, cached (a hit is a dictionary lookup)."""
        pieces = self._words.get(word)
        if pieces is None:
            tokens = self._tokenizer.model.tokenize(word)
            pieces = (tuple(t.id for t in tokens), tuple(bound for t in tokens for bound in t.offsets))
            if len(word) <= MAX_CACHED_WORD_CHARS:
                if len(self._words) >= MAX_CACHED_WORDS:
                    self._words.clear()
                self._words[word] = pieces
        return pieces

    def ids(self, text: str) -> list[int] | None:
        """The text's ids (no specials), or None when the text is not one this path reads."""
        readable = self._readable(text)
        if readable is None:
            return None
        out: list[int] = []
        # findall, not finditer: no match objects where no offsets are wanted (half the time a word)
        for word in _WORDS.findall(readable):
            out += self._pieces(word)[0]
        return out

    def encode(self, text: str) -> tuple[list[int], np.ndarray] | None:
        """The text's ids and their character offsets (int64 [n, 2], end exclusive), as
        ``encode(text, add_special_tokens=False)`` gives them; None when the text is not one this path reads."""
        readable = self._readable(text)
        if readable is None:
            return None
        ids: list[int] = []
        bounds: list[int] = []
        for match in _WORDS.finditer(readable):
            word_ids, spans = self._pieces(match.group())
            ids += word_ids
            start = match.start()
            bounds += [start + b for b in spans]
        return ids, np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
