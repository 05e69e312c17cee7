"""Request bodies: the size limit, Content-Encoding, JSON and multipart/form-data.

Pure functions over bytes (and coroutines over a stream of chunks); no Sanic, no models. Where the
work runs is the caller's choice: :func:`decode_small` decodes only what is cheap to decode on the spot.

The size limit applies twice: to the body as sent (Content-Length first, then the bytes as they
arrive, never holding more than the limit) and to the body once decoded. Decoding is incremental
and stops as soon as its output passes the limit, so a small compressed body that inflates to
gigabytes costs about the limit in memory, not what it would inflate to.

Every failure raises :class:`edge_runtime.errors.ApiError` in the contract's words:
413 request_too_large (with ``limit``), 415 unsupported_media_type, and 400 invalid_request
(``reason`` encoding_malformed for a truncated or corrupt compressed body).
"""

from __future__ import annotations

import base64
import re
import zlib
from collections.abc import AsyncIterator
from email import policy
from email.parser import BytesHeaderParser, HeaderParser
from typing import Any

import orjson
import zstandard

from edge_runtime.errors import ApiError
from edge_runtime.requests.validation import JsonInvalid

#: Containers (objects and arrays) a JSON body may nest; a deeper one is refused.
MAX_JSON_DEPTH = 64
#: The largest zstd window accepted (RFC 8878 section 3.1.1.1.2 recommends 8 MiB for HTTP).
ZSTD_MAX_WINDOW = 8 << 20
#: The Content-Encoding values accepted, each naming one decoder.
CODINGS: dict[str, str] = {"gzip": "gzip", "x-gzip": "gzip", "zstd": "zstd"}

ENCODING_MALFORMED = "encoding_malformed"
ENCODING_UNSUPPORTED = "encoding_unsupported"
ZSTD_WINDOW_TOO_LARGE = "zstd_window_too_large"
BODY_TOO_LARGE = "body_too_large"
DECODED_BODY_TOO_LARGE = "decoded_body_too_large"

# Most decoded bytes one decompression step may return; the overshoot past the limit is at most this.
_OUT_STEP = 64 << 10
# Compressed bytes fed to zlib per step, so that its unconsumed tail (a copy) stays small.
_GZIP_IN_STEP = 64 << 10
# zstandard's decompressobj has no output cap, so the input is fed in small steps instead: a zstd
# block regenerates at most 128 KiB and takes at least 4 bytes (an RLE block: 3 header bytes and
# 1 byte), so 64 compressed bytes decode to at most 17 blocks, about 2 MiB per step.
_ZSTD_IN_STEP = 64
_ZSTD_WRITE_SIZE = 32 << 10
_ZSTD_CONTENTSIZE_UNKNOWN = 2**64 - 1
_ZSTD_SKIPPABLE_MAGIC = 0x184D2A50  # to 0x184D2A5F
_ZSTD_HEADER_MAX = 18  # magic number and the longest frame header (RFC 8878 section 3.1.1)
# Integers orjson keeps exact: int64 and uint64. It reads a longer integer literal as a float.
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
# Digits become b"0", every other byte stays (none of them is b"0"): a run of 19 digits is then a
# plain substring search. The regex search for it held the GIL 360 ms on an 8 MiB body (every
# /health/live waited); translate and find take about 10 ms each.
_DIGITS_AS_ZEROS = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_DIGIT_RUN = b"0" * 19
# A JSON string, or a number: scanned only in a body already known to be valid JSON.
_JSON_STRING_OR_NUMBER = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?')
_MULTIPART = "multipart/form-data"


# ---- Content-Encoding ----------------------------------------------------------------------


def content_coding(content_encoding: str | None) -> str:
    """The decoder a Content-Encoding header names: ``identity``, ``gzip`` or ``zstd``.

    Absent, empty or ``identity`` is identity. Raises 415 unsupported_media_type for any other
    coding and for more than one layer (``gzip, zstd``).
    """
    if content_encoding is None:
        return "identity"
    # A list header: empty elements are allowed, and identity is no layer at all.
    layers = [c.strip().lower() for c in content_encoding.split(",")]
    layers = [c for c in layers if c and c != "identity"]
    if not layers:
        return "identity"
    shown = _shown(content_encoding)
    if len(layers) > 1:
        raise ApiError(
            "unsupported_media_type",
            f"Content-Encoding {shown} has {len(layers)} layers; send at most one layer of gzip or zstd",
            reason=ENCODING_UNSUPPORTED,
        )
    coding = CODINGS.get(layers[0])
    if coding is None:
        raise ApiError(
            "unsupported_media_type",
            f"Content-Encoding {shown} is not supported; send gzip, x-gzip, zstd or no encoding",
            reason=ENCODING_UNSUPPORTED,
        )
    return coding


