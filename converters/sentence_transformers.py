"""What a sentence-transformers directory declares about its embedding, read as data.

modules.json and each module's folder: the Transformer (where the Hugging Face model is), Pooling
(mean, CLS or last token), Dense projections after pooling (their weights from the module's
model.safetensors), Normalize; sentence_bert_config.json's ``max_seq_length``; and
config_sentence_transformers.json's ``prompts`` and ``default_prompt_name``. Nothing from the
directory is imported, executed or unpickled: a Dense module that keeps its weights only in a
pickle (pytorch_model.bin) is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError

MODULES_FILE = "modules.json"
PROMPTS_FILE = "config_sentence_transformers.json"
_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_DENSE = "sentence_transformers.models.Dense"
_NORMALIZE = "sentence_transformers.models.Normalize"
#: the Dense activations a numpy head reproduces: sentence-transformers' class path -> the card's name
DENSE_ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}
#: the request input types a prompt may be applied by (the contract's ``input_type`` values)
INPUT_TYPES = ("query", "document")
_POOLINGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last"}


@dataclass(frozen=True)
class DenseLayer:
    """One Dense module after pooling: ``activation(weight @ x + bias)``."""

    weight: np.ndarray  # [out, in], float32
    bias: np.ndarray | None  # [out], float32
    activation: str  # identity | tanh


@dataclass(frozen=True)
class SentenceTransformerInfo:
    """What a sentence-transformers directory declares about its embedding."""

    transformer_dir: Path
    pooling: str | None       # mean | cls | last
    normalize: bool
    max_seq_length: int | None
    dense: tuple[DenseLayer, ...] = ()
    #: every prompt it declares (name -> text prefix) and the one its own encode() uses by default
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    @property
    def input_prompts(self) -> dict[str, str]:
        """The prompts a request's ``input_type`` selects: the declared ``query`` and ``document``."""
        return {k: v for k, v in self.prompts.items() if k in INPUT_TYPES}

    @property
    def dimension(self) -> int | None:
        """The width of the vector after the Dense modules (None without any: the hidden size)."""
        return int(self.dense[-1].weight.shape[0]) if self.dense else None


def _read_json(path: Path) -> Any:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable JSON ({e})") from None
    if not isinstance(obj, (dict, list)):
        raise ConversionError(f"{path}: unexpected JSON")
    return obj


def _pooling_mode(cfg: dict, where: Path) -> str:
    chosen = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v]
    if len(chosen) != 1 or chosen[0] not in _POOLINGS:
        raise ConversionError(f"{where}: pooling {chosen or 'none'} is not supported (one of mean, CLS or last)")
    if cfg.get("include_prompt") is False:
        raise ConversionError(f"{where}: include_prompt=false is not supported")
    return _POOLINGS[chosen[0]]


def _dense(folder: Path) -> DenseLayer:
    cfg = _read_json(folder / "config.json")
    activation = DENSE_ACTIVATIONS.get(str(cfg.get("activation_function")))
    if activation is None:
        raise ConversionError(f"{folder}: Dense activation {cfg.get('activation_function')!r} is not supported "
                              f"(one of {', '.join(DENSE_ACTIVATIONS)})")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ConversionError(f"{folder}: no model.safetensors (a pickled pytorch_model.bin is never loaded)")
    from safetensors.numpy import load_file

    tensors = load_file(str(weights))
    weight, bias = tensors.get("linear.weight"), tensors.get("linear.bias")
    shape = (int(cfg.get("out_features", -1)), int(cfg.get("in_features", -1)))
    if weight is None or tuple(weight.shape) != shape or set(tensors) - {"linear.weight", "linear.bias"}:
        raise ConversionError(f"{folder}: expected linear.weight {list(shape)} (and linear.bias), found "
                              f"{ {k: list(v.shape) for k, v in tensors.items()} }")
    if bool(cfg.get("bias", True)) != (bias is not None):
        raise ConversionError(f"{folder}: config.json bias={cfg.get('bias')} but the weights "
                              f"{'have' if bias is not None else 'lack'} linear.bias")
    return DenseLayer(weight.astype(np.float32), None if bias is None else bias.astype(np.float32), activation)


def _prompts(src: Path) -> tuple[dict[str, str], str | None]:
    path = src / PROMPTS_FILE
    if not path.is_file():
        return {}, None
    cfg = _read_json(path)
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ConversionError(f"{path}: prompts must map names to strings")
    default = cfg.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ConversionError(f"{path}: default_prompt_name {default!r} names no prompt")
    return {str(k): v for k, v in prompts.items()}, default


def read_sentence_transformer(src: Path) -> SentenceTransformerInfo | None:
    """The sentence-transformers declaration of ``src`` (None when it has no modules.json).

    The modules must run Transformer, Pooling, any Dense, then Normalize last, as the numpy head
    reads them; anything else is refused, naming the module.
    """
    modules_path = src / MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise ConversionError(f"{modules_path}: expected a list of modules")
    transformer_dir, pooling, normalize = None, None, False
    dense: list[DenseLayer] = []
    for m in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind, folder = m.get("type", ""), src / m.get("path", "")
        if normalize:
            raise ConversionError(f"{modules_path}: module {kind!r} after Normalize is not supported")
        if kind == _TRANSFORMER:
            transformer_dir = folder.resolve()
        elif kind == _POOLING:
            pooling = _pooling_mode(_read_json(folder / "config.json"), folder / "config.json")
        elif kind == _DENSE and pooling is not None:
            dense.append(_dense(folder))
        elif kind == _NORMALIZE:
            normalize = True
        else:
            raise ConversionError(f"{modules_path}: module {kind!r} is not supported by this converter"
                                  + (" before Pooling" if kind == _DENSE else ""))
    if transformer_dir is None:
        raise ConversionError(f"{modules_path}: no {_TRANSFORMER} module")
    for a, b in zip(dense, dense[1:]):
        if a.weight.shape[0] != b.weight.shape[1]:
            raise ConversionError(f"{modules_path}: Dense widths do not chain ({a.weight.shape} then {b.weight.shape})")
    max_len = None
    for cfg_path in (src / "sentence_bert_config.json", transformer_dir / "sentence_bert_config.json"):
        if cfg_path.is_file():
            max_len = _read_json(cfg_path).get("max_seq_length")
            break
    prompts, default_prompt = _prompts(src)
    return SentenceTransformerInfo(transformer_dir, pooling, normalize, int(max_len) if max_len else None,
                                   tuple(dense), prompts, default_prompt)


def detect(src: Path) -> str | None:
    """``embedding`` for a sentence-transformers directory that pools (modules.json with a Pooling module)."""
    path = src / MODULES_FILE
    try:
        modules = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(modules, list) and any(isinstance(m, dict) and m.get("type") == _POOLING for m in modules):
        return "embedding"
    return None


__all__ = ["DENSE_ACTIVATIONS", "INPUT_TYPES", "DenseLayer", "SentenceTransformerInfo", "detect",
           "read_sentence_transformer"]
