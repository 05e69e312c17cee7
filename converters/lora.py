"""LoRA adapters merged at conversion: PEFT adapter directories over their base model, and the merge
itself (shared with decision2's adapter packages).

A PEFT adapter directory holds adapter_config.json (``peft_type`` LORA, ``base_model_name_or_path``,
``r``, ``lora_alpha``, ``task_type``, ...) and adapter_model.safetensors: ``lora_A``/``lora_B`` of each
target Linear (``base_model.model.<module>.lora_A.weight``) and the whole tensors of its
``modules_to_save`` (a classifier trained beside the adapter: ``base_model.model.<parameter>``). The
base is found on this machine, never downloaded: ``--base DIR``, a path in the config, or the repo id
in a Hugging Face cache directory (``--cache-dir``, else HF_HUB_CACHE / HF_HOME's ``hub``).

The merge is ``W += scaling * B @ A`` on every target (scaling ``alpha / r``, or ``alpha / sqrt(r)``
with rsLoRA, per-module ``rank_pattern``/``alpha_pattern`` as PEFT matches them), checked against the
unmerged forward ``base(x) + B(A(x)) * scaling`` as PEFT computes it in evaluation mode.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converters.errors import ConversionError
from edge_runtime.artifacts import hub_snapshot
from edge_runtime.packages.manifest import compute_digest, file_sha256

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT task types -> the converter kind whose model class the base is loaded with
TASK_KINDS = {"SEQ_CLS": "sequence-classification", "TOKEN_CLS": "token-classification",
              "FEATURE_EXTRACTION": "embedding"}
#: merged against unmerged forward: the largest difference a merge may show (fp32 rounding of W + sBA)
MERGE_TOLERANCE = 1e-4
_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^base_model\.model\.(.+)\.(lora_A|lora_B)\.weight$")
#: where the Router's training scripts (and others) write label names beside an adapter
_LABEL_FILES = ("label_mapping.json", "category_mapping.json")
_ID_TO_LABEL = ("id2label", "idx_to_category", "idx_to_label", "id_to_label")
_BASE_STAMPED = ("config.json", "model.safetensors", "pytorch_model.bin")
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})$")


@dataclass(frozen=True)
class LoraFactor:
    """One target Linear's factors: ``A [r, in]``, ``B [out, r]`` (float32 tensors) and its scaling."""

    a: Any
    b: Any
    scaling: float


def merge(model: Any, factors: Mapping[str, LoraFactor]) -> None:
    """Add ``scaling * B @ A`` to each target Linear's weight of ``model``, in place."""
    import torch

    modules = dict(model.named_modules())
    with torch.no_grad():
        for target, f in factors.items():
            module = modules.get(target)
            if not isinstance(module, torch.nn.Linear):
                raise ConversionError(f"adapter target {target} is not a Linear module of the model")
            module.weight += f.scaling * (f.b @ f.a)


@contextmanager
def unmerged(model: Any, factors: Mapping[str, LoraFactor]) -> Iterator[None]:
    """``model`` computing each target as ``base(x) + B(A(x)) * scaling`` (forward hooks) while open."""
    modules = dict(model.named_modules())
    hooks = []
    try:
        for target, f in factors.items():
            def hook(mod: Any, inputs: Any, output: Any, f: LoraFactor = f) -> Any:
                return output + (inputs[0] @ f.a.T @ f.b.T) * f.scaling
            hooks.append(modules[target].register_forward_hook(hook))
        yield
    finally:
        for h in hooks:
            h.remove()


# ---- PEFT adapter directories ----------------------------------------------------------------------


def task_type(src: Path) -> str | None:
    """The ``task_type`` of a PEFT LoRA adapter directory (TASK_KINDS maps it to a kind); None when ``src`` is none."""
    path = src / ADAPTER_CONFIG
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        return None
    return str(cfg.get("task_type"))


@dataclass(frozen=True)
class Adapter:
    """A PEFT LoRA adapter directory, read and checked."""

    root: Path
    config: dict[str, Any]
    kind: str
    factors: dict[str, LoraFactor]  # module path in the task model -> factors
    saved: dict[str, Any]  # modules_to_save: parameter name in the task model -> tensor
    labels: list[str] | None

    @property
    def base_name(self) -> str:
        return str(self.config.get("base_model_name_or_path") or "")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConversionError(f"{path}: unreadable JSON ({e})") from None


