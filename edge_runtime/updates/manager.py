"""Replacing a served model's version while serving: load beside, verify, switch, drain, roll back.

One loader thread runs operations one at a time (a load must not starve serving: the only CPU it
takes beyond its own thread is its session's threads while it verifies), and one monitor thread
watches drains, the watch window after a promotion and, with ``--watch-models``, the models file.

A version goes loading -> verifying -> standby -> active -> draining -> retired, or ends failed
(not promoted, or rolled back). The switch is one replacement of ``Runtime.models``; a request
holds the version it resolved until it is answered, so a draining version finishes what it
accepted and is released when idle or at its drain deadline, where what is still queued is
answered not_ready (the retryable refusal), never dropped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_runtime.config import ConfigError, ModelConfig, load_models_file
from edge_runtime.errors import ApiError
from edge_runtime.loading import ServedModel, load_model
from edge_runtime.runtime import Runtime
from edge_runtime.service import serve
from edge_runtime.timing import Timing
from edge_runtime.updates.agreement import Side, compare, gate_failures, guarded, space_change
from edge_runtime.updates.identity import Change, Identity, identity, incomplete, plan
from edge_runtime.updates.memory import budget, give_back, package_need, resident_bytes
from edge_runtime.updates.sample import RecentRequests, compare_answers

log = logging.getLogger("edge_runtime.updates")

#: Operations kept for GET /admin/v1/operations/{id}; released versions kept per name for listings.
OPERATIONS_KEPT = 64
HISTORY_KEPT = 4
TICK_S = 0.05
POLICIES = ("beside", "replace")


@dataclass(frozen=True)
class UpdateSettings:
    """How swaps behave (serve flags; docs/updating-models.md)."""

    drain_seconds: float = 30.0
    # After a promotion the previous version stays resident this long, and the new one is watched:
    # past the bounds below it is rolled back automatically. 0 turns the watch off.
    watch_seconds: float = 60.0
    rollback_error_rate: float = 0.05  # new error rate minus the old one's
    rollback_p99_ratio: float = 3.0  # new p99 over the old one's
    rollback_min_requests: int = 50  # answers the new version must have given before it is judged
    memory_reserve_bytes: int = 0
    policy: str = "beside"
    watch_models_seconds: float | None = None


@dataclass
class Operation:
    """One admin or reload action, followed by GET /admin/v1/operations/{id}."""

    kind: str
    model: str | None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    state: str = "queued"  # queued, running, succeeded, failed
    reason: str | None = None
    code: str | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def step(self, text: str) -> None:
        self.steps.append({"at": time.time(), "step": text})
        log.info("%s %s: %s", self.kind, self.model or "", text)

    def fail(self, code: str, reason: str) -> None:
        self.state, self.code, self.reason = "failed", code, reason
        self.step(f"failed: {reason}")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "kind": self.kind, "model": self.model, "state": self.state,
                               "created_at": self.created_at, "steps": list(self.steps)}
        for key in ("reason", "code", "finished_at"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.result:
            out["result"] = self.result
        return out


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


class Updates:
    """Every version of every served name, and the operations that move between them."""

    def __init__(self, runtime: Runtime, settings: UpdateSettings, metrics: Any = None) -> None:
        if settings.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {settings.policy!r}")
        self.runtime = runtime
        self.settings = settings
        self.metrics = metrics
        self._lock = threading.RLock()
        self._serial = itertools.count(len(runtime.models) + 1)
        self.resident: dict[str, list[Tracked]] = {}
        self.history: dict[str, deque[ServedModel]] = {}
        self.previous: dict[str, Tracked] = {}
        # models.yaml as last applied (what a reload diffs against), failed identities, waiting packages
        self.applied: dict[str, tuple[ModelConfig, Identity]] = {}
        self.failed: dict[str, Identity] = {}
        self.waiting: dict[str, str] = {}
        self.ops: OrderedDict[str, Operation] = OrderedDict()
        self._queue: queue.Queue[tuple[Operation, Callable[..., None], tuple[Any, ...]] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_poll: float | None = None
        self.recent = RecentRequests()
        self._replaying = threading.local()  # the report's own requests are not sampled

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Take the versions loaded at start as the first ones, then start the loader and monitor."""
        with self._lock:
            for name, model in self.runtime.models.items():
                self.resident[name] = [Tracked(model)]
                digest = model.package.digest if model.package is not None else None
                ident = identity(model.config, digest)
                self.applied[name] = (model.config, ident)
                if model.status == "failed":
                    self.failed[name] = ident
                self._publish(name)
        self.runtime.on_answered = self._on_answered
        if self.settings.watch_models_seconds:
            self._next_poll = time.monotonic() + self.settings.watch_models_seconds
        for target, name in ((self._load_loop, "updates-loader"), (self._monitor_loop, "updates-monitor")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop both threads (an operation in progress finishes its current step first)."""
        self._stop.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(30)
        # The runtime closes the active versions; the others' executors are closed here.
        with self._lock:
            others = [t.model for ts in self.resident.values() for t in ts
                      if t.model is not self.runtime.models.get(t.model.name)]
        for model in others:
            if model.executor is not None:
                model.executor.close(timeout=30.0)

    def _on_answered(self, model: ServedModel, surface: str, body: Any) -> None:
        """Keep a request the active version answered in its name's sample, when the entry asks for one."""
        rules = model.config.update
        if rules.sample_requests <= 0 or getattr(self._replaying, "on", False):
            return
        if self.runtime.models.get(model.name) is model:
            self.recent.record(model.name, surface, body, rules.sample_requests, rules.sample_bytes)

    def _load_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stop.is_set():
                return
            op, action, args = item
            op.state = "running"
            try:
                action(op, *args)
                if op.state == "running":
                    op.state = "succeeded"
            except ApiError as exc:
                op.fail(exc.code, str(exc))
            except Exception as exc:  # an operation's bug must not stop the loader
                log.exception("operation %s failed", op.id)
                op.fail("internal_error", f"{type(exc).__name__}: {exc}")
            finally:
                op.finished_at = time.time()
                op.done.set()

    def _monitor_loop(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.tick()
            except Exception:  # pragma: no cover - logged; the next tick tries again
                log.exception("update monitor tick failed")

    def submit(self, kind: str, model: str | None, action: Callable[..., None], *args: Any) -> Operation:
        """Queue an operation for the loader thread."""
        op = Operation(kind, model)
        with self._lock:
            self.ops[op.id] = op
            while len(self.ops) > OPERATIONS_KEPT:
                self.ops.popitem(last=False)
        self._queue.put((op, action, args))
        return op

    def operation(self, op_id: str) -> Operation | None:
        with self._lock:
            return self.ops.get(op_id)

    # -- change detection ---------------------------------------------------------------------

    def plan(self, retry_failed: bool) -> list[Change]:
        """What re-reading models.yaml would change (ConfigError when the file is not valid)."""
        wanted = load_models_file(self.runtime.config.models_file)
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
        tracked = Tracked(new)
        with self._lock:
            self.resident.setdefault(name, []).append(tracked)
            self._publish(name)
        op.step(f"loading {entry.package} (variant {entry.variant}) beside the active version")
        started, before = time.monotonic(), resident_bytes()
        load_model(new, self.metrics)
        seconds = time.monotonic() - started
        new.resident_bytes = max(0, resident_bytes() - before)
        if self.metrics is not None:
            self.metrics.load_duration.labels(name).observe(seconds)
        if new.status != "ready":
            self._release(tracked, "failed")
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
            self._publish(name)
        try:
            report = self._agreement(op, tracked)
        except Exception as exc:  # a report that cannot be made must not leave the new version behind
            log.exception("model %s: the agreement report failed", name)
            reason = f"version {new.version_id}: the agreement report failed ({type(exc).__name__}: {exc})"
            new.reason, new.reason_code = reason, "agreement"
            self._release(tracked, "failed")
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
                self._release(tracked, "failed")
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
            tracked = self._find(name, old)
            if old is None or tracked is None:
                return None
            old.status = "loading"  # /health and requests say so: not_ready, retryable
            old.reason = "being replaced (policy replace): not enough memory to load beside it"
            self._start_drain(tracked, hold=False)
        op.step(f"replace policy: {name} answers 503 until its new version is active; draining "
                f"{old.version_id} first")
        while not self._drained(old) and time.monotonic() < (tracked.drain_deadline or 0.0):
            time.sleep(TICK_S)
        self._release(tracked, "retired")
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
        """Point the name at ``tracked`` (one replacement of the map); the old version drains."""
        new = tracked.model
        name = new.name
        now = time.monotonic()
        with self._lock:
            old = self.runtime.models.get(name)
            if old is new:
                return
            new.version_state = "active"
            new.reason = None  # a held version's reason ends with its promotion
            new.activated_at = time.time()
            self.runtime.set_active(new)
            self.runtime.pin(new)
            old_tracked = self._find(name, old)
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
                self._start_drain(old_tracked, hold=rollback_reason is None and self.settings.watch_seconds > 0)
            self._publish(name)
        if self.metrics is not None:
            self.metrics.set_active_version(name, new.version_id)
            self.metrics.model_info(new)
            if rollback_reason is None:
                self._count_swap(name, "succeeded")
        op.step(f"{name} now answers with {new.version_id}"
                + (f"; {old.version_id} drains (deadline {self.settings.drain_seconds:g}s)" if old else ""))

    def _start_drain(self, tracked: Tracked, hold: bool) -> None:
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

    # -- rollback -----------------------------------------------------------------------------

    def rollback(self, name: str, reason: str = "explicit") -> Operation:
        """Queue a return to the version active before the current one."""
        with self._lock:
            if self.previous.get(name) is None:
                raise ApiError("conflict", f"{name!r} has no previous version to roll back to")
        return self.submit("rollback", name, self._rollback, name, reason, reason)

    def _rollback(self, op: Operation, name: str, reason_code: str, reason: str) -> None:
        with self._lock:
            prev = self.previous.get(name)
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
            self.previous.pop(name, None)
        self._swap(op, prev.model.config, True, self.settings.policy, False)

    def _regressed(self, tracked: Tracked) -> tuple[str, str] | None:
        """(reason code, message) when an active version in its watch window fares worse than the
        one it replaced by more than the configured bounds."""
        s, base = tracked.model.stats.snapshot(), tracked.baseline or {}
        if s["requests"] < self.settings.rollback_min_requests:
            return None
        if s["error_rate"] - base.get("error_rate", 0.0) > self.settings.rollback_error_rate:
            return "error_rate", (f"error rate {s['error_rate']:.3f} against {base.get('error_rate', 0.0):.3f} "
                                  f"(bound +{self.settings.rollback_error_rate:g})")
        judged = base.get("requests", 0) >= self.settings.rollback_min_requests and base.get("p99", 0.0) > 0
        if judged and s["p99"] > self.settings.rollback_p99_ratio * base["p99"]:
            return "p99", (f"p99 {s['p99'] * 1000:.1f} ms against {base['p99'] * 1000:.1f} ms "
                           f"(bound {self.settings.rollback_p99_ratio:g}x)")
        return None

    # -- draining and release -----------------------------------------------------------------

    def tick(self) -> None:
        """Finish drains, release held versions, judge watched ones, poll models.yaml."""
        now = time.monotonic()
        to_release: list[Tracked] = []
        rollbacks: list[tuple[str, str, str]] = []
        with self._lock:
            for name, versions in self.resident.items():
                active = self.runtime.models.get(name)
                for tracked in versions:
                    model = tracked.model
                    if model.version_state == "draining":
                        if self._drained(model):
                            self._observe_drain(tracked, now)
                            if tracked.hold_until is not None and now < tracked.hold_until:
                                model.version_state = "standby"  # drained; kept for a rollback
                                self._publish(name)
                            else:
                                to_release.append(tracked)
                        elif tracked.drain_deadline is not None and now >= tracked.drain_deadline:
                            log.warning("model %s version %s: drain deadline reached with %d requests held; "
                                        "what is queued is answered 503", name, model.version_id, model.leases)
                            self._observe_drain(tracked, now)
                            if self.metrics is not None:
                                self.metrics.drain_timeouts.labels(name).inc()
                            to_release.append(tracked)
                    elif (model.version_state == "standby" and model is not active
                          and tracked.hold_until is not None and now >= tracked.hold_until):
                        to_release.append(tracked)
                    elif model is active and tracked.watch_until is not None:
                        if now >= tracked.watch_until:
                            tracked.watch_until = None
                        else:
                            found = self._regressed(tracked)
                            if found is not None:
                                tracked.watch_until = None
                                rollbacks.append((name, *found))
        for tracked in to_release:
            self._release(tracked, tracked.end_state)
        for name, code, message in rollbacks:
            log.warning("model %s: rolling back automatically: %s", name, message)
            try:
                self.rollback(name, code).result = {"automatic": True, "reason": message}
            except ApiError as exc:
                log.error("model %s: cannot roll back: %s", name, exc)
        if self._next_poll is not None and now >= self._next_poll and self.settings.watch_models_seconds:
            self._next_poll = now + self.settings.watch_models_seconds
            if self._queue.empty():  # a reload already queued will see the same file
                self.reload("poll")

    def _drained(self, model: ServedModel) -> bool:
        if model.leases > 0:
            return False
        executor = model.executor
        if executor is None:
            return True
        load = executor.load()
        return load.queued == 0 and load.in_flight == 0

    def _observe_drain(self, tracked: Tracked, now: float) -> None:
        if self.metrics is not None and tracked.drain_started is not None:
            self.metrics.drain_duration.labels(tracked.model.name).observe(now - tracked.drain_started)
        tracked.drain_started = None

    def _release(self, tracked: Tracked, end_state: str) -> None:
        """Free a version: its executor stops (anything still queued is answered 503 not_ready), its
        sessions are dropped and the heap is trimmed back to the OS."""
        model = tracked.model
        with self._lock:
            self.runtime.unpin(model)
            executor, model.executor = model.executor, None
        if executor is not None:
            executor.close(timeout=30.0)
            if self.metrics is not None:
                self.metrics.unwatch(executor)
        if self.metrics is not None and model.package is not None and model.status == "ready":
            self.metrics.forget_model_info(model)
        with self._lock:
            model.family = None
            model.session = None
        give_back()  # before the state says released, so whoever reads "retired" sees the memory back
        with self._lock:
            model.version_state = end_state
            model.released_at = time.time()
            versions = self.resident.get(model.name, [])
            if tracked in versions:
                versions.remove(tracked)
            self.history.setdefault(model.name, deque(maxlen=HISTORY_KEPT)).append(model)
            self._publish(model.name)
            active = self.runtime.models.get(model.name)
        if self.metrics is not None and active is not None and active.status == "ready":
            self.metrics.model_info(active)  # its labels may equal the released version's
        log.info("model %s version %s %s and released", model.name, model.version_id, end_state)

    # -- removal and unloading ----------------------------------------------------------------

    def _remove(self, op: Operation, name: str) -> None:
        """models.yaml no longer lists ``name``: stop serving it, drain and release every version."""
        with self._lock:
            self.runtime.remove(name)
            self.recent.forget(name)
            self.applied.pop(name, None)
            self.previous.pop(name, None)
            for tracked in self.resident.get(name, []):
                self._start_drain(tracked, hold=False)
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
                if self.previous.get(name) is tracked:
                    self.previous.pop(name)
                if tracked.model.version_state in ("standby", "loading", "verifying"):
                    tracked.hold_until = time.monotonic()
                    self._start_drain(tracked, hold=False)
            op.step(f"version {tracked.model.version_id} drains and is released")

        return self.submit("unload", name, unload)

    # -- views --------------------------------------------------------------------------------

    def _find(self, name: str, model: ServedModel | None) -> Tracked | None:
        return next((t for t in self.resident.get(name, []) if t.model is model), None)

    def _version(self, name: str, version: str) -> Tracked:
        """A resident version by version_id (the most recent of that digest) or serial."""
        with self._lock:
            found = [t for t in self.resident.get(name, [])
                     if version in (t.model.version_id, str(t.model.serial))]
        if not found:
            raise ApiError("model_not_found", f"{name!r} has no resident version {version!r}")
        return found[-1]

    def _publish(self, name: str) -> None:
        """Runtime.versions for ``name`` from what is resident and recently released (lock held)."""
        versions = tuple(t.model for t in self.resident.get(name, [])) + tuple(self.history.get(name, ()))
        self.runtime.versions = {**self.runtime.versions, name: versions}

    def describe(self) -> dict[str, Any]:
        """Every name, its versions and what waits; the admin API's GET /admin/v1/models."""
        with self._lock:
            names = sorted(set(self.resident) | set(self.runtime.models) | set(self.waiting))
            models = []
            for name in names:
                active = self.runtime.models.get(name)
                entry: dict[str, Any] = {
                    "name": name,
                    "active": active.version_id if active is not None else None,
                    "previous": self.previous[name].model.version_id if name in self.previous else None,
                    "versions": [self._version_view(t) for t in self.resident.get(name, [])]
                    + [m.version() for m in self.history.get(name, ())],
                }
                if name in self.waiting:
                    entry["waiting"] = self.waiting[name]
                models.append(entry)
        return {"models": models, "policy": self.settings.policy,
                "watch_models_seconds": self.settings.watch_models_seconds}

    def _version_view(self, tracked: Tracked) -> dict[str, Any]:
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
