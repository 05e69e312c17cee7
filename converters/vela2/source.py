"""Vela 2.0 encoder packages in the upstream format: read and verify one, or write a tiny one.

Upstream layout (docs/reference/upstream-formats.md §2.1, §2.11): ``config.json`` (model_type
``vela2-unified``, format_version 1, the ModernBERT ``encoder_config``, the marker ids, limits),
``calibration.json``, ``tokenizer.json`` (with the 8 markers as added tokens), ``model.safetensors``
(backbone under ``encoder.``, marker head at top level) and optionally ``SHA256SUMS``. A bundled
``vela2_inference.py`` is never read, let alone run.

The fixture writer builds exactly that format with random weights (hidden 64, 4 layers, global
attention every 3rd layer, local window 8, YaRN x4; Linear weights rounded to bf16 as released
checkpoints store them), so tests convert it the way a user converts a real package.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError
from edge_runtime.families.vela2.answers import check_calibration
from edge_runtime.families.vela2.layout import LayoutConfig
from edge_runtime.families.vela2.marker import READOUTS, head_tensor_names
from edge_runtime.packages.manifest import file_sha256

MODEL_TYPE = "vela2-unified"
DECODER_TYPE = "vela2-decoder"
LOADED_FILES = ("config.json", "calibration.json", "tokenizer.json", "model.safetensors")
ENCODER_PREFIX = "encoder."


@dataclass
class Vela2Source:
    """A read and verified upstream Vela 2.0 encoder package."""

    path: Path
    config: dict[str, Any]
    calibration: dict[str, Any]
    tokenizer_json: dict[str, Any]
    weights_file: Path
    sha256: dict[str, str]

    @property
    def identity(self) -> str:
        """Upstream identity: sha256 of the canonical JSON of {"model.safetensors": sha256}."""
        doc = json.dumps({"model.safetensors": self.sha256["model.safetensors"]}, sort_keys=True,
                         separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(doc.encode("utf-8")).hexdigest()


def _json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path.name}: not readable JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ConversionError(f"{path.name}: must hold a JSON object")
    return obj


def detect(src: Path) -> str | None:
    """``"vela2"`` when ``src/config.json`` is a Vela 2.0 encoder package, else None."""
    path = Path(src) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(cfg, dict) and cfg.get("format_version") == 1 and cfg.get("model_type") == MODEL_TYPE:
        return "vela2"
    return None


def _check_sums(src: Path) -> dict[str, str]:
    """sha256 of every loaded file; each one SHA256SUMS lists must match it."""
    sums: dict[str, str] = {}
    listed = src / "SHA256SUMS"
    if listed.is_file():
        for n, line in enumerate(listed.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            digest, _, name = line.strip().partition("  ")
            name = name.lstrip("*").strip()
            if len(digest) != 64 or not name:
                raise ConversionError(f"SHA256SUMS line {n}: expected '<sha256>  <file>'")
            sums[name] = digest.lower()
    out = {}
    for name in LOADED_FILES:
        path = src / name
        if not path.is_file():
            raise ConversionError(f"{src}: {name} is missing "
                                  f"(a Vela 2.0 encoder package holds {', '.join(LOADED_FILES)})")
        out[name] = file_sha256(path)
        if name in sums and sums[name] != out[name]:
            raise ConversionError(f"{name}: sha256 differs from SHA256SUMS (file altered)")
    return out


def read_source(src: Path) -> Vela2Source:
    """Read and verify ``src``; ConversionError (one line) for anything a converter must not accept."""
    src = Path(src)
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ConversionError(f"{src}: no config.json")
    config = _json(cfg_path)
    if config.get("model_type") == DECODER_TYPE:
        raise ConversionError("vela2-decoder packages (4B/9B) are not supported; only the 0.3B encoder "
                              "(model_type vela2-unified) converts")
    if config.get("model_type") != MODEL_TYPE or config.get("format_version") != 1:
        raise ConversionError(f"config.json: model_type {MODEL_TYPE!r} with format_version 1 expected")
    sha = _check_sums(src)
    try:
        LayoutConfig.from_config(config)
    except (KeyError, TypeError, ValueError) as e:
        raise ConversionError(f"config.json: {e}") from None
    enc = config.get("encoder_config")
    if not isinstance(enc, dict) or enc.get("model_type", "modernbert") != "modernbert":
        raise ConversionError("config.json: encoder_config must be a ModernBERT config")
    if config.get("readout") not in READOUTS:
        raise ConversionError(f"config.json: readout must be one of {READOUTS}")
    if not isinstance(config.get("proj_dim"), int) or config["proj_dim"] < 1:
        raise ConversionError("config.json: proj_dim must be a positive integer")
    if int(config["max_length"]) > int(enc.get("max_position_embeddings", 8192)):
        raise ConversionError("config.json: max_length exceeds the encoder's max_position_embeddings")
    calibration = _json(src / "calibration.json")
    try:
        check_calibration(calibration)
    except ValueError as e:
        raise ConversionError(f"calibration.json: {e}") from None
    tokenizer_json = _json(src / "tokenizer.json")
    added = {t.get("content"): t.get("id") for t in tokenizer_json.get("added_tokens") or []}
    for marker, mid in config["marker_ids"].items():
        if marker in added and added[marker] != mid:
            raise ConversionError(f"tokenizer.json gives {marker} id {added[marker]}, config.json {mid}")
    return Vela2Source(src, config, calibration, tokenizer_json, src / "model.safetensors", sha)


def load_tensors(source: Vela2Source) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(backbone state dict as float32 torch tensors without the prefix, head tensors as float32 numpy).

    The head must hold exactly the tensors of the config's readout mode, and nothing else may sit
    at top level.
    """
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(source.weights_file))
    except Exception as e:  # noqa: BLE001 - a corrupt file raises several types
        raise ConversionError(f"model.safetensors: unreadable ({e})") from None
    backbone = {k[len(ENCODER_PREFIX):]: v.float() for k, v in tensors.items() if k.startswith(ENCODER_PREFIX)}
    head = {k: v.float().numpy() for k, v in tensors.items() if not k.startswith(ENCODER_PREFIX)}
    want = head_tensor_names(source.config["readout"])
    if set(head) != want:
        raise ConversionError(f"model.safetensors: head tensors {sorted(set(head) ^ want)} do not match "
                              f"readout {source.config['readout']!r}")
    hidden = int(source.config["encoder_config"]["hidden_size"])
    if head["w_o.weight"].shape != (source.config["proj_dim"], hidden):
        raise ConversionError(f"model.safetensors: w_o.weight is {head['w_o.weight'].shape}, "
                              f"config says [{source.config['proj_dim']}, {hidden}]")
    return backbone, head
