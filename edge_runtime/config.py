"""Typed settings: the process flags (ServeConfig) and each served model (ModelConfig), defaults in one place."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_BUNDLE_TASKS = 64
DEFAULT_MAX_INPUTS = 2048
DEFAULT_MAX_QUEUE = 256
# Jobs that may wait for a preparation thread (decoding, parsing, tokenizing, media) before more
# requests are refused overloaded: at 100 ms for the largest bodies' jobs, 4 threads clear it
# in a few seconds, and it holds two full bundles' tasks (--max-bundle-tasks 64).
DEFAULT_MAX_PREP_QUEUE = 128
DEFAULT_FORWARD_TIMEOUT_SECONDS = 60.0
# Under Kubernetes' default 30 s termination grace period (deploy/ sets it to match).
DEFAULT_DRAIN_SECONDS = 25.0
# A swapped-out version finishes what it accepted within this; what is still queued then gets 503.
DEFAULT_UPDATE_DRAIN_SECONDS = 30.0
# After a promotion the previous version stays resident and the new one is watched this long.
DEFAULT_UPDATE_WATCH_SECONDS = 60.0
DEFAULT_ADMIN_PORT = 8101
UPDATE_POLICIES = ("beside", "replace")
SYSTEMONE_SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0")
DEVICES = ("cpu", "cuda", "auto")
BATCHING = ("exact", "padded")


class ConfigError(ValueError):
    """A models file or flag that cannot be served; the message names the field."""


@dataclass(frozen=True)
class UpdateRules:
    """An entry's ``update:`` settings: how a new version of it is judged before its promotion
    (edge_runtime/updates/agreement.py, docs/updating-models.md). Not part of a version's identity."""

    # An embedding or rerank version whose output space changed is promoted only when allowed;
    # otherwise it is held standby, reachable as name@<version_id>, until an explicit promote.
    allow_space_change: bool = False
    space_min_cosine: float = 0.99  # below this min cosine on the golden inputs the space changed
    space_max_dp: float = 0.05  # above this max |dp| of rerank scores the space changed
    # The agreement gate (None: not checked): a failing gate keeps the old version.
    max_dp: float | None = None
    min_argmax_agreement: float | None = None
    min_cosine: float | None = None
    # Opt-in: the last requests the active version answered, kept in memory only (count and bytes
    # bounded), which old and new also answer for the report. 0 turns it off.
    sample_requests: int = 0
    sample_bytes: int = 1 << 20


@dataclass(frozen=True)
class ModelConfig:
    """One entry of models.yaml."""

    name: str
    package: Path
    variant: str = "fp32"
    device: str = "auto"
    threads: int | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    # exact: batch only what the load-time probe proved invariant; padded: opt-in approximate batching.
    batching: str = "exact"
    max_input_tokens: int | None = None
    max_scan_tokens: int | None = None
    # Other names a request may use for this model (e.g. jev-latest, the System One SDK's default);
    # answers always report `name`.
    aliases: tuple[str, ...] = ()
    # ONNX Runtime's intra-op threads spin-wait after each forward before they sleep: a little
    # latency saved, and CPU burnt that an autoscaler or a neighbour sees as load. False turns it off
    # (session.intra_op.allow_spinning = "0"); the Kubernetes profile does (docs/deployment.md).
    spinning: bool = True
    # On CUDA, TF32 for fp32 matmuls: faster on large models, but it moves outputs by up to ~1e-2
    # (ONNX Runtime turns it on by default); off unless asked. No effect on the CPU.
    tf32: bool = False
    update: UpdateRules = UpdateRules()


@dataclass(frozen=True)
class ServeConfig:
    """Process-wide settings from the command line."""

    models_file: Path
    models: tuple[ModelConfig, ...]
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    forward_timeout_seconds: float = DEFAULT_FORWARD_TIMEOUT_SECONDS
    systemone_schema: str = "vllm-sr/5.0"
    max_bundle_tasks: int = DEFAULT_MAX_BUNDLE_TASKS
    max_inputs: int = DEFAULT_MAX_INPUTS
    drain_seconds: float = DEFAULT_DRAIN_SECONDS
    # The preparation pool's bounded queue (edge_runtime/work.py).
    max_prep_queue: int = DEFAULT_MAX_PREP_QUEUE
    # Access control and transport (edge_runtime/api/auth.py, access.py); keys also come from
    # the environment variable EDGE_RUNTIME_API_KEY.
    api_key_file: Path | None = None
    metrics_require_key: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    access_log: bool = True
    # Model updates (edge_runtime/updates, docs/updating-models.md). models.yaml is re-read on
    # SIGHUP always; every watch_models seconds too when set.
    watch_models: float | None = None
    update_drain_seconds: float = DEFAULT_UPDATE_DRAIN_SECONDS
    update_watch_seconds: float = DEFAULT_UPDATE_WATCH_SECONDS
    rollback_error_rate: float = 0.05
    rollback_p99_ratio: float = 3.0
    rollback_min_requests: int = 50
    memory_reserve_bytes: int = 0
    update_policy: str = "beside"
    # The admin API: its own listener, off unless an admin key file is given.
    admin_key_file: Path | None = None
    admin_host: str = DEFAULT_HOST
    admin_port: int = DEFAULT_ADMIN_PORT
    admin_package_root: Path | None = None  # default: the models file's directory


