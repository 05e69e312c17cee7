"""Loading one served model: read its package, build its family, warm it, self-check its golden
outputs and probe which rows may share a forward. One failed model leaves the others serving."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_runtime.config import ModelConfig
from edge_runtime.engine import GraphSession, Grouping, ModelExecutor, create_session, probe_grouping
from edge_runtime.engine.executor import INLINE_FORWARD_MAX_S
from edge_runtime.families.base import ModelFamily
from edge_runtime.families.registry import build_family
from edge_runtime.packages import Package, PackageError, read_package
from edge_runtime.timing import Timing

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
    session: GraphSession | None = None
    executor: ModelExecutor | None = None
    grouping: Grouping | None = None
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
        return self.config.device if self.session is None else self.session.device

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
            entry["limits"]["max_input_tokens"] = self.family.max_input_tokens
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


def load_model(model: ServedModel, metrics: Any = None) -> None:
    """Read, build, warm, self-check and probe one model; a failure marks it failed with its reason."""
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
        model.session = create_session(package.graph(cfg.variant), cfg.device, cfg.threads, cfg.spinning)
        model.family = build_family(package, model.session, cfg)
        model.status = "warming"
        model.family.warm()
        model.self_check = self_check(model.session, package, cfg.variant, model.session.device)
        if model.self_check["status"] == "failed":
            raise RuntimeError(f"self-check failed: {model.self_check['reason']}")
        model.grouping, model.numerics = grouping(model)
        model.executor = ModelExecutor(
            model.name, model.family.forward, model.grouping, cfg.max_queue, metrics=metrics,
            inline_max_s=INLINE_FORWARD_MAX_S,  # sub-millisecond forwards skip the thread hand-off
        )
        model.status = "ready"
        if metrics is not None:
            metrics.model_info(model)
        log.info("model %s ready in %.2fs (%s, grouping %s)", model.name,
                 time.perf_counter() - started, model.session.device, model.grouping)
    except Exception as exc:  # one failed model leaves the others serving
        model.status = "failed"
        model.reason = str(exc) or type(exc).__name__
        log.error("model %s failed: %s", model.name, model.reason)

def grouping(model: ServedModel) -> tuple[Grouping, str]:
    """Which rows may share a forward, and whether that keeps answers exact."""
    family = model.family
    assert family is not None
    if not family.batchable:
        return "alone", "exact"
    max_tokens = family.max_input_tokens
    lengths = tuple(min(n, max_tokens) for n in PROBE_LENGTHS)
    proven = probe_grouping(family.forward, family.probe_row, lengths=lengths)
    if model.config.batching == "padded" and proven != "padded":
        return "padded", "approximate"
    return proven, "exact"
