"""Where a model comes from: a local Hugging Face directory or a hub id, what it declares, and its
tokenizer as a package holds it.

Nothing from the source directory is imported or executed (a sentence-transformers directory's
declarations: converters/sentence_transformers.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from converters.errors import ConversionError, first_line
from converters.progress import log
from edge_runtime.packages.manifest import compute_digest, file_sha256

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*(/[A-Za-z0-9][A-Za-z0-9_.\-]*)?$")
_STAMPED = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
            "modules.json", "sentence_bert_config.json", "1_Pooling/config.json")
_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: what an export reads from a hub repository (not its ONNX, TF or Flax copies)
_HUB_PATTERNS = ["*.json", "*.txt", "*.safetensors", "pytorch_model.bin", "*.model", "README.md", "LICENSE*",
                 "NOTICE*"]


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_hub_id(src: str) -> bool:
    """Whether ``src`` names a hub repository rather than a local directory."""
    return not Path(src).expanduser().exists() and bool(_HUB_ID.match(src)) and not src.startswith(".")


def resolve_source(src: str) -> Path:
    """A local model directory for ``src``: the directory itself, or a hub snapshot when online.

    Raises ConversionError with a one-line message for a missing path or an unreachable hub id.
    """
    path = Path(src).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ConversionError(f"{src}: not a directory (SRC must be a Hugging Face model directory or hub id)")
    if not _HUB_ID.match(src) or src.startswith("."):
        raise ConversionError(f"{src}: no such directory")
    if _offline():
        raise ConversionError(f"{src}: no such directory, and the hub is not reachable (HF_HUB_OFFLINE is set)")
    try:
        from huggingface_hub import snapshot_download  # only needed for hub ids
        log(f"downloading {src} from the Hugging Face hub")
        return Path(snapshot_download(repo_id=src, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # noqa: BLE001 - network, auth and missing-repo errors all end the same way
        raise ConversionError(f"{src}: no such directory, and the hub download failed: {first_line(e)}") from None


def source_stamp(src: Path, model_dir: Path, extra: Mapping[str, Path] | None = None) -> str:
    """A sha256 over the source's weights and configuration files, to tell whether a package is current;
    ``extra`` names further files it is made from (a Dense module's weights, an adapter's base)."""
    files: dict[str, str] = {name: file_sha256(p) for name, p in (extra or {}).items()}
    for base in {src, model_dir}:
        for rel in _STAMPED + _WEIGHTS:
            p = base / rel
            if p.is_file():
                files[f"{base.relative_to(src) if base != src else '.'}/{rel}"] = file_sha256(p)
    if not any(name.endswith(_WEIGHTS) for name in files):
        raise ConversionError(f"{model_dir}: no model.safetensors or pytorch_model.bin")
    return compute_digest(files)


def package_tokenizer(model_dir: Path) -> Any:
    """The source tokenizer as a `tokenizers.Tokenizer`, with padding and truncation removed.

    The server pads and truncates itself; a baked-in Fixed padding (MiniLM's 128) would pad
    every row and cost several times the compute.
    """
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    else:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
        except Exception as e:  # noqa: BLE001
            raise ConversionError(
                f"{model_dir}: no tokenizer.json and no loadable tokenizer: {first_line(e)}"
            ) from None
        if not hf.is_fast:
            raise ConversionError(f"{model_dir}: only a slow tokenizer is available; a tokenizer.json is needed")
        tok = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    tok.no_padding()
    tok.no_truncation()
    return tok


def check_tokenizer(model_dir: Path, tok: Any, items: Sequence[Any]) -> None:
    """The package tokenizer must give transformers' ids on the samples (normaliser settings included)."""
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(model_dir, use_fast=True)
    except Exception as e:  # noqa: BLE001
        log(f"tokenizer parity skipped: transformers cannot load the tokenizer ({first_line(e)})")
        return
    for i, item in enumerate(items):
        pair = isinstance(item, tuple)
        ref = hf(item[0], item[1]) if pair else hf(item)
        got = tok.encode(item[0], item[1]) if pair else tok.encode(item)
        if list(ref["input_ids"]) != got.ids:
            raise ConversionError(f"tokenizer.json disagrees with transformers' tokenizer on sample {i}")
