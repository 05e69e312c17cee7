"""Decision 2.0 packages (``dev2-package/1``) in the upstream format: read and verify, or write a tiny one.

docs/reference/upstream-formats.md §1.1-§1.4 and §1.9. A package is a pointer ``config.json``, a
``MODEL_MANIFEST.json`` that lists every file with its sha256 (the exact inventory), a
``decision_config.json``, the ten-tensor ``decision_head.safetensors``, the tokenizer, and either a
full backbone (``backbone/``, profile ``qwen-full``) or a LoRA adapter (``adapter/``, profile
``qwen-adapter``) over a pinned base whose files the adapter's source fingerprint names. Bundled
Python is hashed, never imported.

Only the ``qwen3`` backbone converts here: the installed Transformers has no Qwen3.5 text model,
so ``qwen3_5_text`` packages are refused with that reason.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from edge_runtime.families.decision2.candidate import HEAD_TENSORS
from edge_runtime.packages.manifest import file_sha256

POINTER = {"decision_format": "vllm-sr-decision", "format_version": 2, "package_schema": "dev2-package/1"}
MANIFEST = "MODEL_MANIFEST.json"
MANIFEST_SCHEMA = "dev2-package-manifest/1"
PROFILES = ("qwen-full", "qwen-adapter")
KNOWN_PROFILES = ("kai-native", "qwen-full", "qwen-adapter", "encoder-marker")
PROMPT_VERSION = "decision2-segmented-options-global-query-v1"
ARCHITECTURES = {"qwen3-text-endpoints-global-query-shared-bilinear-mlp": "qwen3",
                 "qwen3.5-text-endpoints-global-query-shared-bilinear-mlp": "qwen3_5_text"}
LORA_FORMAT = "peft-lora/1"
MODEL_ROOT_FILES = {"decision_config.json", "decision_head.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                    "chat_template.jinja"}
MODEL_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".txt")
SCORE_BIAS_FORMAT = "dev2-score-bias-v1"
CALIBRATION_VERSION = "decision2-per-type-temperature/1"
TASK_TYPES = ("choice", "noul", "score")


def sha256_json(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{Path(path).name}: not readable JSON ({e})") from None


def detect(src: Path) -> str | None:
    """``"decision2"`` when ``src/config.json`` is a Decision 2.0 pointer."""
    path = Path(src) / "config.json"
    try:
        pointer = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(pointer, dict) and all(pointer.get(k) == v for k, v in POINTER.items()):
        return "decision2"
    return None


def inventory(root: Path) -> dict[str, str]:
    """Every file's sha256 except the ones the format leaves out (.gitattributes, HF cache, pyc)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            raise ConversionError(f"{rel}: links are not allowed in a Decision 2.0 package")
        if not p.is_file() or rel == ".gitattributes" or rel.startswith(".cache/huggingface/") \
                or (p.suffix == ".pyc" and "__pycache__" in p.parts):
            continue
        out[rel] = file_sha256(p)
    return out


def checkpoint_files(root: Path) -> dict[str, str]:
    """The model-input files the identity covers: root model files, and model files under backbone/, adapter/."""
    files = {p for p in root.iterdir() if p.is_file() and p.name in MODEL_ROOT_FILES}
    for folder in ("backbone", "adapter"):
        if (root / folder).is_dir():
            files |= {p for p in (root / folder).rglob("*") if p.is_file() and p.suffix in MODEL_SUFFIXES}
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in sorted(files)}


def source_files(base: Path) -> dict[str, str]:
    """A pinned base's fingerprint: its root model files (and a backbone/ subtree)."""
    cands = list(base.iterdir()) + (list((base / "backbone").rglob("*")) if (base / "backbone").is_dir() else [])
    files = [p for p in cands if p.is_file() and p.suffix in MODEL_SUFFIXES
             and p.name not in {"trainer_state.pt", "checkpoint.json"}]
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise ConversionError(f"{base}: the pinned base holds no weight files")
    return {p.relative_to(base).as_posix(): file_sha256(p) for p in sorted(files)}


