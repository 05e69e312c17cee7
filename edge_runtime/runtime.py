"""The served models: loading, self-check, lifecycle states, and running one surface request on one model."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime import API_VERSION
from edge_runtime.config import ModelConfig, ServeConfig
from edge_runtime.engine.executor import INLINE_FORWARD_MAX_S
from edge_runtime.engine import (
    DeadlineExceeded,
    ExecutorClosed,
    ForwardError,
    ModelExecutor,
    Overloaded,
    RequestTooLarge,
    create_session,
    probe_grouping,
)
from edge_runtime.errors import ApiError, ItemError
from edge_runtime.families.base import ModelFamily, Plan
from edge_runtime.packages import Package, PackageError, read_package
from edge_runtime.timing import Timing
from edge_runtime.work import WorkPool

log = logging.getLogger("edge_runtime")

# Golden outputs must match the recording within this, per device class (contract: CPU 1e-3).
GOLDEN_TOLERANCE = {"cpu": 1e-3, "cuda": 0.02}
PROBE_LENGTHS = (3, 9, 9, 17, 40, 130)


@dataclass
class ServedModel:
    """One entry of models.yaml and everything loaded for it."""

    config: ModelConfig
    status: str = "loading"
    reason: str | None = None
    package: Package | None = None
    family: ModelFamily | None = None
    session: Any = None
    executor: ModelExecutor | None = None
    grouping: str | None = None
    numerics: str = "exact"
    self_check: dict[str, Any] = field(default_factory=lambda: {"status": "unverified"})

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def surfaces(self) -> frozenset[str]:
        if self.package is None:
            return frozenset()
        return frozenset(self.package.card.surfaces)

    def dtype(self) -> str:
        assert self.package is not None
        return self.package.card.variants[self.config.variant].dtype

    def device(self) -> str:
        return getattr(self.session, "device", self.config.device)

    def info(self) -> dict[str, Any]:
        """This model's entry in GET /v1/models."""
        entry: dict[str, Any] = {"id": self.name, "object": "model", "status": self.status}
        if self.reason:
            entry["reason"] = self.reason
        if self.package is not None:
            card = self.package.card
            entry.update(
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
            entry["limits"]["max_input_tokens"] = getattr(
                self.family, "max_input_tokens", entry["limits"].get("max_input_tokens")
            )
        if self.session is not None:
            entry.update(
                device=self.device(),
                engine="onnxruntime",
                engine_args={
                    **self.session.engine_args,
                    "max_queue": self.config.max_queue,
                    "grouping": self.grouping,
                },
                numerics=self.numerics,
            )
        entry["self_check"] = self.self_check
        return entry

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
            "timings": timing.milliseconds(("parse", "tokenize", "queue", "forward", "post")),
        }
        meta.update(extras)
        return meta


def _build_family(package: Package, session: Any, config: ModelConfig) -> Any:
    family = package.card.family
    if config.max_scan_tokens is not None and family != "encoder":
        raise ValueError(f"limits.max_scan_tokens applies to models that read inputs in windows; "
                         f"the {family} family does not")
    if family == "encoder":
        from edge_runtime.families.encoder import EncoderModel

        return EncoderModel(package, session, config.max_input_tokens, config.max_scan_tokens)
    if family == "sparrow":
        from edge_runtime.families.sparrow import SparrowModel

        return SparrowModel(package, session, name=config.name)
    if family == "decision-codes":
        from edge_runtime.families.decision_codes import DecisionCodesModel

        return DecisionCodesModel(package, session, name=config.name, max_input_tokens=config.max_input_tokens)
    raise PackageError("card.json", f"family {family!r} is not served by this runtime")


def self_check(session: Any, package: Package, variant: str, device: str) -> dict[str, Any]:
    """Run every golden case twice: bitwise deterministic, and within tolerance of the recording."""
    cases = package.golden(variant)
    if not cases:
        return {"status": "unverified"}
    tolerance = GOLDEN_TOLERANCE.get(device, GOLDEN_TOLERANCE["cuda"])
    worst = 0.0
    for i, case in enumerate(cases):
        names = list(case.outputs)
        first = session.run(case.feeds, names)
        second = session.run(case.feeds, names)
        for name in names:
            if not np.array_equal(first[name], second[name]):
                return {"status": "failed", "reason": f"golden case {i} output {name} is not deterministic"}
            got = np.asarray(first[name], dtype=np.float64)
            want = np.asarray(case.outputs[name], dtype=np.float64)
            if got.shape != want.shape or not np.all(np.isfinite(got)):
                return {"status": "failed", "reason": f"golden case {i} output {name} has the wrong shape or NaN"}
            worst = max(worst, float(np.max(np.abs(got - want))) if got.size else 0.0)
    if worst > tolerance:
        return {
            "status": "failed",
            "max_abs_diff": worst,
            "reason": f"golden outputs differ by {worst:.3g}, above {tolerance:g}",
        }
    return {"status": "passed", "max_abs_diff": worst, "cases": len(cases)}