def _pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """A rank_pattern / alpha_pattern value for ``module``, matched as PEFT matches its keys (a key that
    ends the module's dotted path, as a regular expression)."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _labels(root: Path, rows: int | None) -> list[str] | None:
    """Label names beside the adapter (the first label file that names ``rows`` labels), else None."""
    for name in _LABEL_FILES:
        path = root / name
        if not path.is_file():
            continue
        data = _read_json(path)
        table = next((data[k] for k in _ID_TO_LABEL if isinstance(data, dict) and isinstance(data.get(k), dict)),
                     None)
        if table is None and isinstance(data, dict) and isinstance(data.get("label_list"), list):
            table = dict(enumerate(data["label_list"]))
        if table is None:
            continue
        try:
            indexed = {int(k): str(v) for k, v in table.items()}
        except ValueError:
            raise ConversionError(f"{path}: label indices must be integers") from None
        if sorted(indexed) != list(range(len(indexed))) or (rows is not None and len(indexed) != rows):
            raise ConversionError(f"{path}: names {len(indexed)} labels, the adapter's classifier has {rows}")
        return [indexed[i] for i in range(len(indexed))]
    return None


def read_adapter(src: Path, kind: str) -> Adapter:
    """Read and check a PEFT LoRA adapter directory for export as ``kind``; refuses what a merge cannot
    reproduce exactly (DoRA, LoRA biases, embedding or convolution targets, Conv1D weights)."""
    from safetensors.torch import load_file

    cfg = _read_json(src / ADAPTER_CONFIG)
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise ConversionError(f"{src / ADAPTER_CONFIG}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key, bad in (("use_dora", True), ("fan_in_fan_out", True), ("lora_bias", True)):
        if cfg.get(key) is bad:
            raise ConversionError(f"{src / ADAPTER_CONFIG}: {key}={bad} is not supported")
    if cfg.get("bias", "none") != "none":
        raise ConversionError(f"{src / ADAPTER_CONFIG}: bias={cfg.get('bias')!r} is not supported (only 'none')")
    for key in ("layer_replication", "trainable_token_indices"):
        if cfg.get(key):
            raise ConversionError(f"{src / ADAPTER_CONFIG}: {key} is not supported")
    weights = src / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise ConversionError(f"{src}: no {ADAPTER_WEIGHTS} (a pickled adapter_model.bin is never loaded)")
    tensors = load_file(str(weights))
    pairs: dict[str, dict[str, Any]] = {}
    saved: dict[str, Any] = {}
    for name, tensor in tensors.items():
        match = _LORA_KEY.match(name)
        if match:
            pairs.setdefault(match.group(1), {})[match.group(2)] = tensor.float()
        elif name.startswith(_PREFIX) and "lora_" not in name:
            saved[name[len(_PREFIX):]] = tensor.float()
        else:
            raise ConversionError(f"{weights}: tensor {name!r} is not a LoRA factor or a saved module this "
                                  "converter merges")
    r0, alpha0 = int(cfg.get("r", 8)), float(cfg.get("lora_alpha", 8))
    factors = {}
    for module, ab in sorted(pairs.items()):
        a, b = ab.get("lora_A"), ab.get("lora_B")
        r = int(_pattern_value(cfg.get("rank_pattern") or {}, module, r0))
        alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, module, alpha0))
        if a is None or b is None or a.dim() != 2 or b.dim() != 2 or a.shape[0] != r or b.shape[1] != r:
            raise ConversionError(f"{weights}: {module} needs lora_A [r, in] and lora_B [out, r] with r={r}")
        scaling = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        factors[module] = LoraFactor(a, b, scaling)
    if not factors:
        raise ConversionError(f"{weights}: no LoRA factors")
    head = next((saved[k] for k in ("classifier.weight", "score.weight") if k in saved), None)
    rows = int(head.shape[0]) if head is not None and kind != "embedding" else None
    return Adapter(src, cfg, kind, factors, saved, _labels(src, rows))


# ---- the base model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """Where an adapter's base is on this machine, and what the card says of it."""

    path: Path
    name: str
    revision: str | None


def hub_cache(cache_dir: Path | None) -> Path:
    """The Hugging Face cache directory: ``cache_dir``, else HF_HUB_CACHE, else HF_HOME's ``hub``."""
    if cache_dir is not None:
        return cache_dir
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface") / "hub"


def snapshot_identity(path: Path) -> tuple[str, str] | None:
    """(repo id, commit) of a Hugging Face cache snapshot directory, None for any other path."""
    match = _SNAPSHOT.search(path.resolve().as_posix())
    return (f"{match['org']}/{match['name']}", match["commit"]) if match else None


def find_base(adapter: Adapter, given: Path | None, cache_dir: Path | None) -> Base:
    """The adapter's base: ``given``, else its ``base_model_name_or_path`` as a directory (as written, or
    beside the adapter), else that repo id at the config's ``revision`` in the Hugging Face cache."""
    name = adapter.base_name
    if given is not None:
        if not given.is_dir():
            raise ConversionError(f"--base {given}: no such directory")
        return _base(given.resolve(), name or given.name, None)
    if not name:
        raise ConversionError(f"{adapter.root / ADAPTER_CONFIG}: names no base_model_name_or_path; pass --base DIR")
    for candidate in (Path(name).expanduser(), adapter.root / name):
        if candidate.is_dir():
            return _base(candidate.resolve(), name, None)
    revision = adapter.config.get("revision") or None
    snapshot = hub_snapshot(hub_cache(cache_dir), name, revision)
    if isinstance(snapshot, str):
        raise ConversionError(f"the adapter's base {snapshot}; or pass --base DIR")
    return _base(snapshot, name, revision)


