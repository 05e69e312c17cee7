"""Loading one served model: read its package, build its family, warm it, self-check its golden
outputs and probe which rows may share a forward. One failed model leaves the others serving."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from edge_runtime.artifacts import ArtifactError, convert_once
from edge_runtime.config import AUTO_VARIANT, ModelConfig
from edge_runtime.engine import (
    BatchLimits,
    EngineError,
    GraphSession,
    Grouping,
    ModelExecutor,
    ProbeResult,
    bucket_candidates,
    create_session,
    probe,
)
from edge_runtime.engine.devices import resolve_device
from edge_runtime.engine.executor import INLINE_ALONE_FORWARD_MAX_S, INLINE_FORWARD_MAX_S
from edge_runtime.engine.probe import PROBE_LENGTHS, finite_or_none
from edge_runtime.engine.result_cache import ResultCache
from edge_runtime.engine.threads import ThreadChoice, choose_threads
from edge_runtime.families.base import ModelFamily
from edge_runtime.families.registry import build_family, read_package
from edge_runtime.heap import keep_loaded
from edge_runtime.packages import Package, PackageError
from edge_runtime.packages.footprint import package_need
from edge_runtime.packages.golden import self_check
from edge_runtime.timing import Timing

log = logging.getLogger("edge_runtime")

#: Devices whose probe also tries fixed-shape buckets where padded batches are not exact. ONNX
#: Runtime's CPU kernels do not choose by batch shape (the probe proves padded there), so on the
#: CPU the bucket trials would only add load time; CUDA's matmuls choose their kernels by shape.
BUCKET_DEVICES = frozenset({"cuda"})

#: A version's life (edge_runtime/updates): loading and verifying beside the active one, standby
#: (verified, not named), active (the name points to it), draining (no new work, finishing its
#: own), retired (released), failed (never promoted, or rolled back; the reason says which).
VERSION_STATES = ("loading", "verifying", "standby", "active", "draining", "retired", "failed")
#: Latencies kept per version for the post-promotion watch (error rate, p99).
STATS_WINDOW = 2048
#: variant "auto" takes this variant on the CPU when the package has it: the exact per-token int8
#: (batch-invariant, its agreement with fp32 on the card), built and measured for CPU kernels.
AUTO_CPU_VARIANT = "int8"


class LoadRefused(Exception):
    """A load that will fail the same way however often it is tried: a failed self-check, a model
    above its memory budget. (PackageError and ArtifactError are never retried either.)"""


class LoadStopped(Exception):
    """The server began to stop while the model was loading."""


class VersionStats:
    """One version's recent answers: counts and a bounded window of latencies, for the watch window
    after a promotion (an error is a request the server failed: 5xx, never a client's 4xx)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self._latencies: deque[float] = deque(maxlen=STATS_WINDOW)

    def record(self, seconds: float, failed: bool) -> None:
        with self._lock:
            self.requests += 1
            if failed:
                self.errors += 1
            else:
                self._latencies.append(seconds)

    def snapshot(self) -> dict[str, float]:
        """requests, errors, error_rate and p99 (seconds, 0.0 with no answer yet)."""
        with self._lock:
            latencies = sorted(self._latencies)
            requests, errors = self.requests, self.errors
        p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
        return {"requests": requests, "errors": errors, "error_rate": errors / requests if requests else 0.0,
                "p99": p99}


@dataclass
class ServedModel:
    """One entry of models.yaml and everything loaded for it."""

    config: ModelConfig
    status: str = "loading"
    reason: str | None = None
    package: Package | None = None
    family: ModelFamily | None = None
    session: GraphSession | None = None
    executor: ModelExecutor | None = None
    grouping: Grouping | None = None
    numerics: str = "exact"
    probe: ProbeResult | None = None  # the load-time probe's trials (None: not probed, or rows run alone)
    numerics_max_abs_diff: float | None = None  # approximate only: the probe's batch vs rows alone
    self_check: dict[str, Any] = field(default_factory=lambda: {"status": "unverified"})
    result_cache: ResultCache | None = None  # this version's row outputs (engine/result_cache.py)
    thread_choice: ThreadChoice | None = None  # the thread count each forward size takes (engine/threads.py)
    retryable: bool = False  # the last load failed for a reason that may pass (memory, a device, a file)
    attempts: int = 0  # loads tried
    artifact_note: str | None = None  # how an artifact became its package (reused or converted)
    # -- the version this entry is (edge_runtime/updates) --
    version_state: str = "loading"
    serial: int = 0  # the process's count of versions loaded, to tell two loads of one digest apart
    reason_code: str | None = None  # why a version failed, as a metric label: load, verify, self_check, ...
    loaded_at: float | None = None  # time.time() of each transition below
    activated_at: float | None = None
    released_at: float | None = None
    resident_bytes: int | None = None  # RSS growth measured across the load
    stats: VersionStats = field(default_factory=VersionStats)
    leases: int = 0  # requests that resolved this version and have not been answered yet
    _lease_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def version_id(self) -> str | None:
        """The first 8 hex digits of the package digest: what ``name@<version_id>`` addresses."""
        return None if self.package is None else self.package.digest[:8]

    def acquire(self) -> None:
        """A request now holds this version: a drain waits for it (or for its deadline)."""
        with self._lease_lock:
            self.leases += 1

    def release(self) -> None:
        with self._lease_lock:
            self.leases -= 1

    def version(self) -> dict[str, Any]:
        """This version as /v1/models, /health and the admin API list it."""
        entry: dict[str, Any] = {"version_id": self.version_id, "serial": self.serial, "state": self.version_state}
        if self.package is not None:
            entry.update(model_sha256=self.package.digest, revision=self.package.card.revision,
                         package=str(self.config.package), variant=self.config.variant)
        if self.reason and self.version_state in ("failed", "retired", "draining", "standby"):
            entry["reason"] = self.reason
        for key in ("loaded_at", "activated_at", "released_at", "resident_bytes"):
            value = getattr(self, key)
            if value is not None:
                entry[key] = value
        return entry

    @property
    def surfaces(self) -> frozenset[str]:
        if self.package is None:
            return frozenset()
        return frozenset(self.package.card.surfaces)

    def dtype(self) -> str:
        assert self.package is not None
        return self.package.card.variants[self.config.variant].dtype

    def device(self) -> str:
        return self.config.device if self.session is None else self.session.device

    def info(self) -> dict[str, Any]:
        """This model's entry in GET /v1/models."""
        entry: dict[str, Any] = {"id": self.name, "object": "model", "status": self.status,
                                 "ready": self.status == "ready"}
        if self.reason:
            entry["reason"] = self.reason
        if self.package is not None:
            card = self.package.card
            entry.update(
                version_id=self.version_id,
                family=card.family,
                kind=card.kind,
                surfaces=sorted(card.surfaces),
                description=card.description,
                version=card.version,
                release_date=card.release_date,
                revision=card.revision,
                model_sha256=self.package.digest,
                limits=dict(card.limits),
                variant=self.config.variant,
                dtype=self.dtype() if self.config.variant in card.variants else None,
            )
        if self.family is not None:
            entry.update(self.family.describe())
            entry["limits"]["max_input_tokens"] = self.family.max_input_tokens
        if self.session is not None:
            entry.update(
                device=self.device(),
                engine="onnxruntime",
                engine_args={
                    **self.session.engine_args,
                    "max_queue": self.config.max_queue,
                    "grouping": self.grouping,
                    **self._batching_args(),
                    **({"threads_by_tokens": self.thread_choice.describe()} if self.thread_choice else {}),
                },
                numerics=self.numerics,
            )
        entry["self_check"] = self.self_check
        return entry

    def _batching_args(self) -> dict[str, Any]:
        """What the probe found (engine_args.probe), the buckets in use, and, where numerics are
        approximate, by how much a batch moved the probe's rows (engine_args.numerics_max_abs_diff)."""
        args: dict[str, Any] = {}
        if self.probe is not None:
            args["probe"] = self.probe.describe()
            if self.grouping == "buckets" and self.probe.buckets is not None:
                args["buckets"] = self.probe.buckets.describe()
        if self.numerics == "approximate":
            args["numerics_max_abs_diff"] = finite_or_none(self.numerics_max_abs_diff)
        return args

    def meta(self, timing: Timing, extras: dict[str, Any]) -> dict[str, Any]:
        """options.return_meta: the identity and settings that answered, and the timings so far."""
        assert self.package is not None
        meta: dict[str, Any] = {
            "model": self.name,
            "revision": self.package.card.revision,
            "model_sha256": self.package.digest,
            "dtype": self.dtype(),
            "numerics": self.numerics,
            "engine": "onnxruntime",
            "device": self.device(),
            "variant": self.config.variant,
            "version_id": self.version_id,  # which version answered, across a swap
            "timings": timing.milliseconds(("parse", "tokenize", "queue", "forward", "post")),
        }
        meta.update(extras)
        return meta


def load_model(model: ServedModel, metrics: Any = None, stop: threading.Event | None = None,
               attempts: int = 1) -> None:
    """Read, build, warm, self-check and probe one model; a failure marks it failed with its reason
    (``retryable`` says whether trying again may help), except that a retryable failure with attempts
    left of ``attempts`` stays ``loading``: /health never shows failed between tries. An artifact of the
    Router's models file is converted first when it is a source (edge_runtime/artifacts.py). ``stop``
    ends a load early."""
    started = time.perf_counter()
    model.attempts += 1
    try:
        model.status = "loading"
        model.version_state = "loading"
        cfg = model.config
        if cfg.missing is not None:
            raise ArtifactError(cfg.missing)
        if cfg.source is not None:
            model.artifact_note = convert_once(cfg.source, cfg.package, cfg.name, stop)
            log.info("model %s: %s", model.name, model.artifact_note)
        _check_stop(stop)
        package = read_package(cfg.package)
        variant = choose_variant(cfg.variant, package, cfg.device)
        if variant not in package.card.variants:
            raise PackageError(
                "card.json",
                f"variant {variant!r} is not in the package (it has {sorted(package.card.variants)})",
            )
        if variant != cfg.variant:
            cfg = model.config = dataclasses.replace(cfg, variant=variant)
        if cfg.memory_budget_bytes is not None:
            need = package_need(cfg.package, variant)
            if need.bytes > cfg.memory_budget_bytes:
                raise LoadRefused(f"needs {need.bytes / 2**30:.2f} GiB ({need.source}), above its memory budget "
                                  f"of {cfg.memory_budget_bytes / 2**30:.2f} GiB")
        model.package = package
        model.session = create_session(package.graph(cfg.variant), cfg.device, cfg.threads,
                                       spinning=cfg.spinning, tf32=cfg.tf32)
        _check_stop(stop)
        # the family, over every graph of the package (the others opened and self-checked like this one)
        model.family, checks = build_family(package, model.session, cfg)
        model.status = "warming"
        model.version_state = "verifying"
        model.family.warm()
        _check_stop(stop)
        model.self_check = self_check(model.session, package.golden(cfg.variant), model.session.device,
                                      made_on=package.card.golden_class)
        if model.self_check["status"] == "failed":
            raise LoadRefused(f"self-check failed: {model.self_check['reason']}")
        if checks:
            model.self_check["graphs"] = checks
        _check_stop(stop)
        chosen = batching(model)
        model.grouping, model.numerics = chosen.grouping, chosen.numerics
        model.probe, model.numerics_max_abs_diff = chosen.probe, chosen.max_abs_diff
        forward = model.family.forward
        if chosen.grouping == "buckets" and chosen.probe is not None and chosen.probe.buckets is not None:
            forward = forward.bucketed(chosen.probe.buckets)  # type: ignore[attr-defined]
        _check_stop(stop)
        model.thread_choice = choose_threads(model.session, forward, model.family.probe_row,
                                             model.family.max_input_tokens, batches=chosen.grouping != "alone")
        if model.thread_choice is not None:
            model.session.use_threads(model.thread_choice.plan)
        model.executor = ModelExecutor(
            model.name, forward, model.grouping, cfg.max_queue, max_batch_tokens=cfg.max_batch_tokens, metrics=metrics,
            inline_max_s=INLINE_FORWARD_MAX_S,  # sub-millisecond forwards skip the thread hand-off
            inline_alone_max_s=INLINE_ALONE_FORWARD_MAX_S,  # and a lone request's forward of a few ms
        )
        model.result_cache = ResultCache(model.name, cfg.result_cache_entries, cfg.result_cache_bytes, metrics)
        keep_loaded()  # later full collections skip what the load left alive (edge_runtime/heap.py)
        model.status = "ready"
        model.reason = None
        model.version_state = "standby"
        model.loaded_at = time.time()
        if metrics is not None:
            metrics.model_info(model)
        log.info("model %s ready in %.2fs (%s, grouping %s)", model.name,
                 time.perf_counter() - started, model.session.device, model.grouping)
    except Exception as exc:  # one failed model leaves the others serving
        # what may pass on another try: a device or session not ready, a file being written, memory; a refusal,
        # a bad package or a setting the family cannot take (ValueError) fails the same way every time
        model.retryable = (isinstance(exc, EngineError | OSError | MemoryError | RuntimeError)
                           and not isinstance(exc, PackageError | ArtifactError | LoadRefused | LoadStopped))
        retried = model.retryable and model.attempts < attempts and not (stop is not None and stop.is_set())
        model.status = model.version_state = "loading" if retried else "failed"
        model.reason = str(exc) or type(exc).__name__
        model.reason_code = "self_check" if "self-check failed" in model.reason else (
            "verify" if isinstance(exc, PackageError) else "load")
        log.error("model %s failed: %s", model.name, model.reason)


def _check_stop(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise LoadStopped("the server is stopping")


def choose_variant(variant: str, package: Package, device: str) -> str:
    """``variant`` itself, or for ``auto``: the exact int8 on the CPU where the package has it, else fp32."""
    if variant != AUTO_VARIANT:
        return variant
    if resolve_device(device) == "cpu" and AUTO_CPU_VARIANT in package.card.variants:
        return AUTO_CPU_VARIANT
    return "fp32"


@dataclass(frozen=True)
class Batching:
    """How a model's rows share forwards: the grouping, whether answers stay exact, what the probe
    found, and, for approximate numerics, the largest difference it measured from rows alone."""

    grouping: Grouping
    numerics: str
    probe: ProbeResult | None = None
    max_abs_diff: float | None = None


def batching(model: ServedModel) -> Batching:
    """Probe which rows may share a forward and apply the models file's `batching`: `exact` takes
    the widest grouping proven (fixed-shape buckets are tried on BUCKET_DEVICES where padded
    batches are not exact), `padded` takes padded batches, approximate unless proven exact."""
    family = model.family
    assert family is not None and model.session is not None
    if not family.batchable:
        return Batching("alone", "exact")
    max_tokens = family.max_input_tokens
    lengths = tuple(min(n, max_tokens) for n in PROBE_LENGTHS)
    candidates = bucket_candidates(max_tokens, BatchLimits()) if model.session.device in BUCKET_DEVICES else ()
    result = probe(family.forward, family.probe_row, lengths=lengths, buckets=candidates)
    if model.config.batching == "padded" and result.grouping != "padded":
        padded = result.trial("padded")
        return Batching("padded", "approximate", result, padded.max_abs_diff if padded is not None else None)
    return Batching(result.grouping, "exact", result)