def _shown(value: str, width: int = 64) -> str:
    """A header value quoted for a message, cut so a huge header is not echoed back."""
    return repr(value if len(value) <= width else value[:width] + "...")


# ---- size limits and decoding --------------------------------------------------------------


def _too_large_as_sent(max_bytes: int, size: int | None = None) -> ApiError:
    told = f"of {size} bytes " if size is not None else ""
    return ApiError(
        "request_too_large",
        f"the request body {told}is larger than the limit of {max_bytes} bytes",
        reason=BODY_TOO_LARGE, limit=max_bytes,
    )


def _too_large_decoded(max_bytes: int, coding: str) -> ApiError:
    return ApiError(
        "request_too_large",
        f"the {coding} request body is larger than the limit of {max_bytes} bytes once decoded",
        reason=DECODED_BODY_TOO_LARGE, limit=max_bytes,
    )


def _malformed(message: str) -> ApiError:
    return ApiError("invalid_request", message, reason=ENCODING_MALFORMED)


def decode_body(raw: bytes, content_encoding: str | None, max_bytes: int) -> bytes:
    """The body as the client meant it: `raw` decoded per its Content-Encoding, within `max_bytes`.

    Raises 413 request_too_large (limit = max_bytes) when `raw` or its decoded form is larger
    than `max_bytes`, 415 unsupported_media_type for an unsupported coding or zstd window, and
    400 invalid_request (reason encoding_malformed) for a truncated or corrupt stream.
    """
    coding = content_coding(content_encoding)
    if len(raw) > max_bytes:
        raise _too_large_as_sent(max_bytes, len(raw))
    if coding == "gzip":
        return _gunzip(raw, max_bytes)
    if coding == "zstd":
        return _unzstd(raw, max_bytes)
    return bytes(raw)


async def read_body(
    stream: AsyncIterator[bytes],
    content_length: int | None,
    content_encoding: str | None,
    max_bytes: int,
) -> bytes:
    """Read a body from `stream` chunk by chunk and decode it (see :func:`read_raw_body` and
    :func:`decode_body`)."""
    raw = await read_raw_body(stream, content_length, content_encoding, max_bytes)
    return decode_body(raw, content_encoding, max_bytes)


async def read_raw_body(
    stream: AsyncIterator[bytes],
    content_length: int | None,
    content_encoding: str | None,
    max_bytes: int,
) -> bytes:
    """Read a body from `stream` chunk by chunk, as sent (still encoded).

    The coding and Content-Length are checked before any byte is read; while reading, a chunk
    that would take the body past `max_bytes` is refused before it is kept.
    """
    content_coding(content_encoding)  # a 415 needs no body
    if content_length is not None:
        if content_length < 0:
            raise ApiError("invalid_request", "Content-Length must not be negative")
        if content_length > max_bytes:
            raise _too_large_as_sent(max_bytes, content_length)
    chunks: list[bytes] = []
    size = 0
    async for chunk in stream:
        size += len(chunk)
        if size > max_bytes:
            raise _too_large_as_sent(max_bytes)
        if chunk:
            chunks.append(bytes(chunk))
    if content_length is not None and size != content_length:
        raise ApiError(
            "invalid_request", f"the body has {size} bytes but Content-Length says {content_length}"
        )
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode_small(raw: bytes, content_encoding: str | None, max_bytes: int, small_bytes: int) -> bytes | None:
    """The decoded body when decoding it is small work, else None (then :func:`decode_body` it elsewhere).

    An identity body is returned as it is. A compressed body is decoded here only when it is at
    most `small_bytes` as sent and once decoded: decoding stops as soon as its output passes
    `small_bytes`, so a small body that inflates to megabytes costs about `small_bytes` of work
    here before None hands it on. Errors found before that point are raised as decode_body raises them.
    """
    coding = content_coding(content_encoding)
    if len(raw) > max_bytes:
        raise _too_large_as_sent(max_bytes, len(raw))
    if coding == "identity":
        return raw
    if len(raw) > small_bytes:
        return None
    cap = min(small_bytes, max_bytes)
    try:
        return _gunzip(raw, cap) if coding == "gzip" else _unzstd(raw, cap)
    except ApiError as exc:
        if exc.reason == DECODED_BODY_TOO_LARGE and cap < max_bytes:
            return None  # larger than small, maybe within the limit: the caller decodes it whole
        raise


