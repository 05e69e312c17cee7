"""Errors the engine raises; api/statuses.py gives each the contract's code and status.

This module imports neither onnxruntime nor sanic, so api/ can import it freely.

    Overloaded        -> overloaded (429)
    RequestTooLarge   -> request_too_large (413)
    DeadlineExceeded  -> deadline_exceeded, per item (the family answers it in place)
    ForwardError      -> internal_error (500)
    ExecutorClosed    -> not_ready (503)
    SessionError      -> the model fails to load (status failed, reason)
"""

from __future__ import annotations

from typing import Any

# Substrings of the messages onnxruntime (CPU BFC arena, CUDA allocator, cuBLAS) and the C++
# runtime use when an allocation fails. Matched on the message because api/ must not import
# onnxruntime, and ORT raises generic RuntimeException/Fail types for these.
_OOM_MARKERS: tuple[str, ...] = (
    "failed to allocate memory",
    "bad_alloc",
    "out of memory",
    "cublas_status_alloc_failed",
)


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class Overloaded(EngineError):
    """The model's queue (or the preparation pool's) is full, or a shared forward ran out of memory;
    the client should retry."""


class RequestTooLarge(EngineError):
    """A forward that held only this request's rows ran out of memory."""


class DeadlineExceeded(EngineError):
    """The job's deadline passed before all of its rows ran.

    `outputs` holds, per row of the job, the output of the rows that did run and None for the
    rest, so a family can answer the finished items and mark only the others deadline_exceeded.
    """

    def __init__(self, message: str = "deadline exceeded", outputs: list[Any] | None = None) -> None:
        super().__init__(message)
        self.outputs: list[Any] = outputs if outputs is not None else []


class ForwardError(EngineError):
    """The forward failed for a reason other than memory; the original exception is __cause__."""


class ExecutorClosed(EngineError):
    """The executor is shut down (or shutting down) and takes no more work."""


class SessionError(EngineError):
    """A graph could not be loaded as asked (missing file, unavailable execution provider)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """True when `exc` is an allocation failure (MemoryError, or an ORT error saying so)."""
    if isinstance(exc, MemoryError):
        return True
    message = str(exc).lower()
    return any(marker in message for marker in _OOM_MARKERS)
