"""Errors in the contract's shape.

A request that cannot be served at all raises :class:`ApiError`; the API layer turns it into
``{"error": {"code", "message", "reason"?, "limit"?}}`` with the status its code maps to
(edge_runtime.api.statuses: no other module picks a status). A failed item (one input, one
document) is an :class:`ItemError` answered in place, and never fails its siblings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """A request-level failure: a fixed code, a human message, an optional fixed reason and limit."""

    def __init__(
        self,
        code: str,
        message: str,
        reason: str | None = None,
        limit: int | float | None = None,
    ) -> None:
        super().__init__(message)
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


def invalid_request(message: str, reason: str | None = None) -> ApiError:
    """The contract's invalid_request (400)."""
    return ApiError("invalid_request", message, reason)


@dataclass(frozen=True)
class ItemError:
    """A failed item, answered in place: ``{"code", "message"}``."""

    code: str
    message: str

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


#: The code of a System One request any of whose questions failed.
QUESTION_FAILED = "question_failed"


@dataclass(frozen=True)
class FailedQuestion:
    """One question answered with an error: where it is, its type as sent, and its error."""

    state: str | None
    question: str
    type: str | None
    error: str
    reason: str
    message: str

    @property
    def where(self) -> str:
        return self.question if self.state is None else f"{self.state}.{self.question}"


class QuestionFailed(ApiError):
    """A System One request with a failed question: ``question_failed``, decided by the first one.

    Its status follows the first failed question's error (``question_error``).
    """

    def __init__(self, failed: Sequence[FailedQuestion]) -> None:
        if not failed:
            raise ValueError("QuestionFailed needs at least one failed question")
        first = failed[0]
        parts = [f"{f.where} ({f.error}, {f.reason}): {f.message}" for f in failed]
        noun = "question" if len(failed) == 1 else "questions"
        super().__init__(QUESTION_FAILED, f"{len(failed)} {noun} failed: " + "; ".join(parts), reason=first.reason)
        self.failed = tuple(failed)
        self.question_error = first.error
        self.question = first.question
        self.state = first.state

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "question_error": self.question_error,
                                 "reason": self.reason, "question": self.question}
        if self.state is not None:
            error["state"] = self.state
        error["message"] = self.message
        return {"error": error}
