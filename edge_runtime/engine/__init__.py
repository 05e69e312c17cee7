"""The engine: ONNX Runtime sessions, one executor per model, admission, exact-numerics batching.

Everything but the session layer imports without onnxruntime, so api/ may import
`edge_runtime.engine.errors` (or this package) without loading ORT; the session names below
load onnxruntime on first use.
"""

from __future__ import annotations

from typing import Any

from .batching import BatchLimits, Buckets, bucket_candidates, plan_batch
from .encoder import EncoderForward
from .errors import (
    DeadlineExceeded,
    EngineError,
    ExecutorClosed,
    ForwardError,
    Overloaded,
    RequestTooLarge,
    SessionError,
    is_out_of_memory,
)
from .executor import ExecutorMetrics, JobResult, ModelExecutor
from .forward import GROUPINGS, Forward, Grouping
from .probe import ProbeResult, Trial, max_abs_diff, probe, probe_grouping

_SESSION_NAMES = ("GraphSession", "TensorSpec", "create_session", "default_threads", "cgroup_cpu_limit",
                  "cuda_available")

__all__ = [
    "BatchLimits",
    "Buckets",
    "DeadlineExceeded",
    "EncoderForward",
    "EngineError",
    "ExecutorClosed",
    "ExecutorMetrics",
    "Forward",
    "ForwardError",
    "GROUPINGS",
    "Grouping",
    "JobResult",
    "ModelExecutor",
    "Overloaded",
    "ProbeResult",
    "RequestTooLarge",
    "SessionError",
    "Trial",
    "bucket_candidates",
    "is_out_of_memory",
    "max_abs_diff",
    "plan_batch",
    "probe",
    "probe_grouping",
    *_SESSION_NAMES,
]


def __getattr__(name: str) -> Any:
    # Lazy: importing onnxruntime costs ~0.3 s and api/ must not pull it in.
    if name in _SESSION_NAMES:
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
