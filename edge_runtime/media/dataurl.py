"""data: URLs and base64 payloads, decoded with a byte limit checked before decoding."""

from __future__ import annotations

import base64
import binascii
import re

from edge_runtime.media.errors import MediaError

_DATA_URL = re.compile(r"^data:([a-z0-9.+-]+/[a-z0-9.+-]+)?((?:;[a-z0-9-]+=[^;,]*)*)(;base64)?,", re.I)


def decoded_size(b64: str) -> int:
    """Bytes a base64 text decodes to, computed without decoding (so a bomb costs nothing)."""
    n = len(b64.rstrip("="))
    return n * 3 // 4


# Characters decoded per call (a multiple of 4): one call of binascii holds the GIL throughout,
# 44 ms for a 7 MB image at once, so a large payload is decoded a piece at a time.
_B64_STEP = 1 << 19


def _b64decode(data: str) -> bytes:
    """``base64.b64decode(data, validate=True)``, a piece at a time; raises binascii.Error or ValueError."""
    if len(data) <= _B64_STEP:
        return base64.b64decode(data, validate=True)
    parts = []
    for at in range(0, len(data), _B64_STEP):
        piece = data[at : at + _B64_STEP]
        if "=" in piece and at + _B64_STEP < len(data):
            raise binascii.Error("padding before the end of the data")  # strict mode refuses it too
        parts.append(binascii.a2b_base64(piece, strict_mode=True))
    return b"".join(parts)


def b64_bytes(data: str, max_bytes: int, kind: str) -> bytes:
    """Decode base64 ``data`` (whitespace refused) after checking its decoded size against max_bytes."""
    if decoded_size(data) > max_bytes:
        raise MediaError(f"{kind}_too_large", f"the {kind} is larger than {max_bytes} bytes", max_bytes)
    try:
        raw = _b64decode(data)
    except (binascii.Error, ValueError):
        raise MediaError(f"{kind}_malformed", f"the {kind} is not valid base64") from None
    if not raw:
        raise MediaError(f"{kind}_malformed", f"the {kind} is empty")
    return raw


def parse_data_url(url: object, max_bytes: int, kind: str) -> tuple[str | None, bytes]:
    """(declared media type or None, bytes) of a base64 data URL; remote URLs are refused.

    The runtime never fetches anything (edge nodes must not phone out), so only data: URLs are read.
    """
    if not isinstance(url, str):
        raise MediaError(f"{kind}_malformed", f"the {kind} must be a base64 data: URL string")
    if not url.startswith("data:"):
        raise MediaError(f"{kind}_url_unsupported",
                         f"the {kind} must be a base64 data: URL; remote URLs are not fetched")
    m = _DATA_URL.match(url)
    if m is None or not m.group(3):
        raise MediaError(f"{kind}_malformed", f"the {kind} data URL must be base64 (data:<type>;base64,...)")
    mime = m.group(1).lower() if m.group(1) else None
    return mime, b64_bytes(url[m.end():], max_bytes, kind)
