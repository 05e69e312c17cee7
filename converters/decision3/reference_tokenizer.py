"""Transformers 5's own ``Qwen2Tokenizer`` over a Decision 3.0 package: the reference our tokenizer must match.

Run in the reference environment (.venv-ref: Transformers 5, tokenizers 0.23), never imported by the converter:

    .venv-ref/bin/python -m converters.decision3.reference_tokenizer PACKAGE < texts.json > ids.json

stdin is a JSON list of strings; stdout is ``{"transformers": version, "tokenizers": version, "pad_id": int,
"ids": [[int, ...], ...]}``, each text encoded whole with no special tokens added. The class is named
explicitly: the package's ``tokenizer_config.json`` names ``Qwen2Tokenizer``, which is what the released
runtime reproduces (AutoTokenizer would pick ``Qwen3_5Tokenizer`` from config.json's model type, whose
pre-tokenizer regex differs). Self-contained: imports only transformers, tokenizers and json.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    """Encode stdin's texts with Transformers' Qwen2Tokenizer of the package ``argv[0]``."""
    if len(argv) != 1:
        print("usage: python -m converters.decision3.reference_tokenizer PACKAGE < texts.json", file=sys.stderr)
        return 2
    import tokenizers
    import transformers
    from transformers import Qwen2Tokenizer

    texts = json.load(sys.stdin)
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        print("stdin must be a JSON list of strings", file=sys.stderr)
        return 2
    tokenizer = Qwen2Tokenizer.from_pretrained(argv[0])
    ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    json.dump({"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
               "pad_id": tokenizer.pad_token_id, "ids": ids}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
