"""The one error media decoding raises: a fixed reason word, a message, and the broken limit."""

from __future__ import annotations

from edge_runtime.errors import ApiError


class MediaError(ApiError):
    """A refused image, video, asset or audio clip: a 400 ``invalid_request`` with its reason.

    ``reason`` is a fixed word that never carries request data (image_malformed, image_too_large,
    video_too_long, audio_too_long, ...); ``limit`` is the card limit that was broken, when one was.
    It is an :class:`ApiError` so a family that fails the whole request may let it propagate; one
    that names the input first (embeddings: ``input[3]: ...``) uses :meth:`api_error`.
    """

    reason: str  # always set: a media refusal always has its fixed word

    def __init__(self, reason: str, message: str, limit: int | float | None = None) -> None:
        super().__init__("invalid_request", message, reason, limit)

    def api_error(self, where: str = "") -> ApiError:
        """The request-level invalid_request this refusal becomes, the input's place in front."""
        prefix = f"{where}: " if where else ""
        return ApiError("invalid_request", prefix + self.message, self.reason, self.limit)
