"""Reading a models file into ModelConfig entries: ours (``package`` entries, models.yaml) and the
Router's (``model`` artifacts with ``revision`` and ``profile``, JSON being YAML), mixed freely, and
``serve MODEL ...`` arguments as artifact entries. Artifacts are located here (edge_runtime/artifacts.py);
a missing one fails its model alone when the models load."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from edge_runtime.artifacts import locate
from edge_runtime.config import (
    BATCHING,
    PROFILES,
    ConfigError,
    EntryDefaults,
    ModelConfig,
    ServeConfig,
    check_device,
    update_rules,
)

_MODEL_KEYS = {
    "name", "package", "variant", "device", "threads", "max_queue", "batching", "limits", "aliases", "spinning",
    "tf32", "update", "result_cache_entries",
}
# The Router's entry (process.go modelEntry) and the rest of upstream's (vllm_srun/config.py).
_ARTIFACT_KEYS = {"model", "revision", "name", "device", "profile", "engine", "family", "memory_budget_gib",
                  "options"}
# The engines an artifact entry may name: this runtime is ONNX Runtime's.
ENGINES = ("auto", "onnxruntime")
_LIMIT_KEYS = {"max_input_tokens", "max_scan_tokens"}


def _positive_int(value: Any, where: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} must be a positive integer, not {value!r}")
    return value


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{where} must be a whole number of at least 0, not {value!r}")
    return value


def _model(entry: Any, index: int, base: Path, defaults: EntryDefaults) -> ModelConfig:
    where = f"models[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a mapping")
    if "model" in entry:
        return artifact_entry(entry, where, base, defaults)
    unknown = sorted(set(entry) - _MODEL_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown} (an entry names a `package`, or the Router's "
                          "`model` artifact)")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name must be a non-empty string")
    package = entry.get("package")
    if not isinstance(package, str) or not package:
        raise ConfigError(f"{where}.package must be a path")
    path = Path(package)
    return _settings(entry, where, defaults, name=name, package=path if path.is_absolute() else (base / path),
                     variant=entry.get("variant", "fp32"), device=entry.get("device", "auto"),
                     batching=entry.get("batching", "exact"))


def artifact_entry(entry: dict[str, Any], where: str, base: Path, defaults: EntryDefaults) -> ModelConfig:
    """An entry of the Router's shape: ``model`` (a package directory, a directory a converter reads,
    or a repo id in the Hugging Face cache), ``revision``, ``name``, ``device``, ``profile``, and
    ``options`` holding any of this runtime's own entry settings. Located now (edge_runtime/artifacts.py);
    a missing artifact fails its model alone when the models load."""
    unknown = sorted(set(entry) - _ARTIFACT_KEYS)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; an artifact entry takes {sorted(_ARTIFACT_KEYS)}")
    artifact = entry["model"]
    if not isinstance(artifact, str) or not artifact.strip():
        raise ConfigError(f"{where}.model must be a non-empty string")
    revision = entry.get("revision") or None
    if revision is not None and not isinstance(revision, str):
        raise ConfigError(f"{where}.revision must be a string")
    engine = entry.get("engine", "auto")
    if engine not in ENGINES:
        raise ConfigError(f"{where}.engine {engine!r} is not served here: edge-runtime runs ONNX Runtime "
                          f"(engine {' or '.join(ENGINES)})")
    if entry.get("family") is not None:
        raise ConfigError(f"{where}.family cannot be chosen: edge-runtime reads a model's family from its "
                          "package card (a converter records it)")
    profile_name = entry.get("profile") or "exact"
    profile = PROFILES.get(profile_name) if isinstance(profile_name, str) else None
    if profile is None:
        raise ConfigError(f"{where}.profile {profile_name!r} is not known; profiles: {', '.join(PROFILES)}")
    options = entry.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"{where}.options must be a mapping")
    unknown = sorted(set(options) - (_MODEL_KEYS - {"name", "package", "device"}))
    if unknown:
        raise ConfigError(f"{where}.options has unknown keys {unknown}; it takes this runtime's entry settings "
                          f"{sorted(_MODEL_KEYS - {'name', 'package', 'device'})}")
    name = entry.get("name") or artifact_name(artifact)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name must be a non-empty string")
    budget = entry.get("memory_budget_gib")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float) or budget <= 0):
        raise ConfigError(f"{where}.memory_budget_gib must be a number above 0, not {budget!r}")
    located = locate(artifact, revision, base, defaults.cache_dir)
    config = _settings(options, f"{where}.options", defaults, name=name, package=located.package,
                       variant=options.get("variant", profile.variant), device=entry.get("device") or "auto",
                       batching=options.get("batching", profile.batching))
    return dataclasses.replace(
        config, artifact=artifact, revision=revision, profile=profile_name, source=located.source,
        missing=located.missing,
        memory_budget_bytes=int(budget * 2**30) if budget is not None else config.memory_budget_bytes)


def artifact_name(artifact: str) -> str:
    """The served name of an artifact entry without one: its last path component (upstream names
    a model after its package; a Router-managed entry always names it)."""
    return artifact.rstrip("/").rpartition("/")[2] or artifact


def _settings(entry: dict[str, Any], where: str, defaults: EntryDefaults, *, name: str, package: Path,
              variant: Any, device: Any, batching: Any) -> ModelConfig:
    """The settings both entry shapes share, checked; ``defaults`` fill what the entry leaves out."""
    check_device(device, f"{where}.device")
    if batching not in BATCHING:
        raise ConfigError(f"{where}.batching must be one of {list(BATCHING)}, not {batching!r}")
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
    threads = _positive_int(entry.get("threads"), f"{where}.threads")
    if defaults.threads_cap is not None:  # --threads: the process's share of the cores bounds every model
        threads = min(threads or defaults.threads_cap, defaults.threads_cap)
    cache_entries = entry.get("result_cache_entries", defaults.result_cache_entries)
    return ModelConfig(
        update=update_rules(entry.get("update"), f"{where}.update"),
        name=name,
        package=package,
        variant=variant,
        device=device,
        threads=threads,
        max_queue=_positive_int(entry.get("max_queue", defaults.max_queue), f"{where}.max_queue", False) or 1,
        batching=batching,
        max_input_tokens=_positive_int(limits.get("max_input_tokens"), f"{where}.limits.max_input_tokens"),
        max_scan_tokens=_positive_int(limits.get("max_scan_tokens"), f"{where}.limits.max_scan_tokens"),
        aliases=tuple(aliases),
        spinning=spinning,
        tf32=tf32,
        result_cache_entries=_whole(cache_entries, f"{where}.result_cache_entries"),
        result_cache_bytes=defaults.result_cache_bytes,
        max_batch_tokens=defaults.max_batch_tokens,
        memory_budget_bytes=defaults.memory_budget_bytes,
    )



def load_models_file(path: Path, defaults: EntryDefaults | None = None) -> tuple[ModelConfig, ...]:
    """Read and validate a models file: ours (``package`` entries, models.yaml) or the Router's
    (``model`` entries, JSON being YAML), or both mixed; paths are relative to the file's directory."""
    defaults = defaults or EntryDefaults()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read models file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list) or not doc["models"]:
        raise ConfigError(f"{path} must hold a non-empty list under 'models'")
    models = tuple(_model(e, i, path.parent, defaults) for i, e in enumerate(doc["models"]))
    _check_unique_names(models, str(path))
    return models


