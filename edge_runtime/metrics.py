"""Prometheus metrics (prometheus-client), one registry per process so tests can build several apps."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

PREFIX = "edge_runtime"
# 1 ms to about 8 s, doubling.
LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(14))
ROW_BUCKETS = tuple(2**i for i in range(9))
TOKEN_BUCKETS = tuple(64 * 2**i for i in range(13))


#: The figures of an agreement report exported per model (edge_runtime/updates/agreement.py).
AGREEMENT_FIGURES = ("max_abs_dp", "argmax_agreement", "min_cosine", "mean_cosine", "cases")
#: The label values of edge_runtime_model_swaps_total and edge_runtime_model_rollbacks_total.
SWAP_RESULTS = ("succeeded", "failed", "waiting", "held")
ROLLBACK_REASONS = ("verify", "load", "self_check", "memory", "agreement", "explicit", "error_rate", "p99")


class Metrics:
    """Every series the server exports; the engine calls the observe_* hooks from its worker threads."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}_requests", "Requests by endpoint and status.",
                                ["endpoint", "status"], registry=r)
        # Only served names (or their aliases' models) become label values: a client's model field
        # cannot grow the series.
        self.model_requests = Counter(f"{PREFIX}_model_requests", "Requests that named a served model, by "
                                      "model, endpoint and status.", ["model", "endpoint", "status"], registry=r)
        # process_resident_memory_bytes and the other process_* series, for the memory panels
        ProcessCollector(registry=r)
        self.request_duration = Histogram(f"{PREFIX}_request_duration_seconds", "Handler time by endpoint.",
                                          ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.queue_duration = Histogram(f"{PREFIX}_queue_duration_seconds", "Wait before a job's forwards.",
                                        ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.forward_duration = Histogram(f"{PREFIX}_forward_duration_seconds", "One batch forward.",
                                          ["model"], buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram(f"{PREFIX}_batch_rows", "Rows in one forward.", ["model"],
                                    buckets=ROW_BUCKETS, registry=r)
        self.batch_tokens = Histogram(f"{PREFIX}_batch_tokens", "Unpadded tokens in one forward.", ["model"],
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Jobs waiting for the model.", ["model"], registry=r)
        self.dropped_rows = Counter(f"{PREFIX}_dropped_rows", "Rows never run because their client left.",
                                    ["model"], registry=r)
        self.input_tokens = Counter(f"{PREFIX}_input_tokens", "Input tokens read.", ["model"], registry=r)
        self.prep_queue_depth = Gauge(f"{PREFIX}_prep_queue_depth", "Jobs waiting for a preparation thread.",
                                      registry=r)
        self.ready = Gauge(f"{PREFIX}_ready", "1 when every model is ready.", registry=r)
        self.info = Gauge(f"{PREFIX}_model_info", "Served models (value 1).",
                          ["model", "family", "kind", "variant", "dtype", "device", "numerics", "revision"],
                          registry=r)
        # Pod-level and unlabelled, so that a scaler reads one sample without a query language
        # (KEDA's metrics-api trigger, a prometheus-adapter rule). Computed from the executors at
        # scrape time: the request path pays nothing for them.
        self.pending_jobs = Gauge(f"{PREFIX}_pending_jobs",
                                  "Jobs waiting for a model, summed over the models (the per-model queue_depth).",
                                  registry=r)
        self.pending_jobs_mean = Gauge(f"{PREFIX}_pending_jobs_mean",
                                       "edge_runtime_pending_jobs exponentially weighted over time (time constant "
                                       "10 s): the queue between a scaler's reads, not at the instant of one.",
                                       registry=r)
        self.saturation = Gauge(f"{PREFIX}_saturation",
                                "Jobs in flight plus waiting over the jobs the models hold before answering 429, "
                                "summed over the models (0 idle, 1 full).", registry=r)
        self.pending_jobs.set_function(lambda: float(self.pending()))
        self.pending_jobs_mean.set_function(self.pending_mean)
        self.saturation.set_function(self.current_saturation)
        # Model updates (edge_runtime/updates): swaps, rollbacks, how long loads and drains take, which
        # version each name points to, what each resident version holds, and the memory budget.
        self.swaps = Counter(f"{PREFIX}_model_swaps", "Version swaps by model and result "
                             "(succeeded, failed, waiting: a package not yet complete, held: an output space "
                             "change kept standby).", ["model", "result"],
                             registry=r)
        self.drain_timeouts = Counter(f"{PREFIX}_model_drain_timeouts", "Versions released at "
                                      "--update-drain-seconds while requests still held them (what was queued "
                                      "was answered 503).", ["model"], registry=r)
        self.rollbacks = Counter(f"{PREFIX}_model_rollbacks", "Versions not promoted or rolled back, by reason "
                                 f"({', '.join(ROLLBACK_REASONS)}).",
                                 ["model", "reason"],
                                 registry=r)
        self.load_duration = Histogram(f"{PREFIX}_model_load_duration_seconds", "Loading and verifying one version.",
                                       ["model"], buckets=tuple(0.05 * 2**i for i in range(14)), registry=r)
        self.drain_duration = Histogram(f"{PREFIX}_model_drain_duration_seconds", "From a version's last moment "
                                        "active to its release.", ["model"],
                                        buckets=tuple(0.01 * 2**i for i in range(14)), registry=r)
        self.active_version = Gauge(f"{PREFIX}_model_active_version", "1 for the version each model name "
                                    "points to (version = the package digest's first 8 hex digits).",
                                    ["model", "version"], registry=r)
        self.resident_bytes = Gauge(f"{PREFIX}_model_resident_bytes", "Resident memory a loaded version added "
                                    "(RSS measured across its load), by model and version.", ["model", "version"],
                                    registry=r)
        self.memory_budget = Gauge(f"{PREFIX}_memory_budget_bytes", "Memory a new version may use: the cgroup "
                                   "v2 limit minus usage, else MemAvailable, less the configured reserve.",
                                   registry=r)
        self.memory_limit = Gauge(f"{PREFIX}_memory_limit_bytes", "Memory the process may use in all: the "
                                  "cgroup v2 memory.max under a limit, else MemTotal.", registry=r)
        # Read from the runtime at each scrape once watch_runtime is called, as edge_runtime_ready is
        # then and edge_runtime_model_failed always (_FailedModels).
        self.live = Gauge(f"{PREFIX}_live", "1 while /health/live answers alive, 0 while a forward has run "
                          "past --forward-timeout-seconds or a model's worker thread is gone.", registry=r)
        self.agreement = Gauge(f"{PREFIX}_model_agreement", "The last agreement report per model (a new version "
                               "against the active one on the golden cases): max_abs_dp, argmax_agreement, "
                               "min_cosine, mean_cosine, cases.", ["model", "figure"], registry=r)
        # The result caches (engine/result_cache.py): lookups by model and result (hit: the row's kept
        # output answered; miss: the row ran), and what each model's caches hold, read at scrape time.
        self.cache_lookups = Counter(f"{PREFIX}_result_cache_lookups", "Rows looked up in the result cache, by "
                                     "model and result (hit, miss).", ["model", "result"], registry=r)
        self._caches: dict[int, tuple[str, weakref.WeakMethod[Callable[[], tuple[int, int]]]]] = {}
        r.register(_CacheSizes(self._cached_sizes))
        self._active_versions: dict[str, str] = {}
        self._loads: dict[int, tuple[str, Callable[[], Any]]] = {}
        self._loads_lock = threading.Lock()
        # labels() takes a lock and builds a key on every call (~5 us); a sub-millisecond request
        # makes a dozen of them, so each labelled child is looked up once and kept.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # engine hooks -------------------------------------------------------------------------------

    def observe_queue(self, model: str, seconds: float) -> None:
        self._child(self.queue_duration, model).observe(seconds)

    def observe_forward(self, model: str, seconds: float, rows: int, tokens: int) -> None:
        self._child(self.forward_duration, model).observe(seconds)
        self._child(self.batch_rows, model).observe(rows)
        self._child(self.batch_tokens, model).observe(tokens)

    def set_queue_depth(self, model: str, depth: int) -> None:
        self._child(self.queue_depth, model).set(depth)

    def on_dropped(self, model: str, rows: int) -> None:
        self.dropped_rows.labels(model).inc(rows)

    def watch(self, model: str, load: Callable[[], Any]) -> None:
        """Read `model`'s load (an ExecutorLoad: queued, in_flight, capacity) at every scrape, one
        per executor: while a model is swapped its old and new versions both count until
        :meth:`unwatch` drops the released one."""
        with self._loads_lock:
            self._loads[id(getattr(load, "__self__", load))] = (model, load)

    def unwatch(self, executor: Any) -> None:
        """Stop reading a released executor's load."""
        with self._loads_lock:
            self._loads.pop(id(executor), None)

    def on_cache_lookups(self, model: str, hits: int, misses: int) -> None:
        if hits:
            self._child(self.cache_lookups, model, "hit").inc(hits)
        if misses:
            self._child(self.cache_lookups, model, "miss").inc(misses)

    def watch_cache(self, model: str, size: Callable[[], tuple[int, int]]) -> None:
        """Read a result cache's (entries, bytes) at each scrape while its version lives (held weakly:
        a released version's cache leaves with it)."""
        with self._loads_lock:
            self._caches = {k: v for k, v in self._caches.items() if v[1]() is not None}
            self._caches[id(getattr(size, "__self__", size))] = (model, weakref.WeakMethod(size))

    def _cached_sizes(self) -> dict[str, tuple[int, int]]:
        with self._loads_lock:
            readers = [(model, ref()) for model, ref in self._caches.values()]
        totals: dict[str, tuple[int, int]] = {}
        for model, read in readers:
            if read is not None:
                entries, size = read()
                was = totals.get(model, (0, 0))
                totals[model] = (was[0] + entries, was[1] + size)
        return totals

    # pod-level scaling gauges -------------------------------------------------------------------

    def _current_loads(self) -> list[Any]:
        with self._loads_lock:
            readers = [load for _, load in self._loads.values()]
        return [read() for read in readers]

    def pending(self) -> int:
        """Jobs waiting for any model of this process."""
        return sum(load.queued for load in self._current_loads())

    def pending_mean(self) -> float:
        """The running mean of the jobs waiting, summed over the models."""
        return float(sum(load.queued_mean for load in self._current_loads()))

    def current_saturation(self) -> float:
        """(in flight + waiting) / capacity over every model; 0.0 with no model loaded."""
        loads = self._current_loads()
        capacity = sum(load.capacity for load in loads)
        if capacity <= 0:
            return 0.0
        return sum(load.queued + load.in_flight for load in loads) / capacity

    # runtime hooks ------------------------------------------------------------------------------

    def observe_request(self, endpoint: str, status: int, seconds: float, model: str | None = None) -> None:
        self._child(self.requests, endpoint, str(status)).inc()
        self._child(self.request_duration, endpoint).observe(seconds)
        if model is not None:
            self._child(self.model_requests, model, endpoint, str(status)).inc()

    def watch_prep_queue(self, pool: Any) -> None:
        """Report ``pool.waiting`` (a WorkPool's jobs waiting for a thread) at each scrape."""
        self.prep_queue_depth.set_function(lambda: pool.waiting)

    def set_ready(self, ready: bool) -> None:
        self.ready.set(1.0 if ready else 0.0)

    def watch_runtime(self, runtime: Any) -> None:
        """Read ``runtime`` (a Runtime) at every scrape: edge_runtime_ready from its status (which
        otherwise changes only when /health is asked), edge_runtime_live from its stall check, and
        edge_runtime_model_failed for its served names whose version failed."""
        self.ready.set_function(lambda: 1.0 if runtime.status() == "ready" else 0.0)
        self.live.set_function(lambda: 0.0 if runtime.stalled() else 1.0)
        self.registry.register(_FailedModels(lambda: runtime.models.values()))

    def model_info(self, model: Any) -> None:
        card = model.package.card
        self.info.labels(model.name, card.family, card.kind, model.config.variant, model.dtype(),
                         model.device(), model.numerics, card.revision).set(1.0)

    def forget_model_info(self, model: Any) -> None:
        """Drop a released version's model_info and resident_bytes samples."""
        card = model.package.card
        labels = (model.name, card.family, card.kind, model.config.variant, model.dtype(), model.device(),
                  model.numerics, card.revision)
        for metric, values in ((self.info, labels), (self.resident_bytes, (model.name, str(model.version_id)))):
            with contextlib.suppress(KeyError):  # never set (a version that failed before it was counted)
                metric.remove(*values)

    def set_active_version(self, model: str, version: str | None) -> None:
        """``model`` now points to ``version`` (None: to no loaded version)."""
        old = self._active_versions.pop(model, None)
        if old is not None:
            with contextlib.suppress(KeyError):
                self.active_version.remove(model, old)
        if version is not None:
            self._active_versions[model] = version
            self.active_version.labels(model, version).set(1.0)
            # A counter child first seen at 1 shows Prometheus no increase (there is no earlier
            # sample), so an alert on increase() would miss a model's first rollback: start at 0.
            for result in SWAP_RESULTS:
                self._child(self.swaps, model, result)
            for reason in ROLLBACK_REASONS:
                self._child(self.rollbacks, model, reason)
            self._child(self.drain_timeouts, model)

    def set_agreement(self, model: str, report: dict[str, Any]) -> None:
        """The figures of ``model``'s last agreement report; a figure it does not have is removed."""
        for figure in AGREEMENT_FIGURES:
            value = report.get(figure)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.agreement.labels(model, figure).set(float(value))
            else:
                with contextlib.suppress(KeyError):
                    self.agreement.remove(model, figure)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CacheSizes:
    """The result caches' entries and bytes per model, as gauges computed at scrape time."""

    def __init__(self, read: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._read = read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        entries, held = self._families()
        for model, (count, size) in sorted(self._read().items()):
            entries.add_metric([model], count)
            held.add_metric([model], size)
        yield entries
        yield held

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (GaugeMetricFamily(f"{PREFIX}_result_cache_entries", "Rows and answers the result caches hold.",
                                  labels=["model"]),
                GaugeMetricFamily(f"{PREFIX}_result_cache_bytes", "Bytes the result caches hold.",
                                  labels=["model"]))


class _FailedModels:
    """edge_runtime_model_failed{model, reason}: 1 for each served name whose version failed to load
    (reason: load, verify or self_check, as ServedModel.reason_code); no sample while none has."""

    name = f"{PREFIX}_model_failed"
    documentation = "1 for a served model whose version failed to load, by why (load, verify, self_check)."

    def __init__(self, models: Callable[[], Any]) -> None:
        self.models = models

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.name, self.documentation, labels=["model", "reason"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=["model", "reason"])
        for model in list(self.models()):
            if model.status == "failed":
                family.add_metric([model.name, model.reason_code or "load"], 1.0)
        yield family
