"""The process's models over their lifetime: loading in turn, health, model resolution, running one
surface request's rows on its model, and the drain. Loading one model is edge_runtime.loading's;
replacing a served version with another while serving is edge_runtime.updates'.

The request path reads ``models`` (name -> the active version) and ``pinned`` (``name@<digest8>``
-> a resident version) once each: both are replaced whole, never changed in place, so a request
sees one version or the other, never a mix."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from edge_runtime import API_VERSION
from edge_runtime.config import MAX_LOAD_RETRY_SECONDS, ServeConfig, canonical_name, served_names
from edge_runtime.engine import DeadlineExceeded, Overloaded
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.base import Plan
from edge_runtime.loading import ServedModel, load_model
from edge_runtime.timing import Timing
from edge_runtime.work import WorkPool, admitted_whole, pool_threads

#: A request is alone (Runtime.alone) when no request came on another connection for this long: one
#: client's requests keep to their connection, and clients whose requests are this far apart rarely
#: meet; the cost of meeting is one inline forward's wait (engine/executor.py INLINE_ALONE_FORWARD_MAX_S).
ALONE_WINDOW_S = 0.1


class Runtime:
    """Every served model, the process's state, and the one path a surface request takes to a model."""

    def __init__(self, config: ServeConfig, metrics: Any = None) -> None:
        self.config = config
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {m.name: ServedModel(m, serial=i + 1)
                                               for i, m in enumerate(config.models)}
        self.pinned: dict[str, ServedModel] = {}
        # Every version of each name still resident, and the last few released (edge_runtime/updates
        # replaces it whole): what /v1/models and /health list under "versions".
        self.versions: dict[str, tuple[ServedModel, ...]] = {}
        # Called with (version, surface, body) after each answer (edge_runtime/updates keeps its
        # opt-in sample of recent requests with it); None: nothing is called.
        self.on_answered: Callable[[ServedModel, str, Any], None] | None = None
        self.started = False
        self.draining = False
        # Set when the server stops: a load in progress (a conversion, a retry's wait) ends early.
        self.stopping = threading.Event()
        # Surface requests being answered now (service.serve; the event loop's alone), the connection
        # the last one came on, and when one last came on another connection: see ``alone``.
        self.answering = 0
        self._last_connection: int | None = None
        self._last_arrival = float("-inf")
        self._other_arrival = float("-inf")
        # A full preparation queue is refused as a full model queue is: the engine's Overloaded.
        self.work = WorkPool(pool_threads(config.threads), max_queue=config.max_prep_queue, refuse=Overloaded)

    # -- loading ------------------------------------------------------------------------------

    def load_all(self) -> None:
        """Load, self-check and probe every model in turn (called off the event loop), then try again
        those whose load failed for a reason that may pass, up to --load-attempts each, waiting
        --load-retry-seconds before the first retry and twice as long before each next one (at most
        MAX_LOAD_RETRY_SECONDS). A model waiting for its retry reports ``loading`` with the reason;
        one that fails for good reports ``failed``."""
        self.started = True
        due: dict[str, tuple[float, float]] = {}  # name -> (when, the wait that led there)
        for model in self.models.values():
            if self.stopping.is_set():
                return
            self._load(model, due, self.config.load_retry_seconds)
        while due and not self.stopping.is_set():
            name, (when, waited) = min(due.items(), key=lambda item: item[1][0])
            if self.stopping.wait(max(0.0, when - time.monotonic())):
                return
            del due[name]
            retried = self.models.get(name)
            if retried is not None and retried.status == "loading":
                self._load(retried, due, min(2 * waited, MAX_LOAD_RETRY_SECONDS))

    def _load(self, model: ServedModel, due: dict[str, tuple[float, float]], wait: float) -> None:
        load_model(model, self.metrics, self.stopping, self.config.load_attempts)
        if model.status == "ready":
            model.version_state = "active"
            model.activated_at = time.time()
            self.pin(model)
        elif model.status == "loading":  # a retryable failure with attempts left (load_model decided)
            model.reason = (f"load attempt {model.attempts} of {self.config.load_attempts} failed, the next in "
                            f"{wait:g} s: {model.reason}")
            due[model.name] = (time.monotonic() + wait, wait)
        if self.metrics is not None:
            self.metrics.set_ready(self.status() == "ready")
            self.metrics.set_active_version(model.name, model.version_id)

    # -- versions (edge_runtime/updates calls these under its own lock) --------------------------

    def set_active(self, model: ServedModel) -> None:
        """Point ``model.name`` at ``model`` (its entry in the configuration too): one replacement of
        the map, so a request resolves the old version or the new one, never neither."""
        self.config = dataclasses.replace(self.config, models=_with_entry(self.config.models, model.config))
        self.models = {**self.models, model.name: model}

    def remove(self, name: str) -> None:
        """Stop serving ``name``: new requests get model_not_found; accepted ones finish."""
        self.models = {k: v for k, v in self.models.items() if k != name}
        self.config = dataclasses.replace(self.config, models=tuple(m for m in self.config.models if m.name != name))

    def set_entry(self, entry: Any) -> None:
        """Take a models.yaml entry whose identity is unchanged (its aliases, say) without a swap."""
        self.config = dataclasses.replace(self.config, models=_with_entry(self.config.models, entry))
        active = self.models.get(entry.name)
        if active is not None:
            active.config = entry

    def pin(self, model: ServedModel) -> None:
        """``name@<digest8>`` addresses this version while it is resident and takes work."""
        if model.version_id is not None:
            self.pinned = {**self.pinned, f"{model.name}@{model.version_id}": model}

    def unpin(self, model: ServedModel) -> None:
        key = f"{model.name}@{model.version_id}"
        if self.pinned.get(key) is model:
            self.pinned = {k: v for k, v in self.pinned.items() if k != key}

    # -- state ---------------------------------------------------------------------------------

    def status(self) -> str:
        """starting, loading, warming, ready, degraded, failed or draining."""
        states = [m.status for m in self.models.values()]
        if self.draining:
            return "draining"
        if not self.started:
            return "starting"
        for busy in ("loading", "warming"):
            if busy in states:
                return busy
        if all(s == "ready" for s in states):
            return "ready"
        return "failed" if all(s == "failed" for s in states) else "degraded"

    def health(self) -> tuple[int, dict[str, Any]]:
        status = self.status()
        body: dict[str, Any] = {"api_version": API_VERSION, "status": status}
        # Keyed by model name, {status, reason?} each: the shape the Router's health poller decodes.
        models: dict[str, dict[str, str]] = {}
        for m in self.models.values():
            entry: dict[str, Any] = {"status": m.status, "reason": m.reason} if m.reason else {"status": m.status}
            if m.version_id is not None:
                entry["version_id"] = m.version_id
            others = [v for v in self.versions.get(m.name, ()) if v is not m and v.version_state not in ("retired",)]
            if others:  # a swap in progress, a standby kept for rollback, or a failed attempt
                entry["versions"] = [{"version_id": v.version_id, "state": v.version_state}
                                     | ({"reason": v.reason} if v.reason else {}) for v in (m, *others)]
            models[m.name] = entry
        body["models"] = models
        if status != "ready":
            reasons = [f"{m.name}: {m.reason or m.status}" for m in self.models.values() if m.status != "ready"]
            body["reason"] = "; ".join(reasons) if reasons else status
        return (200 if status == "ready" else 503), body

    def stalled(self) -> str | None:
        """A reason while some forward has run past --forward-timeout-seconds."""
        for m in self.models.values():
            if m.executor is not None:
                reason = m.executor.stalled(self.config.forward_timeout_seconds)
                if reason:
                    return reason  # the executor's reason names its model
        return None

    def close_executors(self) -> None:
        """Stop every model's executor: queued jobs are answered 503, forwards in flight finish first."""
        for m in self.models.values():
            if m.executor is not None:
                m.executor.close()

    def close(self) -> None:
        """The last step of a drain: executors (joined, so no session is freed under a forward), then the pool."""
        self.draining = True
        self.stopping.set()
        self.close_executors()
        self.work.close()

    # -- serving ------------------------------------------------------------------------------

    def served_name(self, name: str | None) -> str | None:
        """The served model a requested name or alias names, None for any other name."""
        if name is None:
            return None
        canonical = canonical_name(self.config.models, name.partition("@")[0])
        return canonical if canonical in self.models else None

    def resolve(self, surface: str, name: str | None) -> ServedModel:
        """The model a request names (or the only one serving the surface); 404, 422 or 503 otherwise."""
        if name is None:
            candidates = [m for m in self.models.values() if surface in m.surfaces or m.package is None]
            if not candidates:  # the contract's 422: no served model serves this endpoint
                raise ApiError("unsupported_surface", f"no served model serves {surface}")
            if len(candidates) != 1:
                serving = sorted(m.name for m in self.models.values() if surface in m.surfaces)
                raise ApiError("invalid_request", f"model is required; models serving {surface}: {serving}")
            model = candidates[0]
        else:
            base, at, version = name.partition("@")
            if at:  # name@<digest8>: a resident version, active or standby
                found = self.pinned.get(f"{canonical_name(self.config.models, base)}@{version}")
                if found is not None and found.version_state not in ("active", "standby"):
                    found = None
            else:
                found = self.models.get(canonical_name(self.config.models, name))  # an alias names its model
            if found is None:
                raise ApiError(
                    "model_not_found",
                    f"model {name!r} is not served; served models: {served_names(self.config.models)}",
                )
            model = found
        if model.status != "ready":
            raise ApiError("not_ready", f"model {model.name!r} is {model.status}"
                           + (f": {model.reason}" if model.reason else ""))
        if surface not in model.surfaces:
            raise ApiError(
                "unsupported_surface",
                f"model {model.name!r} does not serve {surface}; it serves {sorted(model.surfaces)}",
            )
        model.acquire()  # released by the caller once answered (service.serve)
        return model

    def arrived(self, connection: int) -> None:
        """Note a surface request arriving on ``connection`` (any id that stays the same for a connection)."""
        now = time.monotonic()
        if connection != self._last_connection:
            self._other_arrival = self._last_arrival
            self._last_connection = connection
        self._last_arrival = now

    @property
    def alone(self) -> bool:
        """Whether the request being answered is the only one, and no request came on another connection
        within ALONE_WINDOW_S: its forward may then run inline for a few milliseconds. A request that
        arrives during an inline forward is read only when it ends, so concurrent requests never see each
        other in ``answering``; their connections taking turns is what shows them."""
        return self.answering <= 1 and time.monotonic() - self._other_arrival > ALONE_WINDOW_S

    async def execute(
        self, model: ServedModel, plan: Plan, deadline: float | None, timing: Timing
    ) -> dict[str, Any]:
        """Run a plan's rows on the model's executor and build its body (without meta)."""
        executor = model.executor
        if executor is None:  # released at its drain deadline after this request resolved it
            raise ApiError("not_ready", f"model {model.name!r} version {model.version_id} was released; retry")
        outputs: list[Any] | ItemError
        cache = model.result_cache
        lookup = cache.lookup(plan.rows, plan.keys) if cache is not None and plan.keys is not None else None
        rows = plan.rows if lookup is None else lookup.run
        if not rows:
            outputs = [] if lookup is None else lookup.complete([])
        else:
            try:
                # Overloaded, RequestTooLarge, ExecutorClosed and ForwardError go up as they are:
                # api/statuses.py gives each its code and status.
                result = await executor.submit(rows, deadline, refusable=not admitted_whole(), alone=self.alone)
            except DeadlineExceeded:
                plan.complete = False
                outputs = ItemError("deadline_exceeded", "options.deadline_ms passed before the input was run")
            else:
                outputs = result.outputs if lookup is None else lookup.complete(result.outputs)
                timing.add("queue", result.queue_s)
                timing.add("forward", result.forward_s)
        with timing.phase("post"):
            return await self.work.finish(plan.finish, outputs)



def _with_entry(models: tuple[Any, ...], entry: Any) -> tuple[Any, ...]:
    """The configured entries with ``entry`` in place of its name's (or added at the end)."""
    replaced = tuple(entry if m.name == entry.name else m for m in models)
    return replaced if any(m.name == entry.name for m in models) else (*models, entry)