def safetensors_elements(path: Path) -> int:
    """Element count from a safetensors header (no tensor is read)."""
    with Path(path).open("rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


@dataclass
class Decision2Source:
    """A verified Decision 2.0 package."""

    root: Path
    pointer: dict[str, Any]
    manifest: dict[str, Any]
    config: dict[str, Any]
    profile: str
    backbone_config: dict[str, Any]
    base: Path | None
    identity: str
    temperatures: dict[str, float]
    score_bias: dict[int, list[float]] | None


def _check_config(cfg: Any) -> str:
    if not isinstance(cfg, dict):
        raise ConversionError("decision_config.json must be an object")
    if cfg.get("prompt_version") != PROMPT_VERSION:
        raise ConversionError(f"decision_config.json: unsupported prompt_version {cfg.get('prompt_version')!r}")
    if cfg.get("architecture") not in ARCHITECTURES:
        raise ConversionError(f"decision_config.json: unsupported architecture {cfg.get('architecture')!r}")
    if cfg.get("head_variant", "shared") != "shared":
        raise ConversionError("decision_config.json: only the shared candidate head is supported")
    if cfg.get("dec_residual") is not None or cfg.get("readout") == "label_token":
        raise ConversionError("decision_config.json: residual and label-token readouts are not supported")
    if cfg.get("checkpoint_format") not in (None, "full", LORA_FORMAT):
        raise ConversionError(f"decision_config.json: unknown checkpoint_format {cfg.get('checkpoint_format')!r}")
    if type(cfg.get("head_dim")) is not int or cfg["head_dim"] < 1:
        raise ConversionError("decision_config.json: head_dim must be a positive integer")
    return ARCHITECTURES[cfg["architecture"]]


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def read_decision2(src: Path, base: Path | None = None) -> Decision2Source:
    """Verify ``src`` (and an adapter's pinned ``base``, default ``<src>-base``) as the upstream runtime would."""
    root = Path(src)
    pointer = _json(root / "config.json")
    if not isinstance(pointer, dict) or any(pointer.get(k) != v for k, v in POINTER.items()):
        raise ConversionError("config.json is not a Decision 2.0 package pointer")
    manifest = _json(root / MANIFEST)
    files = manifest.get("files_sha256") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA \
            or manifest.get("profile") not in KNOWN_PROFILES or not isinstance(files, dict) or MANIFEST in files:
        raise ConversionError(f"{MANIFEST}: unknown or malformed Decision 2.0 manifest")
    profile = manifest["profile"]
    if profile not in PROFILES:
        raise ConversionError(f"{MANIFEST}: profile {profile!r} is not supported (qwen-full, qwen-adapter)")
    actual = inventory(root)
    actual.pop(MANIFEST, None)
    if actual != files:
        changed = sorted(k for k in set(actual) & set(files) if actual[k] != files[k])
        raise ConversionError(f"package files differ from {MANIFEST} (missing {sorted(set(files) - set(actual))[:3]}, "
                              f"extra {sorted(set(actual) - set(files))[:3]}, changed {changed[:3]})")
    if pointer.get("model_name") != manifest.get("model_name"):
        raise ConversionError("config.json and MODEL_MANIFEST.json name different models")
    params = manifest.get("parameters")
    if not isinstance(params, dict) or not isinstance(params.get("packaged_files"), dict):
        raise ConversionError(f"{MANIFEST}: no packaged parameter counts")
    counted = {g: sum(safetensors_elements(root / n) for n in names) for g, names in params["packaged_files"].items()}
    if counted != params.get("packaged"):
        raise ConversionError(f"{MANIFEST}: packaged tensor counts differ from the safetensors headers")
    limit = manifest.get("max_input_tokens")
    if type(limit) is not int or limit < 16:
        raise ConversionError(f"{MANIFEST}: max_input_tokens must be an integer >= 16")
    cfg = _json(root / "decision_config.json")
    backbone_type = _check_config(cfg)
    adapter = profile == "qwen-adapter"
    if adapter != (cfg.get("checkpoint_format") == LORA_FORMAT):
        raise ConversionError("the qwen-adapter profile needs checkpoint_format peft-lora/1 (and only it)")
    base_dir = None
    if adapter:
        base_dir = Path(base) if base is not None else root.parent / f"{root.name}-base"
        if not base_dir.is_dir():
            raise ConversionError(f"the adapter's pinned base is not at {base_dir} (pass --base DIR)")
        expected = (cfg.get("lora") or {}).get("source_fingerprint", {}).get("files_sha256")
        got = source_files(base_dir)
        if got != expected:
            raise ConversionError("the base's files differ from the adapter's source fingerprint")
        for name, digest in ((manifest.get("base") or {}).get("files_sha256") or {}).items():
            if not (base_dir / name).is_file() or file_sha256(base_dir / name) != digest:
                raise ConversionError(f"base file differs from the pinned revision: {name}")
        hashes = {**{f"checkpoint/{k}": v for k, v in checkpoint_files(root).items()},
                  **{f"source/{k}": v for k, v in got.items()}}
        backbone_config = _text_config(_json(base_dir / "config.json"))
    else:
        hashes = checkpoint_files(root)
        if not any(k.startswith("backbone/") and k.endswith((".safetensors", ".bin")) for k in hashes):
            raise ConversionError("the checkpoint has no backbone weight files")
        backbone_config = _text_config(_json(root / "backbone" / "config.json"))
    identity = sha256_json(hashes)
    if (manifest.get("identity") or {}).get("model_sha256") != identity:
        raise ConversionError(f"{MANIFEST}: identity.model_sha256 differs from the files (computed {identity[:12]}...)")
    model_type = backbone_config.get("model_type")
    if model_type == "qwen3_5":
        model_type = "qwen3_5_text"
    if model_type != backbone_type:
        raise ConversionError(f"backbone model_type {model_type!r} does not match the architecture ({backbone_type})")
    if backbone_type != "qwen3":
        raise ConversionError("qwen3_5_text backbones are not supported: the installed Transformers has no Qwen3.5 "
                              "text model to export and check against")
    header = root / "decision_head.safetensors"
    with header.open("rb") as f:
        names = set(json.loads(f.read(int.from_bytes(f.read(8), "little")))) - {"__metadata__"}
    if names != HEAD_TENSORS:
        raise ConversionError(f"decision_head.safetensors must hold exactly the ten head tensors, not {sorted(names)}")
    return Decision2Source(root, pointer, manifest, cfg, profile, backbone_config, base_dir, identity,
                           _temperatures(root, manifest, identity), _score_bias(root, manifest, identity))


def _temperatures(root: Path, manifest: dict[str, Any], identity: str) -> dict[str, float]:
    entry = manifest.get("calibration")
    if not entry:
        return dict.fromkeys(TASK_TYPES, 1.0)
    report = _json(root / entry["file"])
    if not isinstance(report, dict) or report.get("calibration_version") != CALIBRATION_VERSION \
            or report.get("model_sha256") != identity:
        raise ConversionError("calibration: unknown version or another model's")
    if (report.get("inference") or {}).get("max_length") not in (None, manifest["max_input_tokens"]):
        raise ConversionError("calibration: inference.max_length differs from max_input_tokens")
    values = report.get("temperature_by_type")
    if not isinstance(values, dict) or set(values) != set(TASK_TYPES) or not all(
            isinstance(v, (int, float)) and math.isfinite(v) and 0.05 <= v <= 20 for v in values.values()):
        raise ConversionError("calibration: temperature_by_type needs choice, noul, score in [0.05, 20]")
    return {k: float(v) for k, v in values.items()}


def _score_bias(root: Path, manifest: dict[str, Any], identity: str) -> dict[int, list[float]] | None:
    entry = manifest.get("score_bias")
    if entry is None:
        return None
    path = root / entry["file"]
    if manifest["files_sha256"].get(entry["file"]) != entry.get("sha256") or file_sha256(path) != entry["sha256"]:
        raise ConversionError("score_bias: file differs from its manifest entry")
    report = _json(path)
    if not isinstance(report, dict) or set(report) != {"format", "model_sha256", "offsets", "fit"} \
            or report["format"] != SCORE_BIAS_FORMAT or report["model_sha256"] != identity:
        raise ConversionError("score_bias: unknown format or another model's")
    offsets = {}
    for key, row in report["offsets"].items():
        if not key.isdigit() or str(int(key)) != key or not 2 <= int(key) <= 255 or not isinstance(row, list) \
                or len(row) != int(key) or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in row):
            raise ConversionError(f"score_bias: offsets[{key!r}] must be {key} finite numbers, L in 2..255")
        offsets[int(key)] = [float(x) for x in row]
    if report["offsets"] != entry.get("offsets"):
        raise ConversionError("score_bias: offsets differ from MODEL_MANIFEST.json")
    return offsets
