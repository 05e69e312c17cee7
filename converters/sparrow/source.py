"""Reading the sparrow-decider wheel's bundled nano-general model as data (a zip of config.json, a
WordPiece vocabulary and int8 weights): nothing in it is executed."""

from __future__ import annotations

import io
import json
import zipfile
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

SOURCE_MODEL = "sparrow-nano-general-v1.1"


SOURCE_DIST = "sparrow-decider"


# The MIT licence of the weights sparrow-nano is fine-tuned from; the copyright line is the one
# sparrow-decider's NOTICE gives for potion-base-8M / Model2Vec.
_MIT_POTION = """MIT License

Copyright (c) 2024 Thomas van Dongen

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def source_file() -> Path:
    path = resources.files("sparrow_decider").joinpath("models", f"{SOURCE_MODEL}.sparrow")
    return Path(str(path))


def read_source(path: Path) -> tuple[dict[str, Any], dict[str, int], dict[str, np.ndarray]]:
    with zipfile.ZipFile(path) as zf:
        cfg = json.loads(zf.read("config.json"))
        vocab = json.loads(zf.read("tokenizer.json"))["vocab"]
        with np.load(io.BytesIO(zf.read("model.npz")), allow_pickle=False) as z:
            weights = {k: z[k] for k in z.files}
    if cfg.get("arch") != "static" or cfg.get("kv"):
        raise ValueError(
            f"{path.name}: only the kv-free static tier converts (arch={cfg.get('arch')}, kv={cfg.get('kv')})"
        )
    return cfg, vocab, weights


def dequant(weights: dict[str, np.ndarray], name: str) -> np.ndarray:
    # Same float32 operations as sparrow_decider._dequant, so the weights are bit-identical.
    f = weights[f"{name}.q8"].astype(np.float32)
    f *= weights[f"{name}.scale"][:, None]
    return f


def build_tokenizer(vocab: dict[str, int]) -> Any:
    """BERT-uncased WordPiece as the package's pure-Python one: no specials, no truncation."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def licenses() -> dict[str, bytes]:
    dist = metadata.distribution(SOURCE_DIST)
    out = {}
    for name in ("LICENSE", "NOTICE"):
        f = next((p for p in dist.files or () if p.name == name and "licenses" in p.parts), None)
        if f is None:
            raise FileNotFoundError(f"{SOURCE_DIST} ships no {name}; its notices must travel with the weights")
        out[f"LICENSES/sparrow-decider-{name}"] = Path(str(f.locate())).read_bytes()
    out["LICENSES/potion-base-8M-MIT"] = _MIT_POTION.encode("utf-8")
    out["LICENSES/README"] = (
        f"Weights and vocabulary of {SOURCE_MODEL} from {SOURCE_DIST} {dist.version}.\n"
        "Code: Apache-2.0 (sparrow-decider-LICENSE), with its NOTICE (sparrow-decider-NOTICE).\n"
        "The sparrow-nano weights are fine-tuned from potion-base-8M (Model2Vec, MinishLab), whose\n"
        "MIT licence applies to them (potion-base-8M-MIT): https://github.com/MinishLab/model2vec\n"
    ).encode()
    return out


def release_date(src: Path) -> str:
    """The model file's own build date (its zip members' timestamp)."""
    with zipfile.ZipFile(src) as zf:
        y, m, d = zf.getinfo("model.npz").date_time[:3]
    return f"{y:04d}-{m:02d}-{d:02d}"
