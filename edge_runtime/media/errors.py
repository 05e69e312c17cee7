"""The one error media decoding raises: a fixed reason word, a message, and the broken limit."""

from __future__ import annotations

from edge_runtime.errors import ApiError


class MediaError(Exception):
    """A refused image or audio clip.

    ``reason`` is a fixed word that never carries request data (image_malformed, image_too_large,
    audio_too_long, ...); ``limit`` is the card limit that was broken, when one was.
    """

    def __init__(self, reason: str, message: str, limit: int | float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.limit = limit

    def api_error(self, where: str = "") -> ApiError:
        """The request-level invalid_request this refusal becomes, the input's place in front."""
        prefix = f"{where}: " if where else ""
        return ApiError("invalid_request", prefix + self.message, self.reason, self.limit)
