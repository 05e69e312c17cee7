"""Decision 3.0 packages (``d3-package-manifest/1``) in the upstream format: detect, verify, read the weights.

docs: docs/reference/upstream-formats.md §3.1-§3.4. A package is a Transformers ``Qwen3_5Model``
checkpoint (text model, optionally its vision tower) in BF16, a 255-row answer-code readout
(``readout.safetensors``), ``decision_config.json``, the tokenizer files, a chat template and a
``MODEL_MANIFEST.json`` that lists every file's SHA-256 (and size), the parameter counts and the identity of
the scored checkpoint. Every check of the released runtime's verifier is repeated here; bundled Python
(``d3_runtime.py``) is never read. Each failure is a one-line :class:`ConversionError`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converters.errors import ConversionError

if TYPE_CHECKING:
    import numpy as np
    import torch

KIND = "decision3"
MANIFEST_NAME = "MODEL_MANIFEST.json"
MANIFEST_SCHEMA = "d3-package-manifest/1"
FORMAT_ID = "d3-code-readout-v1"
FORMAT_VERSION = 1
PROMPTS = ("d3",)
ATTENTION_MODES = ("causal", "noncausal_full_attention")
READOUT_DTYPES = ("float32", "bfloat16")
MAX_OPTIONS = 255
MIN_INPUT_TOKENS = 16
#: decision_config.json fields the identity covers (the ones that change answers)
INFERENCE_FIELDS = ("format_version", "format_id", "prompt", "base_model", "revision", "codes", "token_ids",
                    "temperature", "attention_mode", "pooling", "max_length", "readout_dtype")
#: files besides the weights that the identity covers, when present
IDENTITY_FILES = ("readout.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: every file read besides the weights
MODEL_FILES = ("config.json", "decision_config.json", *IDENTITY_FILES)
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
WEIGHT_INDEX = "model.safetensors.index.json"
TEXT_PREFIXES = ("language_model.", "model.language_model.")
VISION_PREFIXES = ("visual.", "model.visual.")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_SAFETENSORS_HEADER_LIMIT = 100 << 20


@dataclass(frozen=True)
class Decision3Source:
    """A verified upstream Decision 3.0 package: what the converter needs, nothing read twice."""

    root: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    decision: dict[str, Any]
    config: dict[str, Any]
    weights: tuple[str, ...]
    text_prefix: str
    vision_prefix: str | None
    model_sha256: str
    max_input_tokens: int
    parameters: dict[str, int]

    @property
    def text_config(self) -> dict[str, Any]:
        """config.json's ``text_config`` (a ``qwen3_5_text`` config)."""
        return dict(self.config["text_config"])

    @property
    def vision_config(self) -> dict[str, Any] | None:
        """config.json's ``vision_config``, when the package has one."""
        vision = self.config.get("vision_config")
        return dict(vision) if isinstance(vision, dict) else None

    @property
    def attention_mode(self) -> str:
        return str(self.decision.get("attention_mode", "causal"))

    @property
    def temperature(self) -> float:
        return float(self.decision.get("temperature", 1.0))

    @property
    def readout_dtype(self) -> str:
        return str(self.decision.get("readout_dtype", "float32"))

    @property
    def codes(self) -> list[str]:
        return list(self.decision["codes"])

    @property
    def token_ids(self) -> list[int]:
        return list(self.decision["token_ids"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["text_config"]["hidden_size"])


def sha256_file(path: Path) -> str:
    """SHA-256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json(path: Path) -> Any:
    """A JSON file of the package; a missing or unreadable one is a ConversionError naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConversionError(f"the Decision 3.0 package has no {Path(path).name}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{Path(path).name}: not readable JSON ({e})") from None


def detect(src: Path) -> str | None:
    """``"decision3"`` when ``src/decision_config.json`` names the d3 code-readout format and prompt."""
    path = Path(src) / "decision_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(config, dict) and config.get("format_id") == FORMAT_ID and config.get("prompt") in PROMPTS:
        return KIND
    return None


def model_identity(files: Mapping[str, str], decision: Mapping[str, Any]) -> str:
    """The scored checkpoint's identity: SHA-256 of the weight and identity files' hashes plus the inference
    fields, as ``json.dumps(sort_keys, compact separators)`` with the default ``ensure_ascii=True`` (unlike
    canonical JSON: this is how the package builder hashes it)."""
    fields = {key: decision[key] for key in INFERENCE_FIELDS if key in decision}
    blob = json.dumps({"files": dict(files), "decision": fields}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def weight_files(root: Path) -> tuple[str, ...]:
    """The checkpoint's weight files: the index and its shards (sorted), or ``model.safetensors``."""
    index = root / WEIGHT_INDEX
    if index.is_file():
        mapping = read_json(index)
        mapping = mapping.get("weight_map") if isinstance(mapping, dict) else None
        if not isinstance(mapping, dict) or not mapping or \
                any(not isinstance(v, str) or "/" in v or "\\" in v or not v.endswith(".safetensors")
                    for v in mapping.values()):
            raise ConversionError(f"{WEIGHT_INDEX} has no weight_map of local .safetensors shards")
        return (WEIGHT_INDEX, *sorted(set(mapping.values())))
    if (root / "model.safetensors").is_file():
        return ("model.safetensors",)
    raise ConversionError("the Decision 3.0 package has no model.safetensors (or model.safetensors.index.json)")


def _read_manifest(root: Path) -> tuple[dict[str, Any], str]:
    manifest = read_json(root / MANIFEST_NAME)
    files = manifest.get("files_sha256") if isinstance(manifest, dict) else None
    if not isinstance(manifest, dict) or manifest.get("schema") != MANIFEST_SCHEMA:
        raise ConversionError(f"{MANIFEST_NAME}: schema must be {MANIFEST_SCHEMA!r}")
    if not isinstance(files, dict) or not files or MANIFEST_NAME in files or \
            any(not isinstance(v, str) or not _SHA256.fullmatch(v) for v in files.values()):
        raise ConversionError(f"{MANIFEST_NAME}: files_sha256 must map each file (not the manifest itself) to a "
                              "lowercase SHA-256")
    sizes = manifest.get("files_bytes")
    if sizes is not None and (not isinstance(sizes, dict)
                              or any(type(v) is not int or v < 0 for v in sizes.values())):
        raise ConversionError(f"{MANIFEST_NAME}: files_bytes must map file names to byte counts")
    return manifest, sha256_file(root / MANIFEST_NAME)


def _verify_files(root: Path, manifest: Mapping[str, Any], names: Sequence[str]) -> dict[str, str]:
    """Each file the converter reads must be present, listed, and match the manifest's size and digest."""
    listed: dict[str, str] = manifest["files_sha256"]
    sizes: dict[str, int] = manifest.get("files_bytes") or {}
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise ConversionError(f"the Decision 3.0 package has no {', '.join(missing[:5])}")
    unlisted = [n for n in names if n not in listed]
    if unlisted:
        raise ConversionError(f"{MANIFEST_NAME} does not list {', '.join(unlisted[:5])}")
    for name in names:
        if name in sizes and (root / name).stat().st_size != sizes[name]:
            raise ConversionError(f"{name}: {(root / name).stat().st_size} bytes, {MANIFEST_NAME} says {sizes[name]}")
    hashes = {name: sha256_file(root / name) for name in names}
    changed = [n for n in names if hashes[n] != listed[n]]
    if changed:
        raise ConversionError(f"{', '.join(changed[:5])}: SHA-256 differs from {MANIFEST_NAME}")
    return hashes


def check_decision_config(config: Any) -> dict[str, Any]:
    """The released runtime's rules for ``decision_config.json`` (upstream-formats.md §3.2); returns it."""
    if not isinstance(config, dict):
        raise ConversionError("decision_config.json must be an object")
    if config.get("format_version") != FORMAT_VERSION or config.get("format_id") != FORMAT_ID:
        raise ConversionError(f"decision_config.json: format_version must be {FORMAT_VERSION} and format_id "
                              f"{FORMAT_ID!r}")
    if config.get("prompt", "d3") not in PROMPTS:
        raise ConversionError(f"decision_config.json: unknown prompt family {config.get('prompt')!r}")
    if config.get("attention_mode", "causal") not in ATTENTION_MODES:
        raise ConversionError(f"decision_config.json: unknown attention_mode {config.get('attention_mode')!r} "
                              f"(expected one of {', '.join(ATTENTION_MODES)})")
    if config.get("pooling", "last") != "last":
        raise ConversionError(f"decision_config.json: unsupported pooling {config.get('pooling')!r} (only 'last')")
    if config.get("readout_dtype", "float32") not in READOUT_DTYPES:
        raise ConversionError("decision_config.json: readout_dtype must be float32 or bfloat16")
    temperature = config.get("temperature", 1.0)
    if type(temperature) not in (int, float) or not math.isfinite(temperature) or temperature <= 0:
        raise ConversionError("decision_config.json: temperature must be a positive finite number")
    codes, token_ids = config.get("codes"), config.get("token_ids")
    if not isinstance(codes, list) or len(codes) != MAX_OPTIONS or \
            any(not isinstance(c, str) or not c for c in codes) or len(set(codes)) != MAX_OPTIONS:
        raise ConversionError(f"decision_config.json: codes must be {MAX_OPTIONS} distinct non-empty strings")
    if not isinstance(token_ids, list) or len(token_ids) != MAX_OPTIONS or \
            any(type(t) is not int or t < 0 for t in token_ids) or len(set(token_ids)) != MAX_OPTIONS:
        raise ConversionError(f"decision_config.json: token_ids must be {MAX_OPTIONS} distinct non-negative "
                              "integers")
    limit = config.get("max_length")
    if limit is not None and (type(limit) is not int or limit < MIN_INPUT_TOKENS):
        raise ConversionError(f"decision_config.json: max_length must be null or an integer >= {MIN_INPUT_TOKENS}")
    return config


def check_config(config: Any) -> dict[str, Any]:
    """config.json: a ``qwen3_5`` model with a ``qwen3_5_text`` text config (and a ``qwen3_5_vision`` one)."""
    if not isinstance(config, dict) or config.get("model_type") != "qwen3_5":
        raise ConversionError("config.json: model_type must be 'qwen3_5'")
    text = config.get("text_config")
    if not isinstance(text, dict) or text.get("model_type") != "qwen3_5_text":
        raise ConversionError("config.json: text_config must be a 'qwen3_5_text' config")
    vision = config.get("vision_config")
    if vision is not None and (not isinstance(vision, dict) or vision.get("model_type") != "qwen3_5_vision"):
        raise ConversionError("config.json: vision_config must be a 'qwen3_5_vision' config")
    hidden = text.get("hidden_size")
    if type(hidden) is not int or hidden < 1:
        raise ConversionError("config.json: text_config.hidden_size must be a positive integer")
    layers = text.get("layer_types")
    if not isinstance(layers, list) or not layers or \
            any(t not in ("linear_attention", "full_attention") for t in layers) or \
            text.get("num_hidden_layers", len(layers)) != len(layers):
        raise ConversionError("config.json: text_config.layer_types must list linear_attention/full_attention "
                              "for each of num_hidden_layers")
    return config


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (no tensor is read)."""
    try:
        with Path(path).open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= _SAFETENSORS_HEADER_LIMIT:
                raise ValueError(f"header length {n}")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        raise ConversionError(f"{Path(path).name}: not a safetensors file ({e})") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{Path(path).name}: not a safetensors file")
    return {k: v for k, v in header.items() if k != "__metadata__"}


def _shape(file: str, name: str, meta: Any) -> list[int]:
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
        raise ConversionError(f"{file}: invalid shape of tensor {name!r}")
    return shape


def tensor_groups(root: Path, weights: Sequence[str]) -> tuple[dict[str, int], str, str | None]:
    """Element counts per group (text, vision) from the headers, and the one name prefix of each group."""
    counts = {"text": 0, "vision": 0}
    prefixes: dict[str, set[str]] = {"text": set(), "vision": set()}
    for file in weights:
        if not file.endswith(".safetensors"):
            continue
        for name, meta in safetensors_header(root / file).items():
            shape = _shape(file, name, meta)
            vision = next((p for p in VISION_PREFIXES if name.startswith(p)), None)
            text = next((p for p in TEXT_PREFIXES if name.startswith(p)), None)
            if vision is None and text is None:
                raise ConversionError(f"{file}: tensor {name!r} is under neither the text prefix "
                                      f"({' or '.join(TEXT_PREFIXES)}) nor the vision prefix "
                                      f"({' or '.join(VISION_PREFIXES)})")
            group = "vision" if vision else "text"
            prefixes[group].add(vision or text or "")
            counts[group] += math.prod(shape)
    if len(prefixes["text"]) != 1 or len(prefixes["vision"]) > 1:
        found = sorted(prefixes["text"] | prefixes["vision"])
        raise ConversionError(f"checkpoint tensors use mixed or missing name prefixes ({', '.join(found) or 'none'}):"
                              " the text tensors must all be under one prefix, the vision tensors under one")
    return counts, next(iter(prefixes["text"])), next(iter(prefixes["vision"]), None)


def readout_shape(root: Path) -> list[int]:
    """The shape of the one tensor ``weight`` of readout.safetensors."""
    header = safetensors_header(root / "readout.safetensors")
    if set(header) != {"weight"}:
        raise ConversionError("readout.safetensors must hold exactly one tensor, named weight "
                              f"(it holds {sorted(header)[:5]})")
    return _shape("readout.safetensors", "weight", header["weight"])


def read_source(src: str | Path) -> Decision3Source:
    """Verify an upstream Decision 3.0 package exactly as the released runtime does (§3.1-§3.4)."""
    root = Path(src).expanduser()
    if not root.is_dir():
        raise ConversionError(f"{src}: no such directory")
    root = root.resolve()
    if detect(root) is None:
        raise ConversionError(f"{src}: decision_config.json does not name format_id {FORMAT_ID!r} with prompt 'd3'")
    manifest, manifest_sha256 = _read_manifest(root)
    decision = check_decision_config(read_json(root / "decision_config.json"))
    config = check_config(read_json(root / "config.json"))
    weights = weight_files(root)
    names = [*MODEL_FILES, *weights]
    if config.get("vision_config") is not None:
        names += [n for n in PROCESSOR_FILES if (root / n).is_file()]
    hashes = _verify_files(root, manifest, names)
    identity_files = {n: hashes[n] for n in (*[w for w in weights if w.endswith(".safetensors")], *IDENTITY_FILES)}
    model_sha256 = model_identity(identity_files, decision)
    declared = manifest.get("identity")
    if not isinstance(declared, dict) or declared.get("model_sha256") != model_sha256:
        raise ConversionError(f"the model identity {model_sha256[:12]}… differs from {MANIFEST_NAME}'s "
                              "identity.model_sha256 (the files or decision fields are not the scored checkpoint)")
    counts, text_prefix, vision_prefix = tensor_groups(root, weights)
    hidden = int(config["text_config"]["hidden_size"])
    shape = readout_shape(root)
    if shape != [MAX_OPTIONS, hidden]:
        raise ConversionError(f"readout.safetensors: weight has shape {shape}, expected {[MAX_OPTIONS, hidden]}")
    readout = MAX_OPTIONS * hidden
    expected = {"text": counts["text"], "vision": counts["vision"], "readout": readout,
                "loaded": counts["text"] + counts["vision"] + readout}
    parameters = manifest.get("parameters")
    if not isinstance(parameters, dict) or any(parameters.get(k) != v for k, v in expected.items()):
        raise ConversionError(f"{MANIFEST_NAME}: parameters differ from the tensors' element counts {expected}")
    if vision_prefix is not None and config.get("vision_config") is None:
        raise ConversionError("the checkpoint has vision weights but config.json has no vision_config")
    limit = decision.get("max_length") or config["text_config"].get("max_position_embeddings")
    if type(limit) is not int or limit < MIN_INPUT_TOKENS:
        raise ConversionError("the package declares no usable input limit (decision_config.json max_length or "
                              f"text_config.max_position_embeddings, an integer >= {MIN_INPUT_TOKENS})")
    return Decision3Source(root=root, manifest=manifest, manifest_sha256=manifest_sha256, decision=decision,
                           config=config, weights=weights, text_prefix=text_prefix, vision_prefix=vision_prefix,
                           model_sha256=model_sha256, max_input_tokens=limit, parameters=expected)


def _load_group(source: Decision3Source, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under ``prefix`` (prefix removed) as float32: BF16 upcast exactly.

    The released runtime computes in BF16 (weights cast to BF16 on load), so a tensor stored in another
    floating dtype is rounded to BF16 first; that rounding is the runtime's, and BF16 -> FP32 is exact."""
    import torch
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in source.weights:
        if not file.endswith(".safetensors"):
            continue
        for name, tensor in load_file(str(source.root / file)).items():
            if not name.startswith(prefix):
                continue
            if not tensor.is_floating_point():
                raise ConversionError(f"{file}: tensor {name!r} is {tensor.dtype}, not a floating-point weight")
            out[name[len(prefix):]] = tensor.to(torch.bfloat16).to(torch.float32)
    return out


def text_weights(source: Decision3Source) -> dict[str, torch.Tensor]:
    """The text model's tensors (``Qwen3_5TextModel`` names, no prefix), float32 from BF16."""
    return _load_group(source, source.text_prefix)


def vision_weights(source: Decision3Source) -> dict[str, torch.Tensor]:
    """The vision tower's tensors (no prefix), float32 from BF16; empty without a tower."""
    return _load_group(source, source.vision_prefix) if source.vision_prefix else {}


def readout_matrix(source: Decision3Source) -> np.ndarray:
    """readout.safetensors' ``weight`` [255, hidden] as float32, cast through ``readout_dtype`` as the
    released runtime casts it (BF16 rounding when readout_dtype is bfloat16; exact otherwise)."""
    import torch
    from safetensors.torch import load_file

    weight = load_file(str(source.root / "readout.safetensors"))["weight"]
    if not weight.is_floating_point():
        raise ConversionError(f"readout.safetensors: weight is {weight.dtype}, not floating point")
    cast = weight.to(getattr(torch, source.readout_dtype)).to(torch.float32)
    if not bool(torch.isfinite(cast).all()):
        raise ConversionError("readout.safetensors: weight has non-finite values")
    return cast.numpy().copy()
