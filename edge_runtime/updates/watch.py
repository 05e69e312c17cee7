"""The monitor: every TICK_S on its own thread, finish drains (releasing what is drained, or past its
deadline with what is still queued answered not_ready), release versions held for a rollback once their
hold ends, judge a newly promoted version in its watch window against the one it replaced (rolled back
past the configured bounds), and, with ``--watch-models``, poll models.yaml."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edge_runtime.updates.lifecycle import Tracked, Versions
from edge_runtime.updates.settings import UpdateSettings

log = logging.getLogger("edge_runtime.updates")

TICK_S = 0.05


def regressed(tracked: Tracked, settings: UpdateSettings) -> tuple[str, str] | None:
    """(reason code, message) when an active version in its watch window fares worse than the one it
    replaced by more than the configured bounds."""
    s, base = tracked.model.stats.snapshot(), tracked.baseline or {}
    if s["requests"] < settings.rollback_min_requests:
        return None
    if s["error_rate"] - base.get("error_rate", 0.0) > settings.rollback_error_rate:
        return "error_rate", (f"error rate {s['error_rate']:.3f} against {base.get('error_rate', 0.0):.3f} "
                              f"(bound +{settings.rollback_error_rate:g})")
    judged = base.get("requests", 0) >= settings.rollback_min_requests and base.get("p99", 0.0) > 0
    if judged and s["p99"] > settings.rollback_p99_ratio * base["p99"]:
        return "p99", (f"p99 {s['p99'] * 1000:.1f} ms against {base['p99'] * 1000:.1f} ms "
                       f"(bound {settings.rollback_p99_ratio:g}x)")
    return None


class Watch:
    """The monitor thread over ``versions``: ``rollback(name, code, message)`` is called for a watched
    version that regressed, ``poll()`` when the models file is due to be read again."""

    def __init__(self, versions: Versions, settings: UpdateSettings, rollback: Callable[[str, str, str], None],
                 poll: Callable[[], None]) -> None:
        self.versions = versions
        self.settings = settings
        self._rollback = rollback
        self._poll = poll
        self._next_poll: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.settings.watch_models_seconds:
            self._next_poll = time.monotonic() + self.settings.watch_models_seconds
        self._thread = threading.Thread(target=self._run, name="updates-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # pragma: no cover - logged; the next tick tries again
                log.exception("update monitor tick failed")

    def tick(self) -> None:
        """Finish drains, release held versions, judge watched ones, poll models.yaml."""
        versions = self.versions
        now = time.monotonic()
        to_release: list[Tracked] = []
        rollbacks: list[tuple[str, str, str]] = []
        with versions.lock:
            for name, resident in versions.resident.items():
                active = versions.runtime.models.get(name)
                for tracked in resident:
                    model = tracked.model
                    if model.version_state == "draining":
                        if versions.drained(model):
                            versions.observe_drain(tracked, now)
                            if tracked.hold_until is not None and now < tracked.hold_until:
                                model.version_state = "standby"  # drained; kept for a rollback
                                versions.publish(name)
                            else:
                                to_release.append(tracked)
                        elif tracked.drain_deadline is not None and now >= tracked.drain_deadline:
                            log.warning("model %s version %s: drain deadline reached with %d requests held; "
                                        "what is queued is answered 503", name, model.version_id, model.leases)
                            versions.observe_drain(tracked, now)
                            if versions.metrics is not None:
                                versions.metrics.drain_timeouts.labels(name).inc()
                            to_release.append(tracked)
                    elif (model.version_state == "standby" and model is not active
                          and tracked.hold_until is not None and now >= tracked.hold_until):
                        to_release.append(tracked)
                    elif model is active and tracked.watch_until is not None:
                        if now >= tracked.watch_until:
                            tracked.watch_until = None
                        else:
                            found = regressed(tracked, self.settings)
                            if found is not None:
                                tracked.watch_until = None
                                rollbacks.append((name, *found))
        for tracked in to_release:
            versions.release(tracked, tracked.end_state)
        for name, code, message in rollbacks:
            self._rollback(name, code, message)
        if self._next_poll is not None and now >= self._next_poll and self.settings.watch_models_seconds:
            self._next_poll = now + self.settings.watch_models_seconds
            self._poll()


__all__ = ["TICK_S", "Watch", "regressed"]