_MODEL_KEYS = {
    "name", "package", "variant", "device", "threads", "max_queue", "batching", "limits", "aliases", "spinning",
    "tf32", "update",
}
_LIMIT_KEYS = {"max_input_tokens", "max_scan_tokens"}


def _positive_int(value: Any, where: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a positive integer, not {value!r}")
    return value


def _model(entry: Any, index: int, base: Path) -> ModelConfig:
    where = f"models[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a mapping")
    unknown = sorted(set(entry) - _MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name must be a non-empty string")
    package = entry.get("package")
    if not isinstance(package, str) or not package:
        raise ConfigError(f"{where}.package must be a path")
    device = entry.get("device", "auto")
    if device not in DEVICES:
        raise ConfigError(f"{where}.device must be one of {list(DEVICES)}, not {device!r}")
    batching = entry.get("batching", "exact")
    if batching not in BATCHING:
        raise ConfigError(f"{where}.batching must be one of {list(BATCHING)}, not {batching!r}")
    variant = entry.get("variant", "fp32")
    if not isinstance(variant, str):
        raise ConfigError(f"{where}.variant must be a string")
    limits = entry.get("limits") or {}
    if not isinstance(limits, dict) or set(limits) - _LIMIT_KEYS:
        raise ConfigError(f"{where}.limits takes only {sorted(_LIMIT_KEYS)}")
    aliases = entry.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise ConfigError(f"{where}.aliases must be a list of non-empty strings")
    spinning = entry.get("spinning", True)
    if not isinstance(spinning, bool):
        raise ConfigError(f"{where}.spinning must be true or false, not {spinning!r}")
    tf32 = entry.get("tf32", False)
    if not isinstance(tf32, bool):
        raise ConfigError(f"{where}.tf32 must be true or false, not {tf32!r}")
    path = Path(package)
    return ModelConfig(
        update=update_rules(entry.get("update"), f"{where}.update"),
        name=name,
        package=path if path.is_absolute() else (base / path),
        variant=variant,
        device=device,
        threads=_positive_int(entry.get("threads"), f"{where}.threads"),
        max_queue=_positive_int(entry.get("max_queue", DEFAULT_MAX_QUEUE), f"{where}.max_queue", False) or 1,
        batching=batching,
        max_input_tokens=_positive_int(limits.get("max_input_tokens"), f"{where}.limits.max_input_tokens"),
        max_scan_tokens=_positive_int(limits.get("max_scan_tokens"), f"{where}.limits.max_scan_tokens"),
        aliases=tuple(aliases),
        spinning=spinning,
        tf32=tf32,
    )


def update_rules(raw: Any, where: str) -> UpdateRules:
    """An entry's ``update:`` mapping (or an admin request's overrides) as UpdateRules."""
    if raw is None:
        return UpdateRules()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping")
    known = {f.name for f in dataclasses.fields(UpdateRules)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; it takes {sorted(known)}")
    allow = raw.get("allow_space_change", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"{where}.allow_space_change must be true or false, not {allow!r}")
    values: dict[str, Any] = {"allow_space_change": allow}
    for key in ("sample_requests", "sample_bytes"):
        value = raw.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{where}.{key} must be a whole number of at least 0, not {value!r}")
            values[key] = value
    for key in known - {"allow_space_change", "sample_requests", "sample_bytes"}:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ConfigError(f"{where}.{key} must be a number from 0 to 1, not {value!r}")
        values[key] = float(value)
    return UpdateRules(**values)


def load_models_file(path: Path) -> tuple[ModelConfig, ...]:
    """Read and validate models.yaml; package paths are relative to the file's directory."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read models file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise ConfigError(f"{path} must hold a non-empty list under 'models'")
    models = tuple(_model(e, i, path.parent) for i, e in enumerate(doc["models"]))
    _check_unique_names(models, path)
    return models


def _check_unique_names(models: tuple[ModelConfig, ...], path: Path) -> None:
    """A name or alias may be claimed once: a request naming it must reach exactly one model."""
    owner: dict[str, tuple[int, str]] = {}
    for i, m in enumerate(models):
        for kind, value in [("name", m.name)] + [("alias", a) for a in m.aliases]:
            if value in owner:
                j, first_kind = owner[value]
                raise ConfigError(
                    f"{path}: {value!r} is claimed twice: as the {first_kind} of models[{j}] "
                    f"({models[j].name!r}) and as the {kind} of models[{i}] ({m.name!r})"
                )
            owner[value] = (i, kind)


def served_names(models: tuple[ModelConfig, ...]) -> str:
    """The served models and their aliases, for messages: ``a, b (aliases: jev-latest)``."""
    parts = []
    for m in models:
        parts.append(f"{m.name} (aliases: {', '.join(m.aliases)})" if m.aliases else m.name)
    return ", ".join(sorted(parts))


def canonical_name(models: tuple[ModelConfig, ...], name: str) -> str:
    """The model name a requested name or alias stands for; an unknown name is returned as it is."""
    for m in models:
        if name == m.name or name in m.aliases:
            return m.name
    return name