def _gunzip(raw: bytes, max_bytes: int) -> bytes:
    """One gzip layer (RFC 1952, members in sequence), stopping once past `max_bytes`."""
    out = bytearray()
    view = memoryview(raw)
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    pos = 0
    pending: bytes | memoryview = b""
    try:
        while True:
            if not pending:
                if pos >= len(view):
                    break
                pending, pos = view[pos : pos + _GZIP_IN_STEP], pos + _GZIP_IN_STEP
            if decoder.eof:
                # The previous member ended; what follows must be another member.
                decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            piece = decoder.decompress(pending, _OUT_STEP)
            if len(out) + len(piece) > max_bytes:
                raise _too_large_decoded(max_bytes, "gzip")
            out += piece
            pending = decoder.unused_data if decoder.eof else decoder.unconsumed_tail
            if not pending and len(piece) == _OUT_STEP and not decoder.eof:
                # Input consumed but the output cap was hit: zlib may still hold output.
                while not decoder.eof:
                    piece = decoder.decompress(b"", _OUT_STEP)
                    if not piece:
                        break
                    if len(out) + len(piece) > max_bytes:
                        raise _too_large_decoded(max_bytes, "gzip")
                    out += piece
    except zlib.error as exc:
        raise _malformed(f"the gzip body is corrupt: {exc}") from None
    if not decoder.eof:
        raise _malformed("the gzip body is truncated")
    return bytes(out)


def _unzstd(raw: bytes, max_bytes: int) -> bytes:
    """Zstandard frames (RFC 8878) in sequence, each window at most 8 MiB, stopping once past `max_bytes`."""
    if not raw:
        raise _malformed("the zstd body is empty")
    dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
    out = bytearray()
    view = memoryview(raw)
    pos = 0
    while pos < len(view):
        _check_zstd_frame(view[pos : pos + _ZSTD_HEADER_MAX], max_bytes - len(out), max_bytes)
        frame = dctx.decompressobj(write_size=_ZSTD_WRITE_SIZE)
        while not frame.eof:
            if pos >= len(view):
                raise _malformed("the zstd body is truncated")
            piece = view[pos : pos + _ZSTD_IN_STEP]
            pos += len(piece)
            try:
                decoded = frame.decompress(piece)
            except zstandard.ZstdError as exc:
                raise _malformed(f"the zstd body is corrupt: {exc}") from None
            if len(out) + len(decoded) > max_bytes:
                raise _too_large_decoded(max_bytes, "zstd")
            out += decoded
        # The frame ended inside the last piece; what is left of that piece starts the next frame.
        pos -= len(frame.unused_data)
    return bytes(out)


def _check_zstd_frame(header: memoryview, room: int, max_bytes: int) -> None:
    """Refuse a frame by its header: a window over 8 MiB, a dictionary, or a declared size past `room`."""
    if len(header) >= 4 and int.from_bytes(header[:4], "little") & ~0xF == _ZSTD_SKIPPABLE_MAGIC:
        return  # a skippable frame holds no content; libzstd steps over it
    try:
        params = zstandard.get_frame_parameters(header)
    except zstandard.ZstdError as exc:
        raise _malformed(f"the zstd body is not a zstd frame: {exc}") from None
    if params.window_size > ZSTD_MAX_WINDOW:
        raise ApiError(
            "unsupported_media_type",
            f"the zstd frame needs a {params.window_size}-byte window; at most {ZSTD_MAX_WINDOW} is accepted",
            reason=ZSTD_WINDOW_TOO_LARGE, limit=ZSTD_MAX_WINDOW,
        )
    if params.dict_id:
        raise ApiError(
            "unsupported_media_type", "zstd frames compressed with a dictionary are not supported",
            reason=ENCODING_UNSUPPORTED,
        )
    if params.content_size != _ZSTD_CONTENTSIZE_UNKNOWN and params.content_size > room:
        # The frame says up front that it decodes past the limit: refuse it without decoding.
        raise _too_large_decoded(max_bytes, "zstd")


