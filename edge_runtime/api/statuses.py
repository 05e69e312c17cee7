"""The one place that decides HTTP statuses: from an error's code, never from the code that raised it.

Requests, families and the engine raise typed errors (:class:`ApiError` with a fixed code, reason
and limit; the engine's own :class:`EngineError` kinds); the API layer asks this module for the
status, the headers and, for engine errors, the contract's code.
"""

from __future__ import annotations

from edge_runtime.engine.errors import EngineError, ExecutorClosed, ForwardError, Overloaded, RequestTooLarge
from edge_runtime.errors import ApiError, QuestionFailed
from edge_runtime.requests.validation import ShapeInvalid

#: The contract's request-level codes.
STATUS_OF: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,  # the admin API: a package path outside the allowed root
    "model_not_found": 404,
    # the admin API: a version in the wrong state, a package still being copied, a swap that does not fit
    "conflict": 409,
    "package_incomplete": 409,
    "insufficient_memory": 409,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "unsupported_surface": 422,
    "overloaded": 429,
    "internal_error": 500,
    "not_ready": 503,
}

#: Reasons whose status is not their code's: errors of HTTP itself, before any route reads the body.
STATUS_OF_REASON: dict[str, int] = {
    "route_not_found": 404,
    "method_not_allowed": 405,
    "request_timeout": 408,
}

#: A System One request fails with the status of its first failed question's error.
QUESTION_ERROR_STATUS: dict[str, int] = {
    "invalid_question": 422,
    "max_length_exceeded": 400,
    "scan_budget_exceeded": 400,
    "invalid_input": 400,
    "invalid_model_output": 500,
    "unavailable": 503,
    "deadline_exceeded": 504,
}
#: A question error the contract does not list is the server's fault.
UNLISTED_QUESTION_STATUS = 500

#: A request whose shape is wrong, as the System One standard (FastAPI) answers it.
SHAPE_INVALID_STATUS = 422

#: Under System One's vllm-sr/5.0 schema an overloaded process answers 529, as System One does.
OVERLOADED_SYSTEMONE_5 = 529

#: Retry-After seconds the contract attaches to these codes.
RETRY_AFTER: dict[str, int] = {"overloaded": 1, "not_ready": 5}

#: The contract's code for each error the engine raises on purpose (most specific first).
ENGINE_CODES: tuple[tuple[type[EngineError], str], ...] = (
    (Overloaded, "overloaded"),
    (RequestTooLarge, "request_too_large"),
    (ExecutorClosed, "not_ready"),
    (ForwardError, "internal_error"),
)


def status_of(error: ApiError) -> int:
    """The HTTP status of a request-level error."""
    if isinstance(error, QuestionFailed):
        return QUESTION_ERROR_STATUS.get(error.question_error, UNLISTED_QUESTION_STATUS)
    if isinstance(error, ShapeInvalid):
        return SHAPE_INVALID_STATUS
    if error.reason in STATUS_OF_REASON:
        return STATUS_OF_REASON[error.reason]
    return STATUS_OF[error.code]


def retry_headers(error: ApiError) -> dict[str, str]:
    """Retry-After on the codes the contract gives one (overloaded, not_ready), else nothing."""
    seconds = RETRY_AFTER.get(error.code)
    return {} if seconds is None else {"Retry-After": str(seconds)}


def as_api_error(error: ApiError | EngineError) -> ApiError:
    """An engine error as the contract's error (a closed executor is not_ready); ApiErrors as they are."""
    if isinstance(error, ApiError):
        return error
    for kind, code in ENGINE_CODES:
        if isinstance(error, kind):
            return ApiError(code, str(error))
    return ApiError("internal_error", f"the engine failed: {type(error).__name__}")