def _base(path: Path, name: str, revision: str | None) -> Base:
    if not (path / "config.json").is_file():
        raise ConversionError(f"the adapter's base {path} has no config.json (not a Hugging Face model directory)")
    cached = snapshot_identity(path)
    return Base(path, name, cached[1] if cached else revision)


def files_digest(root: Path, names: tuple[str, ...]) -> str:
    """The digest of ``names`` under ``root`` that exist (MANIFEST.json's rule over their sha256)."""
    return compute_digest({n: file_sha256(root / n) for n in names if (root / n).is_file()})


def base_files(base: Path) -> dict[str, Path]:
    """The base's configuration and weight files (sharded weights included), by name."""
    names = [n for n in _BASE_STAMPED if (base / n).is_file()]
    names += sorted(p.name for p in base.glob("model-*-of-*.safetensors"))
    return {n: base / n for n in names}


def card_record(adapter: Adapter, base: Base, merge_diff: float, moved: float) -> dict[str, Any]:
    """The card's ``lora`` member: the adapter and the base (names, revisions, digests) and the merge check."""
    cached = snapshot_identity(adapter.root)
    return {
        "adapter": {
            "name": cached[0] if cached else adapter.root.name, "revision": cached[1] if cached else None,
            "sha256": files_digest(adapter.root, (ADAPTER_CONFIG, ADAPTER_WEIGHTS)),
            "task_type": adapter.config.get("task_type"), "rank": int(adapter.config.get("r", 8)),
            "alpha": float(adapter.config.get("lora_alpha", 8)), "rslora": bool(adapter.config.get("use_rslora")),
            "targets": len(adapter.factors), "target_modules": sorted({t.rsplit(".", 1)[-1] for t in adapter.factors}),
            "modules_to_save": sorted({k.rsplit(".", 1)[0] for k in adapter.saved}),
        },
        "base": {"name": base.name, "revision": base.revision,
                 "sha256": compute_digest({n: file_sha256(p) for n, p in base_files(base.path).items()})},
        "merge": {"max_abs_diff": float(f"{merge_diff:.3g}"), "adapter_effect": float(f"{moved:.3g}"),
                  "tolerance": MERGE_TOLERANCE},
    }


def load_merged(adapter: Adapter, base: Base, model_class: Any, probe: Mapping[str, Any]
                ) -> tuple[Any, float, float]:
    """The base loaded as ``model_class`` (fp32, eval) with the adapter's saved modules and its LoRA merged.

    Every weight Transformers did not find in the base must be one the adapter saved (else refused,
    naming them). Returns the model, the largest difference of its first output on ``probe`` between
    the merged and the unmerged forward (refused above MERGE_TOLERANCE), and how far the adapter moves
    that output from the base's (refused when it does not move it at all).
    """
    import torch

    kwargs: dict[str, Any] = {}
    if adapter.kind != "embedding":
        head = next((adapter.saved[k] for k in ("classifier.weight", "score.weight") if k in adapter.saved), None)
        if head is None:
            raise ConversionError(f"{adapter.root}: a {adapter.config.get('task_type')} adapter must save its "
                                  "classifier (modules_to_save)")
        labels = adapter.labels or [f"LABEL_{i}" for i in range(int(head.shape[0]))]
        kwargs = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                  "label2id": {label: i for i, label in enumerate(labels)}}
    try:
        model, info = model_class.from_pretrained(base.path, dtype=torch.float32, output_loading_info=True,
                                                  **kwargs)
    except Exception as e:  # noqa: BLE001 - any loading failure is reported the same way
        raise ConversionError(f"{base.path}: cannot load as {model_class.__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from None
    model.eval()
    unfilled = sorted(set(info.get("missing_keys") or []) - set(adapter.saved))
    if unfilled or info.get("mismatched_keys"):
        raise ConversionError(f"weights neither in the base {base.name} nor saved by the adapter: "
                              f"{unfilled or info.get('mismatched_keys')}")
    state = model.state_dict()
    for name, tensor in adapter.saved.items():
        if name not in state or tuple(state[name].shape) != tuple(tensor.shape):
            raise ConversionError(f"{adapter.root / ADAPTER_WEIGHTS}: saved tensor {name} "
                                  f"{list(tensor.shape)} has no place in {type(model).__name__}")
    model.load_state_dict(adapter.saved, strict=False)
    with torch.no_grad():
        before = model(**probe)[0]
        with unmerged(model, adapter.factors):
            reference = model(**probe)[0]
        merge(model, adapter.factors)
        merged = model(**probe)[0]
    merge_diff = float((merged - reference).abs().max())
    moved = float((merged - before).abs().max())
    if not merge_diff <= MERGE_TOLERANCE or moved <= 10 * MERGE_TOLERANCE:
        raise ConversionError(f"LoRA merge check failed: merged vs unmerged {merge_diff:.3g} (tolerance "
                              f"{MERGE_TOLERANCE:g}), vs the base alone {moved:.3g}")
    return model, merge_diff, moved


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "MERGE_TOLERANCE", "TASK_KINDS", "Adapter", "Base", "LoraFactor",
           "base_files", "card_record", "find_base", "hub_cache", "load_merged", "merge", "read_adapter",
           "snapshot_identity", "task_type", "unmerged"]
