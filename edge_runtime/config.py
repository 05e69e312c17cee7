"""Typed settings: the process flags (ServeConfig) and each served model (ModelConfig), defaults in one place."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8100
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_BUNDLE_TASKS = 64
DEFAULT_MAX_INPUTS = 2048
DEFAULT_MAX_QUEUE = 256
# Padded tokens (rows x the longest row) one forward may hold.
DEFAULT_MAX_BATCH_TOKENS = 16384
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
# Under the Router (--uds) the process group gets SIGKILL 10 s after SIGTERM (supervisor.go's
# stopGracePeriod): the drain must end before that, with a margin to close the executors.
DEFAULT_MANAGED_DRAIN_SECONDS = 8.0
# The result cache of each model (engine/result_cache.py): upstream's default entry count, and a
# byte bound so that models with large row outputs cannot grow without limit.
DEFAULT_RESULT_CACHE_ENTRIES = 16_384
DEFAULT_RESULT_CACHE_BYTES = 64 * 1024 * 1024
# A model whose load fails for a reason that may pass (memory, a device, a file system) is tried
# this often, waiting this long before the first retry and twice as long each time after, up to
# MAX_LOAD_RETRY_SECONDS (upstream's --load-attempts / --load-retry-seconds).
DEFAULT_LOAD_ATTEMPTS = 5
DEFAULT_LOAD_RETRY_SECONDS = 5.0
MAX_LOAD_RETRY_SECONDS = 300.0
UPDATE_POLICIES = ("beside", "replace")
SYSTEMONE_SCHEMAS = ("vllm-sr/5.0", "vllm-sr/4.0")
BATCHING = ("exact", "padded")
# cpu, cuda (its first device), cuda:N (device N) or auto (CUDA when it loads, else the CPU).
_DEVICE = re.compile(r"^(cpu|auto|cuda(:[0-9]+)?)$")
# variant "auto": the package's exact int8 on the CPU when it has one, else fp32 (loading.py).
AUTO_VARIANT = "auto"


class ConfigError(ValueError):
    """A models file or flag that cannot be served; the message names the field."""


@dataclass(frozen=True)
class Profile:
    """A numerics profile of the Router's models file: the variant and batching it stands for."""

    variant: str
    batching: str
    means: str


#: The Router's ``profile`` names (upstream's profile plugins) and what each is here. Exact numerics
#: stay the default: every profile but ``batching`` answers bit for bit as a row alone would.
PROFILES: dict[str, Profile] = {
    "exact": Profile(AUTO_VARIANT, "exact", "the package's exact int8 on the CPU where it has one, else fp32; "
                                             "only batches the load-time probe proves bit-identical"),
    "batching": Profile(AUTO_VARIANT, "padded", "as exact, but rows of concurrent requests share padded batches "
                                                "even where that is not proven exact (numerics approximate)"),
    "shared_context": Profile(AUTO_VARIANT, "exact", "as exact: the decision families already run a request's "
                                                     "state once for all its questions, bit-identically"),
    "fp32": Profile("fp32", "exact", "the fp32 graph, exact batching (a semantic cache that needs fp32's "
                                     "neighbours)"),
}


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
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    # Item results kept by content (engine/result_cache.py); 0 entries turns the cache off.
    result_cache_entries: int = DEFAULT_RESULT_CACHE_ENTRIES
    result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES
    # A load estimated above this many bytes is refused (--memory-budget, memory_budget_gib).
    memory_budget_bytes: int | None = None
    # -- an entry of the Router's shape (``model``, ``revision``, ``profile``): edge_runtime/artifacts.py --
    artifact: str | None = None  # what the entry named: a package or source directory, or a repo id
    revision: str | None = None
    profile: str | None = None
    # A directory some converter reads, converted once into ``package`` when the model loads.
    source: Path | None = None
    # Why the artifact was not found: the model fails with this reason, the others serve.
    missing: str | None = None


def default_cache_dir() -> Path:
    """Hugging Face's hub cache as its own libraries find it: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub. Repo ids resolve there, offline; converted artifacts are kept beside."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home, "hub").expanduser()


@dataclass(frozen=True)
class EntryDefaults:
    """What the command line gives every served model that does not say otherwise (the same on every
    re-read of the models file, so a reload judges entries as the start did)."""

    threads_cap: int | None = None  # --threads: no model's sessions use more intra-op threads
    max_queue: int = DEFAULT_MAX_QUEUE
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    result_cache_entries: int = DEFAULT_RESULT_CACHE_ENTRIES
    result_cache_bytes: int = DEFAULT_RESULT_CACHE_BYTES
    memory_budget_bytes: int | None = None
    cache_dir: Path = dataclasses.field(default_factory=default_cache_dir)


@dataclass(frozen=True)
class ServeConfig:
    """Process-wide settings from the command line."""

    models_file: Path | None  # None: the models came as MODEL arguments
    models: tuple[ModelConfig, ...]
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    # Serve on this Unix domain socket instead of TCP (api/unix_socket.py): the Router's managed runtimes.
    uds: Path | None = None
    # What every model gets unless its entry says otherwise: the thread cap, queue, result cache,
    # memory budget and the cache directory where repo ids resolve.
    defaults: EntryDefaults = dataclasses.field(default_factory=EntryDefaults)
    # --threads: the process's share of the cores (the model sessions and the preparation pool).
    threads: int | None = None
    load_attempts: int = DEFAULT_LOAD_ATTEMPTS
    load_retry_seconds: float = DEFAULT_LOAD_RETRY_SECONDS
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


def check_device(device: Any, where: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``; other accelerators are named in the refusal."""
    if not isinstance(device, str) or not _DEVICE.match(device):
        raise ConfigError(f"{where} must be cpu, cuda, cuda:N or auto, not {device!r} (edge-runtime runs ONNX "
                          "Runtime on the CPU, or on NVIDIA GPUs through its CUDA provider)")
    return device


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
