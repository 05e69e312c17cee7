"""Replacing a served model's version while serving: what each operation does (reload models.yaml, load
beside and verify, promote, roll back, unload, remove), on the parts that do one job each.

Operations run one at a time on the loader thread (updates/operations.py); a version's moves between
its states (loading -> verifying -> standby -> active -> draining -> retired, or failed) are
updates/lifecycle.py's; the monitor thread (updates/watch.py) finishes drains and watches a promoted
version; updates/views.py lists it all for the admin API. The switch is one replacement of
``Runtime.models``; a request holds the version it resolved until it is answered, so a draining version
finishes what it accepted and is released when idle or at its drain deadline, where what is still
queued is answered not_ready (the retryable refusal), never dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_runtime.config import ConfigError, ModelConfig
from edge_runtime.errors import ApiError
from edge_runtime.loading import ServedModel, load_model
from edge_runtime.models_file import read_models
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.updates.agreement import Side, compare, gate_failures, guarded, space_change
from edge_runtime.updates.identity import Change, Identity, identity, incomplete, plan
from edge_runtime.updates.lifecycle import Tracked, Versions
from edge_runtime.updates.memory import budget, package_need, resident_bytes
from edge_runtime.updates.operations import Operation, OperationQueue
from edge_runtime.updates.sample import RecentRequests, compare_answers
from edge_runtime.updates.settings import UpdateSettings
from edge_runtime.updates.views import describe
from edge_runtime.updates.watch import TICK_S, Watch

log = logging.getLogger("edge_runtime.updates")


class Updates:
    """Every version of every served name, and the operations that move between them."""

    def __init__(self, runtime: Runtime, settings: UpdateSettings, metrics: Any = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self.versions = Versions(runtime, settings, metrics)
        self._lock = self.versions.lock
        self._serial = itertools.count(len(runtime.models) + 1)
        # models.yaml as last applied (what a reload diffs against), failed identities, waiting packages
        self.applied: dict[str, tuple[ModelConfig, Identity]] = {}
        self.failed: dict[str, Identity] = {}
        self.waiting: dict[str, str] = {}
        self.operations = OperationQueue()
        self.watch = Watch(self.versions, settings, self._rollback_automatically, self._poll)
        self.recent = RecentRequests()
        self._replaying = threading.local()  # the report's own requests are not sampled

    @property
    def resident(self) -> dict[str, list[Tracked]]:
        """Every resident version, by name."""
        return self.versions.resident

    # -- lifecycle of the manager ---------------------------------------------------------------

    def start(self) -> None:
        """Take the versions loaded at start as the first ones, then start the loader and monitor."""
        with self._lock:
            for name, model in self.runtime.models.items():
                self.versions.resident[name] = [Tracked(model)]
                digest = model.package.digest if model.package is not None else None
                ident = identity(model.config, digest)
                self.applied[name] = (model.config, ident)
                if model.status == "failed":
                    self.failed[name] = ident
                self.versions.publish(name)
        self.runtime.on_answered = self._on_answered
        self.operations.start()
        self.watch.start()

    def stop(self) -> None:
        """Stop both threads (an operation in progress finishes its current step first)."""
        self.watch.stop(30)
        self.operations.stop(30)
        # The runtime closes the active versions; the others' executors are closed here.
        for model in self.versions.inactive():
            if model.executor is not None:
                model.executor.close(timeout=30.0)

    def _on_answered(self, model: ServedModel, surface: str, body: Any) -> None:
        """Keep a request the active version answered in its name's sample, when the entry asks for one."""
        rules = model.config.update
        if rules.sample_requests <= 0 or getattr(self._replaying, "on", False):
            return
        if self.runtime.models.get(model.name) is model:
            self.recent.record(model.name, surface, body, rules.sample_requests, rules.sample_bytes)

    def submit(self, kind: str, model: str | None, action: Callable[..., None], *args: Any) -> Operation:
        """Queue an operation for the loader thread."""
        return self.operations.submit(kind, model, action, *args)

    def operation(self, op_id: str) -> Operation | None:
        return self.operations.get(op_id)

    def _poll(self) -> None:
        if self.operations.idle():  # a reload already queued will see the same file
            self.reload("poll")

    def _rollback_automatically(self, name: str, code: str, message: str) -> None:
        log.warning("model %s: rolling back automatically: %s", name, message)
        try:
            self.rollback(name, code).result = {"automatic": True, "reason": message}
        except ApiError as exc:
            log.error("model %s: cannot roll back: %s", name, exc)

    # -- change detection ---------------------------------------------------------------------

    def plan(self, retry_failed: bool) -> list[Change]:
        """What re-reading models.yaml would change (ConfigError when the file is not valid)."""
        wanted = read_models(self.runtime.config)
        with self._lock:
            return plan(dict(self.applied), wanted, dict(self.failed), retry_failed)

    def reload(self, source: str) -> Operation:
        """Re-read models.yaml and apply what changed (SIGHUP, the admin API, the poll)."""
        return self.submit("reload", None, self._reload, source)

    def _reload(self, op: Operation, source: str) -> None:
        op.step(f"reading {self.runtime.config.models_file} ({source})")
        try:
            changes = self.plan(retry_failed=source != "poll")
        except ConfigError as exc:  # a bad file changes nothing: every version keeps serving
            raise ApiError("invalid_request", f"models file not applied: {exc}") from None
        op.result["plan"] = [c.describe() for c in changes]
        failures = []
        for change in changes:
            if change.action in ("unchanged",):
                continue
            if change.action == "aliases":
                assert change.entry is not None
                with self._lock:
                    self.runtime.set_entry(change.entry)
                    self.applied[change.name] = (change.entry, identity(change.entry))
                op.step(f"{change.name}: aliases now {list(change.entry.aliases)}, update rules taken")
            elif change.action == "wait":
                with self._lock:
                    self.waiting[change.name] = change.reason or "incomplete"
                self._count_swap(change.name, "waiting")
                op.step(f"{change.name}: waiting: {change.reason}")
            elif change.action == "removed":
                self._remove(op, change.name)
            else:
                assert change.entry is not None
                sub = Operation("load", change.name)
                self._swap(sub, change.entry, promote=True, policy=self.settings.policy, from_file=True)
                op.steps.extend(sub.steps)
                if sub.state == "failed":
                    failures.append(f"{change.name}: {sub.reason}")
        if failures:
            op.fail("update_failed", "; ".join(failures))

    # -- loading beside -----------------------------------------------------------------------

    def check_memory(self, entry: ModelConfig) -> tuple[bool, dict[str, Any]]:
        """Whether ``entry``'s package fits beside what is resident, with the figures."""
        need = package_need(entry.package, entry.variant)
        room = budget(self.settings.memory_reserve_bytes)
        figures = {"need_bytes": need.bytes, "need_source": need.source, "budget_bytes": room.bytes,
                   "budget_source": room.source}
        return need.bytes <= room.bytes, figures

    def load(self, entry: ModelConfig, promote: bool = True, policy: str | None = None) -> Operation:
        """Queue a load of ``entry`` beside the name's active version (the admin API's load).

        Refused at once: a package not yet complete (409 package_incomplete), one that does not fit
        under the ``beside`` policy (409 insufficient_memory, naming the need and the budget).
        """
        policy = policy or self.settings.policy
        waiting = incomplete(entry.package)
        if waiting:
            raise ApiError("package_incomplete", waiting)
        fits, figures = self.check_memory(entry)
        if not fits and policy != "replace":
            self._count_rollback(entry.name, "memory")
            self._count_swap(entry.name, "failed")
            raise ApiError("insufficient_memory", _memory_message(entry, figures))
        return self.submit("load", entry.name, self._swap, entry, promote, policy, False)

    def _swap(self, op: Operation, entry: ModelConfig, promote: bool, policy: str, from_file: bool) -> None:
        """Load, verify and (if asked) promote a new version of ``entry.name``; the old one stays on failure."""
        name = entry.name
        waiting = incomplete(entry.package)
        if waiting:  # still being copied: waited for (a poll or the next SIGHUP looks again)
            with self._lock:
                self.waiting[name] = waiting
            self._count_swap(name, "waiting")
            op.fail("package_incomplete", waiting)
            return
        with self._lock:
            self.waiting.pop(name, None)
        fits, figures = self.check_memory(entry)
        op.result["memory"] = figures
        replaced: Tracked | None = None
        if not fits:
            if policy != "replace":
                self._not_promoted(op, name, identity(entry), "memory", _memory_message(entry, figures),
                                   "insufficient_memory")
                return
            replaced = self._replace_first(op, name)
        new = ServedModel(entry, serial=next(self._serial))
        tracked = self.versions.track(new)
        op.step(f"loading {entry.package} (variant {entry.variant}) beside the active version")
        started, before = time.monotonic(), resident_bytes()
        load_model(new, self.metrics)
        seconds = time.monotonic() - started
        new.resident_bytes = max(0, resident_bytes() - before)
        if self.metrics is not None:
            self.metrics.load_duration.labels(name).observe(seconds)
        if new.status != "ready":
            self.versions.release(tracked, "failed")
            if from_file:
                with self._lock:
                    self.applied[name] = (entry, identity(entry))
            reason = f"version {new.version_id or '?'} failed ({new.reason_code}): {new.reason}"
            self._not_promoted(op, name, identity(entry), new.reason_code or "load", reason, "update_failed")
            if replaced is not None:  # the replace policy's gap ends with the old package again
                op.step(f"reloading the replaced version {replaced.model.version_id}")
                self._swap(Operation("rollback", name), replaced.model.config, True, "replace", False)
            return
        op.step(f"version {new.version_id} verified in {seconds:.2f}s: digest, self-check "
                f"{new.self_check.get('status')} (max_abs_diff {new.self_check.get('max_abs_diff')}), "
                f"batch probe {new.grouping}; {new.resident_bytes} bytes resident")
        op.result.update(version_id=new.version_id, serial=new.serial)
        if self.metrics is not None and new.version_id is not None:
            self.metrics.resident_bytes.labels(name, new.version_id).set(new.resident_bytes)
        with self._lock:
            self.failed.pop(name, None)
            if from_file:
                self.applied[name] = (entry, identity(entry, new.package.digest if new.package else None))
            self.runtime.pin(new)
            self.versions.publish(name)
        try:
            report = self._agreement(op, tracked)
        except Exception as exc:  # a report that cannot be made must not leave the new version behind
            log.exception("model %s: the agreement report failed", name)
            reason = f"version {new.version_id}: the agreement report failed ({type(exc).__name__}: {exc})"
            new.reason, new.reason_code = reason, "agreement"
            self.versions.release(tracked, "failed")
            self._not_promoted(op, name, identity(entry, new.package.digest if new.package else None),
                               "agreement", reason, "update_failed")
            return
        if promote and report is not None:
            space = (report.get("space") or {}).get("reason")
            if space is not None and not entry.update.allow_space_change:
                with self._lock:
                    new.reason = (f"held: its output space changed ({space}); {name}@{new.version_id} reaches it "
                                  "until an explicit promote")
                self._count_swap(name, "held")
                op.result["held"] = True
                op.step(f"version {new.version_id} is standby, not promoted: {new.reason}")
                return
            failures = gate_failures(report, entry.update, skip_cosine=space is not None)
            if "sample" in report:
                failures += [f"recent requests: {f}" for f in
                             gate_failures(report["sample"], entry.update, skip_cosine=space is not None, sample=True)]
            if failures:
                reason = f"version {new.version_id} failed the agreement gate: " + "; ".join(failures)
                new.reason, new.reason_code = reason, "agreement"
                self.versions.release(tracked, "failed")
                self._not_promoted(op, name, identity(entry, new.package.digest if new.package else None),
                                   "agreement", reason, "update_failed")
                return
        if promote:
            self._promote(op, tracked)
        else:
            op.step(f"version {new.version_id} is standby: {name}@{new.version_id} reaches it until promoted")

    def _agreement(self, op: Operation, tracked: Tracked) -> dict[str, Any] | None:
        """The agreement report of a verified version against the active one (None without one to
        compare with: a first load, or the replace policy's gap), with the space guard's verdict
        for embedding and rerank models; kept on the version and in the operation's result."""
        new = tracked.model
        with self._lock:
            old = self.runtime.models.get(new.name)
        if (old is None or old is new or old.status != "ready" or old.session is None or old.package is None
                or new.session is None or new.package is None):
            return None
        report = compare(Side(old.version_id, old.package.card, old.session, old.package.golden(old.config.variant)),
                         Side(new.version_id, new.package.card, new.session, new.package.golden(new.config.variant)))
        if new.config.update.sample_requests > 0:
            report["sample"] = self._replay(old, new)
        if guarded(new.package.card):
            why = space_change(old.package.card, new.package.card, report, new.config.update)
            report["space"] = {"changed": why is not None, **({"reason": why} if why else {})}
        tracked.agreement = report
        op.result["agreement"] = report
        if self.metrics is not None:
            self.metrics.set_agreement(new.name, report)
        figures = ", ".join(f"{k} {report[k]:.4g}" for k in ("max_abs_dp", "argmax_agreement", "min_cosine",
                                                              "mean_cosine") if k in report)
        op.step(f"agreement with {old.version_id} on {report['cases']} golden cases "
                f"({report['skipped']} skipped): {figures or report.get('reason') or 'nothing compared'}")
        return report

    def _replace_first(self, op: Operation, name: str) -> Tracked | None:
        """The replace policy: take the active version out first and release it (an announced gap)."""
        with self._lock:
            old = self.runtime.models.get(name)
            tracked = self.versions.find(name, old)
            if old is None or tracked is None:
                return None
            old.status = "loading"  # /health and requests say so: not_ready, retryable
            old.reason = "being replaced (policy replace): not enough memory to load beside it"
            self.versions.start_drain(tracked, hold=False)
        op.step(f"replace policy: {name} answers 503 until its new version is active; draining "
                f"{old.version_id} first")
        while not self.versions.drained(old) and time.monotonic() < (tracked.drain_deadline or 0.0):
            time.sleep(TICK_S)
        self.versions.release(tracked, "retired")
        return tracked

    def _not_promoted(self, op: Operation, name: str, ident: Identity, reason_code: str, reason: str,
                      code: str) -> None:
        with self._lock:
            self.failed[name] = ident
            active = self.runtime.models.get(name)
        kept = f"; {active.version_id} stays active" if active is not None and active.status == "ready" else ""
        self._count_swap(name, "failed")
        self._count_rollback(name, reason_code)
        op.fail(code, reason + kept)

    # -- switching ----------------------------------------------------------------------------

    def promote(self, name: str, version: str) -> Operation:
        """Queue the promotion of a standby version (by version_id or serial)."""
        tracked = self._version(name, version)
        if tracked.model.version_state not in ("standby",):
            raise ApiError("conflict", f"version {version} of {name!r} is {tracked.model.version_state}, not standby")
        return self.submit("promote", name, self._promote, tracked)

    def _replay(self, old: ServedModel, new: ServedModel) -> dict[str, Any]:
        """Old and new answer the sampled recent requests of their name (see updates/sample.py): old
        under the plain name (still active: nothing else switches while the loader runs this), new
        as name@<version_id>."""
        pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
        failed = {"old": 0, "new": 0}
        sampled = self.recent.take(new.name)

        async def answer(surface: str, body: dict[str, Any], model: str) -> dict[str, Any]:
            return await serve(self.runtime, surface, {**body, "model": model}, Timing())

        self._replaying.on = True
        try:
            for surface, body in sampled:
                got: dict[str, dict[str, Any]] = {}
                for side, model in (("old", new.name), ("new", f"{new.name}@{new.version_id}")):
                    try:
                        got[side] = asyncio.run(answer(surface, body, model))
                    except Exception:  # an answer refused or failed: counted, never raised
                        failed[side] += 1
                if len(got) == 2:
                    pairs.append((got["old"], got["new"]))
        finally:
            self._replaying.on = False
        out = compare_answers(pairs)
        out.update(sampled=len(sampled), failed_old=failed["old"], failed_new=failed["new"])
        return out

    def _promote(self, op: Operation, tracked: Tracked, rollback_reason: str | None = None) -> None:
        """Point the name at ``tracked`` (lifecycle.Versions.switch); the old version drains."""
        new = tracked.model
        name = new.name
        with self._lock:
            if self.runtime.models.get(name) is new:
                return
            old = self.versions.switch(tracked, rollback_reason)
        if self.metrics is not None:
            self.metrics.set_active_version(name, new.version_id)
            self.metrics.model_info(new)
            if rollback_reason is None:
                self._count_swap(name, "succeeded")
        op.step(f"{name} now answers with {new.version_id}"
                + (f"; {old.version_id} drains (deadline {self.settings.drain_seconds:g}s)" if old else ""))

    # -- rollback -----------------------------------------------------------------------------

    def rollback(self, name: str, reason: str = "explicit") -> Operation:
        """Queue a return to the version active before the current one."""
        with self._lock:
            if self.versions.previous.get(name) is None:
                raise ApiError("conflict", f"{name!r} has no previous version to roll back to")
        return self.submit("rollback", name, self._rollback, name, reason, reason)

    def _rollback(self, op: Operation, name: str, reason_code: str, reason: str) -> None:
        with self._lock:
            prev = self.versions.previous.get(name)
            if prev is None:
                raise ApiError("conflict", f"{name!r} has no previous version to roll back to")
            resident = prev.model.version_state in ("standby", "draining") and prev.model.status == "ready"
            if resident:
                prev.hold_until = None
                prev.drain_deadline = prev.drain_started = None
                self._promote(op, prev, rollback_reason=reason)
        self._count_rollback(name, reason_code)
        if resident:
            return
        op.step(f"version {prev.model.version_id} was released: loading its package again")
        with self._lock:
            self.versions.previous.pop(name, None)
        self._swap(op, prev.model.config, True, self.settings.policy, False)

    # -- removal and unloading ----------------------------------------------------------------

    def _remove(self, op: Operation, name: str) -> None:
        """models.yaml no longer lists ``name``: stop serving it, drain and release every version."""
        with self._lock:
            self.runtime.remove(name)
            self.recent.forget(name)
            self.applied.pop(name, None)
            self.versions.previous.pop(name, None)
            for tracked in self.versions.resident.get(name, []):
                self.versions.start_drain(tracked, hold=False)
        if self.metrics is not None:
            self.metrics.set_active_version(name, None)
        op.step(f"{name}: removed; its versions drain and are released")

    def unload(self, name: str, version: str) -> Operation:
        """Queue the release of a version that is not active (standby, draining, or kept for rollback)."""
        tracked = self._version(name, version)
        if tracked.model is self.runtime.models.get(name):
            raise ApiError("conflict", f"version {version} is {name!r}'s active version: promote another or roll back")

        def unload(op: Operation) -> None:
            with self._lock:
                if self.versions.previous.get(name) is tracked:
                    self.versions.previous.pop(name)
                if tracked.model.version_state in ("standby", "loading", "verifying"):
                    tracked.hold_until = time.monotonic()
                    self.versions.start_drain(tracked, hold=False)
            op.step(f"version {tracked.model.version_id} drains and is released")

        return self.submit("unload", name, unload)

    # -- views --------------------------------------------------------------------------------

    def _version(self, name: str, version: str) -> Tracked:
        return self.versions.version(name, version)

    def describe(self) -> dict[str, Any]:
        """Every name, its versions and what waits; the admin API's GET /admin/v1/models."""
        return describe(self.versions, self.waiting, self.settings)

    def entry_for(self, name: str, package: Path, variant: str | None) -> ModelConfig:
        """The configured entry of ``name`` with another package (and variant): the admin API's load."""
        current = next((m for m in self.runtime.config.models if m.name == name), None)
        if current is None:
            with self._lock:
                applied = self.applied.get(name)
            if applied is None:
                raise ApiError("model_not_found", f"{name!r} is not a configured model")
            current = applied[0]
        with self._lock:
            applied = self.applied.get(name)
        # the file's update rules, not those an earlier admin load overrode
        rules = applied[0].update if applied is not None else current.update
        return dataclasses.replace(current, package=package, variant=variant or current.variant, update=rules)

    # -- metrics ------------------------------------------------------------------------------

    def _count_swap(self, name: str, result: str) -> None:
        if self.metrics is not None:
            self.metrics.swaps.labels(name, result).inc()

    def _count_rollback(self, name: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.rollbacks.labels(name, reason).inc()


def _memory_message(entry: ModelConfig, figures: dict[str, Any]) -> str:
    return (f"{entry.name}: the new version needs {figures['need_bytes']} bytes ({figures['need_source']}) "
            f"but the budget is {figures['budget_bytes']} bytes ({figures['budget_source']}); "
            "free memory, unload a standby version, or load with policy replace (a short gap)")