def command_line_models(artifacts: list[str], defaults: EntryDefaults, *, revision: str | None = None,
                        name: str | None = None, device: str = "auto", profile: str = "exact"
                        ) -> tuple[ModelConfig, ...]:
    """``serve MODEL[@REVISION] ...``: artifact entries as the Router's models file would hold them
    (a path is taken as it is; ``repo@rev`` splits only when no such path exists)."""
    if not artifacts:
        raise ConfigError("serve needs MODEL arguments or --models FILE")
    if len(artifacts) > 1 and (revision or name):
        raise ConfigError("--revision and --served-model-name apply to one MODEL argument")
    models = []
    for value in artifacts:
        artifact, at, pinned = value.rpartition("@")
        if not (at and artifact and pinned) or Path(value).exists():
            artifact, pinned = value, ""
        if pinned and revision and pinned != revision:
            raise ConfigError(f"{value} conflicts with --revision {revision}")
        entry = {"model": artifact, "revision": pinned or revision, "name": name, "device": device,
                 "profile": profile}
        models.append(artifact_entry(entry, f"MODEL {value!r}", Path.cwd(), defaults))
    result = tuple(models)
    _check_unique_names(result, "the MODEL arguments")
    return result


def read_models(config: ServeConfig) -> tuple[ModelConfig, ...]:
    """The models file read again with the command line's defaults (a reload: SIGHUP, the admin API)."""
    if config.models_file is None:
        raise ConfigError("the models were given on the command line: there is no models file to re-read")
    return load_models_file(config.models_file, config.defaults)


def _check_unique_names(models: tuple[ModelConfig, ...], path: str) -> None:
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


