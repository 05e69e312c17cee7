"""What the admin API lists: every name, its versions (resident ones with their leases, agreement, drain
deadline and watch window; released ones as they ended) and what waits (GET /admin/v1/models)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from edge_runtime.updates.lifecycle import Tracked, Versions
from edge_runtime.updates.settings import UpdateSettings


def version_view(tracked: Tracked) -> dict[str, Any]:
    """A resident version as the admin API lists it."""
    view = tracked.model.version()
    view["leases"] = tracked.model.leases
    if tracked.agreement is not None:
        view["agreement"] = tracked.agreement
    now = time.monotonic()
    if tracked.drain_deadline is not None and tracked.model.version_state == "draining":
        view["drain_deadline_in_s"] = round(max(0.0, tracked.drain_deadline - now), 3)
    if tracked.watch_until is not None:
        view["watch_ends_in_s"] = round(max(0.0, tracked.watch_until - now), 3)
        view["watch"] = tracked.model.stats.snapshot()
    return view


def describe(versions: Versions, waiting: Mapping[str, str], settings: UpdateSettings) -> dict[str, Any]:
    """Every name, its versions and what waits; the admin API's GET /admin/v1/models."""
    with versions.lock:
        names = sorted(set(versions.resident) | set(versions.runtime.models) | set(waiting))
        models = []
        for name in names:
            active = versions.runtime.models.get(name)
            entry: dict[str, Any] = {
                "name": name,
                "active": active.version_id if active is not None else None,
                "previous": versions.previous[name].model.version_id if name in versions.previous else None,
                "versions": [version_view(t) for t in versions.resident.get(name, [])]
                + [m.version() for m in versions.history.get(name, ())],
            }
            if name in waiting:
                entry["waiting"] = waiting[name]
            models.append(entry)
    return {"models": models, "policy": settings.policy, "watch_models_seconds": settings.watch_models_seconds}


__all__ = ["describe", "version_view"]