class Runtime:
    """Every served model, the process's state, and the one path a surface request takes to a model."""

    def __init__(self, config: ServeConfig, metrics: Any = None) -> None:
        self.config = config
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {m.name: ServedModel(m) for m in config.models}
        self.started = False
        self.draining = False
        self.work = WorkPool()

    # -- loading ------------------------------------------------------------------------------

    def load_all(self) -> None:
        """Load, self-check and probe every model in turn (called off the event loop)."""
        self.started = True
        for model in self.models.values():
            self._load(model)
            if self.metrics is not None:
                self.metrics.set_ready(self.status() == "ready")

    def _load(self, model: ServedModel) -> None:
        cfg = model.config
        started = time.perf_counter()
        try:
            model.status = "loading"
            package = read_package(cfg.package)
            if cfg.variant not in package.card.variants:
                raise PackageError(
                    "card.json",
                    f"variant {cfg.variant!r} is not in the package (it has {sorted(package.card.variants)})",
                )
            model.package = package
            model.session = create_session(package.graph(cfg.variant), cfg.device, cfg.threads)
            model.family = _build_family(package, model.session, cfg)
            model.status = "warming"
            if hasattr(model.family, "warm"):
                model.family.warm()
            model.self_check = self_check(model.session, package, cfg.variant, model.session.device)
            if model.self_check["status"] == "failed":
                raise RuntimeError(f"self-check failed: {model.self_check['reason']}")
            model.grouping, model.numerics = self._grouping(model)
            model.executor = ModelExecutor(
                model.name, model.family.forward, model.grouping, cfg.max_queue, metrics=self.metrics,
                inline_max_s=INLINE_FORWARD_MAX_S,  # sub-millisecond forwards skip the thread hand-off
            )
            model.status = "ready"
            if self.metrics is not None:
                self.metrics.model_info(model)
            log.info("model %s ready in %.2fs (%s, grouping %s)", model.name,
                     time.perf_counter() - started, model.session.device, model.grouping)
        except Exception as exc:  # one failed model leaves the others serving
            model.status = "failed"
            model.reason = str(exc) or type(exc).__name__
            log.error("model %s failed: %s", model.name, model.reason)

    def _grouping(self, model: ServedModel) -> tuple[str, str]:
        """Which rows may share a forward, and whether that keeps answers exact."""
        family = model.family
        if not getattr(family, "batchable", True):
            return "alone", "exact"
        max_tokens = int(getattr(family, "max_input_tokens", 512))
        lengths = tuple(min(n, max_tokens) for n in PROBE_LENGTHS)
        proven = probe_grouping(family.forward, family.probe_row, lengths=lengths)
        if model.config.batching == "padded" and proven != "padded":
            return "padded", "approximate"
        return proven, "exact"

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
        models = []
        for m in self.models.values():
            entry: dict[str, Any] = {"name": m.name, "status": m.status}
            if m.reason:
                entry["reason"] = m.reason
            models.append(entry)
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
        self.close_executors()
        self.work.close()

    # -- serving ------------------------------------------------------------------------------

    def resolve(self, surface: str, name: str | None) -> ServedModel:
        """The model a request names (or the only one serving the surface); 404, 422 or 503 otherwise."""
        if name is None:
            candidates = [m for m in self.models.values() if surface in m.surfaces or m.package is None]
            if len(candidates) != 1:
                serving = sorted(m.name for m in self.models.values() if surface in m.surfaces)
                raise ApiError(400, "invalid_request", f"model is required; models serving {surface}: {serving}")
            model = candidates[0]
        else:
            found = self.models.get(name)
            if found is None:
                raise ApiError(
                    404, "model_not_found", f"model {name!r} is not served; served models: {sorted(self.models)}"
                )
            model = found
        if model.status != "ready":
            raise ApiError(503, "not_ready", f"model {model.name!r} is {model.status}"
                           + (f": {model.reason}" if model.reason else ""))
        if surface not in model.surfaces:
            raise ApiError(
                422, "unsupported_surface",
                f"model {model.name!r} does not serve {surface}; it serves {sorted(model.surfaces)}",
            )
        return model

    async def execute(
        self, model: ServedModel, plan: Plan, deadline: float | None, timing: Timing
    ) -> dict[str, Any]:
        """Run a plan's rows on the model's executor and build its body (without meta)."""
        assert model.executor is not None
        outputs: list[Any] | ItemError
        if not plan.rows:
            outputs = []
        else:
            try:
                result = await model.executor.submit(plan.rows, deadline)
            except Overloaded as exc:
                raise ApiError(429, "overloaded", f"model {model.name!r} is overloaded: {exc}") from None
            except RequestTooLarge as exc:
                raise ApiError(413, "request_too_large", f"the forward ran out of memory: {exc}") from None
            except ExecutorClosed:
                raise ApiError(503, "not_ready", f"model {model.name!r} is shutting down") from None
            except ForwardError as exc:
                raise ApiError(500, "internal_error", f"the forward failed: {exc}") from None
            except DeadlineExceeded:
                outputs = ItemError("deadline_exceeded", "options.deadline_ms passed before the input was run")
            else:
                outputs = result.outputs
                timing.add("queue", result.queue_s)
                timing.add("forward", result.forward_s)
        with timing.phase("post"):
            return await self.work.run(plan.finish, outputs)

