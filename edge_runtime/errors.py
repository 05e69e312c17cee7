"""Errors in the contract's shape.

A request that cannot be served at all raises :class:`ApiError`; the API layer turns it into
``{"error": {"code", "message", "reason"?, "limit"?}}`` with its status. A failed item (one input,
one document) is an :class:`ItemError` answered in place, and never fails its siblings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The contract's request-level codes and their statuses, in one place.
STATUS_OF: dict[str, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "model_not_found": 404,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "unsupported_surface": 422,
    "overloaded": 429,
    "internal_error": 500,
    "not_ready": 503,
}

# Retry-After seconds the contract attaches to these codes.
RETRY_AFTER: dict[str, int] = {"overloaded": 1, "not_ready": 5}


class ApiError(Exception):
    """A request-level failure: HTTP status, fixed code, human message, optional reason and limit."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        reason: str | None = None,
        limit: int | float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.reason = reason
        self.limit = limit

    def body(self) -> dict[str, Any]:
        """The error body, without the members that are not set."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason is not None:
            error["reason"] = self.reason
        if self.limit is not None:
            error["limit"] = self.limit
        return {"error": error}

    @property
    def retry_after(self) -> int | None:
        """Seconds for the Retry-After header, where the contract asks for one."""
        return RETRY_AFTER.get(self.code)

    def headers(self) -> dict[str, str]:
        """The response headers this error carries (Retry-After on overloaded and not_ready)."""
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def invalid_request(message: str, reason: str | None = None) -> ApiError:
    """400 invalid_request."""
    return ApiError(400, "invalid_request", message, reason)


@dataclass(frozen=True)
class ItemError:
    """A failed item, answered in place: ``{"code", "message"}``."""

    code: str
    message: str

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}
