"""Media decoding shared by every family that reads images or audio (Pillow, PyAV, numpy only).

Each decoder takes the bytes as sent, reads the format from the bytes themselves (never from a
file name or a declared type alone), enforces the card's limits as early as the format allows,
and raises :class:`MediaError` with a fixed reason and, when a limit was broken, that limit.
"""

from __future__ import annotations

from edge_runtime.media.errors import MediaError

__all__ = ["MediaError"]
