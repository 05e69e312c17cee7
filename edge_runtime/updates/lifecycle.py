"""A version's life: loading -> verifying -> standby -> active -> draining -> retired, or failed (not
promoted, or rolled back). Versions holds every resident version of every name, the one a name may roll
back to, and those recently released (for listings), and makes each move: a version tracked beside the
active one, the switch (one replacement of ``Runtime.models``), the drain (no new work; what it holds
finishes) and the release (executor closed, sessions dropped, heap trimmed).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from edge_runtime.errors import ApiError
from edge_runtime.heap import give_back
from edge_runtime.loading import ServedModel
from edge_runtime.runtime import Runtime
from edge_runtime.updates.settings import UpdateSettings

log = logging.getLogger("edge_runtime.updates")

#: Released versions kept per name for listings.
HISTORY_KEPT = 4


@dataclass
class Tracked:
    """A resident version and what the manager keeps about it beyond the model itself."""

    model: ServedModel
    drain_started: float | None = None  # time.monotonic()
    drain_deadline: float | None = None
    hold_until: float | None = None  # a drained previous version stays standby until then (rollback)
    watch_until: float | None = None  # an active version's watch window
    baseline: dict[str, float] | None = None  # the previous version's stats at the promotion
    agreement: dict[str, Any] | None = None  # its agreement report against the version active at its load
    end_state: str = "retired"


class Versions:
    """Every resident version of every served name and the moves between its states. ``lock`` guards
    them and the runtime's maps; every method takes it where it reads or writes them."""

    def __init__(self, runtime: Runtime, settings: UpdateSettings, metrics: Any = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self.lock = threading.RLock()
        self.resident: dict[str, list[Tracked]] = {}
        self.history: dict[str, deque[ServedModel]] = {}
        self.previous: dict[str, Tracked] = {}

    def track(self, model: ServedModel) -> Tracked:
        """Take ``model`` as a resident version of its name (a new one loads beside the active one)."""
        tracked = Tracked(model)
        with self.lock:
            self.resident.setdefault(model.name, []).append(tracked)
            self.publish(model.name)
        return tracked

    def find(self, name: str, model: ServedModel | None) -> Tracked | None:
        return next((t for t in self.resident.get(name, []) if t.model is model), None)

    def version(self, name: str, version: str) -> Tracked:
        """A resident version by version_id (the most recent of that digest) or serial."""
        with self.lock:
            found = [t for t in self.resident.get(name, [])
                     if version in (t.model.version_id, str(t.model.serial))]
        if not found:
            raise ApiError("model_not_found", f"{name!r} has no resident version {version!r}")
        return found[-1]

    def publish(self, name: str) -> None:
        """Runtime.versions for ``name`` from what is resident and recently released (lock held)."""
        versions = tuple(t.model for t in self.resident.get(name, [])) + tuple(self.history.get(name, ()))
        self.runtime.versions = {**self.runtime.versions, name: versions}

    def switch(self, tracked: Tracked, rollback_reason: str | None = None) -> ServedModel | None:
        """Point the name at ``tracked``, not its active version (one replacement of the map); the old
        version drains, kept for a rollback unless this is one. Returns the old version, if any."""
        new = tracked.model
        name = new.name
        now = time.monotonic()
        with self.lock:
            old = self.runtime.models.get(name)
            new.version_state = "active"
            new.reason = None  # a held version's reason ends with its promotion
            new.activated_at = time.time()
            self.runtime.set_active(new)
            self.runtime.pin(new)
            old_tracked = self.find(name, old)
            before = self.previous.get(name)
            if before is not None and before is not old_tracked and before.model.version_state == "standby":
                before.hold_until = now  # a version two swaps back: released at the next tick
            if old_tracked is not None:
                if rollback_reason is None:
                    self.previous[name] = old_tracked
                    tracked.baseline = old.stats.snapshot() if old is not None else None
                    tracked.watch_until = now + self.settings.watch_seconds if self.settings.watch_seconds else None
                else:
                    self.previous.pop(name, None)
                    old_tracked.end_state = "failed"
                    assert old is not None
                    old.reason = f"rolled back: {rollback_reason}"
                self.start_drain(old_tracked, hold=rollback_reason is None and self.settings.watch_seconds > 0)
            self.publish(name)
        return old

    def start_drain(self, tracked: Tracked, hold: bool) -> None:
        """No new work reaches the version (its name points elsewhere); what it holds finishes."""
        model = tracked.model
        now = time.monotonic()
        if model.status != "ready":  # never served (failed at start): nothing to drain
            tracked.drain_deadline = now
        else:
            tracked.drain_deadline = now + self.settings.drain_seconds
        model.version_state = "draining"
        tracked.drain_started = now
        tracked.hold_until = now + self.settings.watch_seconds if hold else None

    @staticmethod
    def drained(model: ServedModel) -> bool:
        """No request holds the version and its executor has nothing queued or running."""
        if model.leases > 0:
            return False
        executor = model.executor
        if executor is None:
            return True
        load = executor.load()
        return load.queued == 0 and load.in_flight == 0

    def observe_drain(self, tracked: Tracked, now: float) -> None:
        if self.metrics is not None and tracked.drain_started is not None:
            self.metrics.drain_duration.labels(tracked.model.name).observe(now - tracked.drain_started)
        tracked.drain_started = None

    def release(self, tracked: Tracked, end_state: str) -> None:
        """Free a version: its executor stops (anything still queued is answered 503 not_ready), its
        sessions are dropped and the heap is trimmed back to the OS."""
        model = tracked.model
        with self.lock:
            self.runtime.unpin(model)
            executor, model.executor = model.executor, None
        if executor is not None:
            executor.close(timeout=30.0)
            if self.metrics is not None:
                self.metrics.unwatch(executor)
        if self.metrics is not None and model.package is not None and model.status == "ready":
            self.metrics.forget_model_info(model)
        with self.lock:
            model.family = None
            model.session = None
            model.result_cache = None  # its outputs answer for this version only
        give_back()  # before the state says released, so whoever reads "retired" sees the memory back
        with self.lock:
            model.version_state = end_state
            model.released_at = time.time()
            versions = self.resident.get(model.name, [])
            if tracked in versions:
                versions.remove(tracked)
            self.history.setdefault(model.name, deque(maxlen=HISTORY_KEPT)).append(model)
            self.publish(model.name)
            active = self.runtime.models.get(model.name)
        if self.metrics is not None and active is not None and active.status == "ready":
            self.metrics.model_info(active)  # its labels may equal the released version's
        log.info("model %s version %s %s and released", model.name, model.version_id, end_state)

    def inactive(self) -> list[ServedModel]:
        """Resident versions that are not their name's active one (the runtime closes the active ones)."""
        with self.lock:
            return [t.model for ts in self.resident.values() for t in ts
                    if t.model is not self.runtime.models.get(t.model.name)]


__all__ = ["HISTORY_KEPT", "Tracked", "Versions"]