# ---- JSON ----------------------------------------------------------------------------------


def parse_json(data: bytes) -> Any:
    """Parse a JSON body with orjson, refusing what orjson would accept only by losing information.

    Raises 400 invalid_request for invalid JSON, invalid UTF-8 (including UTF-8-encoded
    surrogates), an escaped surrogate without its pair, nesting deeper than
    :data:`MAX_JSON_DEPTH`, and integers outside the 64-bit range (which orjson would turn
    into inexact floats).
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        message = _json_error_message(data, exc)
        if "depth limit" in str(exc):  # valid JSON past our nesting limit: a limit, not a malformed body
            raise ApiError("invalid_request", message) from None
        # JsonInvalid is a 400 invalid_request; it keeps where decoding failed for System One's 422.
        raise JsonInvalid(message, int(getattr(exc, "pos", 0) or 0)) from None
    _check_depth(value, data)
    _check_integers(data)
    return value


def _json_error_message(data: bytes, exc: orjson.JSONDecodeError) -> str:
    text = str(exc)
    if "UTF-8" in text:
        # orjson's words are misleading here ("surrogates not allowed" for any bad byte); find the byte.
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as bad:
            return f"the request body is not valid UTF-8: byte {bad.start} ({bad.reason})"
    if "surrogate" in text:
        return f"the request body has an unpaired UTF-16 surrogate escape: {text}"
    if "depth limit" in text:
        return f"the request body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels"
    return f"the request body is not valid JSON: {text}"


def _check_depth(value: Any, data: bytes) -> None:
    # A body with few brackets cannot nest deeply; most bodies end here without a walk.
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node if type(node) is list else ()
        for child in children:
            if type(child) is dict or type(child) is list:
                if depth + 1 > MAX_JSON_DEPTH:
                    raise ApiError(
                        "invalid_request",
                        f"the request body nests objects and arrays deeper than {MAX_JSON_DEPTH} levels",
                    )
                stack.append((child, depth + 1))


def _check_integers(data: bytes) -> None:
    # Only a run of 19 or more digits can hold an integer past 64 bits; only then scan the tokens.
    if _LONG_DIGIT_RUN not in bytes(data).translate(_DIGITS_AS_ZEROS):
        return
    for match in _JSON_STRING_OR_NUMBER.finditer(data):
        token = match.group()
        if token[:1] == b'"' or b"." in token or b"e" in token or b"E" in token:
            continue
        number = int(token)
        if not _INT_MIN <= number <= _INT_MAX:
            shown = token.decode() if len(token) <= 40 else token[:40].decode() + "..."
            raise ApiError(
                "invalid_request",
                f"the request body has the integer {shown}, outside the 64-bit range",
            )


# ---- multipart/form-data -------------------------------------------------------------------


def parse_multipart(data: bytes, content_type: str) -> tuple[Any, dict[str, bytes]]:
    """Split a multipart/form-data body (RFC 7578): the JSON request and the other parts' bytes.

    The first part, named ``request``, holds the JSON request (parsed with :func:`parse_json`);
    every other part holds one image's bytes under its name. Returns ``(request, {name: bytes})``.
    Raises 400 invalid_request for a missing or bad boundary, a body that is not well formed,
    a part without a form-data name, a repeated name, or a first part that is not ``request``;
    415 unsupported_media_type when `content_type` is not multipart/form-data.
    """
    delimiter = b"--" + _boundary(content_type)
    # RFC 2046 section 5.1.1: a delimiter is CRLF "--" boundary, except at the very start of the body.
    if data.startswith(delimiter):
        pos = 0
    else:
        at = data.find(b"\r\n" + delimiter)
        if at < 0:
            raise _bad_multipart("the body has no part delimited by its boundary")
        pos = at + 2
    request: Any = None
    parts: dict[str, bytes] = {}
    seen_request = False
    while True:
        after = pos + len(delimiter)
        if data[after : after + 2] == b"--":
            break  # the close delimiter; an epilogue may follow and is ignored
        line_end = data.find(b"\r\n", after)
        if line_end < 0 or data[after:line_end].strip(b" \t"):
            raise _bad_multipart("a boundary line is not followed by CRLF")
        start = line_end + 2
        end = data.find(b"\r\n" + delimiter, start)
        if end < 0:
            raise _bad_multipart("the body ends before its closing boundary")
        name, content = _part(data, start, end)
        if not seen_request:
            if name != "request":
                raise _bad_multipart(f"the first part must be named 'request', not {name!r}")
            request = parse_json(content)
            seen_request = True
        elif name == "request" or name in parts:
            raise _bad_multipart(f"the part name {name!r} is used more than once")
        else:
            parts[name] = content
        pos = end + 2
    if not seen_request:
        raise _bad_multipart("the body has no parts; the first part, request, holds the JSON request")
    return request, parts


def _bad_multipart(message: str) -> ApiError:
    return ApiError("invalid_request", f"the multipart/form-data body is malformed: {message}")


def _boundary(content_type: str) -> bytes:
    if "\r" in content_type or "\n" in content_type:
        raise _bad_multipart("the Content-Type header holds a line break")
    header = HeaderParser(policy=policy.HTTP).parsestr(f"Content-Type: {content_type}\r\n\r\n")
    if header.get_content_type() != _MULTIPART:
        raise ApiError(
            "unsupported_media_type",
            f"the body is {header.get_content_type()}, not {_MULTIPART}",
        )
    boundary = header.get_param("boundary")
    # RFC 2046: 1 to 70 characters, not ending in a space.
    if not isinstance(boundary, str) or not 1 <= len(boundary) <= 70 or boundary.endswith(" "):
        raise _bad_multipart("the Content-Type has no valid boundary parameter")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise _bad_multipart("the boundary is not ASCII") from None


def _part(data: bytes, start: int, end: int) -> tuple[str, bytes]:
    """The body part in ``data[start:end]``: its form-data name and its content."""
    if data.startswith(b"\r\n", start):
        raise _bad_multipart("a part has no headers; each part needs a Content-Disposition with a name")
    split = data.find(b"\r\n\r\n", start, end)
    if split < 0:
        raise _bad_multipart("a part's headers do not end in an empty line")
    headers = BytesHeaderParser(policy=policy.HTTP).parsebytes(data[start : split + 4])
    disposition = headers.get("content-disposition")
    if disposition is None or headers.get_content_disposition() != "form-data":
        raise _bad_multipart("a part has no Content-Disposition: form-data")
    name = disposition.params.get("name")
    if not isinstance(name, str) or not name:
        raise _bad_multipart("a part's Content-Disposition has no name")
    transfer = str(headers.get("content-transfer-encoding", "binary")).strip().lower()
    if transfer not in ("binary", "8bit", "7bit"):
        raise _bad_multipart(f"part {name!r} has Content-Transfer-Encoding {transfer!r}; send its bytes as they are")
    return name, data[split + 4 : end]


def inline_parts(request: Any, parts: dict[str, bytes]) -> Any:
    """Resolve a multipart request's ``{"type": "image", "part": name}`` assets to inline base64.

    Every part other than ``request`` must be claimed by exactly one asset, and every claimed part
    must exist; the result is the request as it would have been sent as plain JSON.
    """
    assets = request.get("assets") if isinstance(request, dict) else None
    claimed: set[str] = set()
    if isinstance(assets, dict):
        resolved = {}
        for key, asset in assets.items():
            if isinstance(asset, dict) and "part" in asset:
                name = asset["part"]
                if not isinstance(name, str) or name not in parts:
                    raise ApiError("invalid_request", f"assets[{key!r}] names part {name!r}, which the body "
                                   "does not hold", reason="asset_part_missing")
                if name in claimed:
                    raise ApiError("invalid_request", f"part {name!r} is claimed by more than one asset",
                                   reason="asset_part_reused")
                claimed.add(name)
                asset = {k: v for k, v in asset.items() if k != "part"}
                asset["data_base64"] = base64.b64encode(parts[name]).decode("ascii")
            resolved[key] = asset
        request = {**request, "assets": resolved}
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise ApiError("invalid_request", f"parts {unclaimed} are not claimed by any asset",
                       reason="asset_unreferenced")
    return request
