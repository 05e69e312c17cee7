"""Request body decoding: size limits as sent and as decoded, gzip and zstd, JSON and multipart."""

from __future__ import annotations

import asyncio
import gzip
import os
import struct
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable

import pytest
import zstandard

from edge_runtime.api.body import (
    MAX_JSON_DEPTH,
    ZSTD_MAX_WINDOW,
    content_coding,
    decode_body,
    decode_small,
    parse_json,
    parse_multipart,
    read_body,
)
from edge_runtime.api.statuses import status_of
from edge_runtime.errors import ApiError

LIMIT = 8 << 20
GIB = 1 << 30
MIB = 1 << 20
PAYLOAD = b'{"model": "emb", "input": ["' + "Où est la gare ? 東京 🚀 ".encode() * 20000 + b'"]}'


def refused(call: Callable[[], object]) -> ApiError:
    with pytest.raises(ApiError) as info:
        call()
    return info.value


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _never_read() -> AsyncIterator[bytes]:
    raise AssertionError("the body was read")
    yield b""  # pragma: no cover - makes this an async generator


def read(parts: list[bytes], content_length: int | None, encoding: str | None, limit: int) -> bytes:
    return asyncio.run(read_body(_chunks(parts), content_length, encoding, limit))


def peak_growth(call: Callable[[], object]) -> tuple[int, ApiError]:
    """Peak Python allocation above the start while `call` is refused, and its error."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        error = refused(call)
        return tracemalloc.get_traced_memory()[1] - base, error
    finally:
        tracemalloc.stop()


# -- gzip bombs: 1 GiB of zeros in about 1 MB --------------------------------------------------


def _gzip_of_zeros(mib: int) -> bytes:
    """A valid gzip member of `mib` MiB of zeros, built without compressing them all.

    After Z_FULL_FLUSH deflate starts afresh, so every flushed MiB of zeros compresses to the same
    bytes: one such segment repeated, a final block, and the trailer (CRC-32 and size) make the stream.
    """
    zero = bytes(MIB)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = deflate.compress(zero) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert deflate.compress(zero) + deflate.flush(zlib.Z_FULL_FLUSH) == segment
    final = deflate.flush()
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zero, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + segment * mib + final + struct.pack("<II", crc, (mib * MIB) & 0xFFFFFFFF)


def _zstd_of_zeros(mib: int, declare_size: bool) -> bytes:
    zero = bytes(MIB)
    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=mib * MIB if declare_size else -1)
    return b"".join(compressor.compress(zero) for _ in range(mib)) + compressor.flush()


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    return _gzip_of_zeros(1024)


def test_the_gzip_bomb_construction_is_valid_gzip() -> None:
    assert gzip.decompress(_gzip_of_zeros(3)) == bytes(3 * MIB)


def test_gzip_bomb_is_refused_in_bounded_memory(gzip_bomb: bytes) -> None:
    assert len(gzip_bomb) < 1_100_000  # 1 GiB once decoded
    growth, error = peak_growth(lambda: decode_body(gzip_bomb, "gzip", LIMIT))
    assert (status_of(error), error.code, error.limit) == (413, "request_too_large", LIMIT)
    assert "decoded" in error.message
    assert growth < 50 * MIB


def test_zstd_bombs_are_refused_in_bounded_memory() -> None:
    # Without a declared size the stream is decoded until it passes the limit; with one, the
    # frame header alone refuses it. (tracemalloc does not see libzstd's own window buffer,
    # which max_window_size caps at 8 MiB.)
    for declare in (False, True):
        bomb = _zstd_of_zeros(1024, declare)
        assert len(bomb) < 100_000
        growth, error = peak_growth(lambda bomb=bomb: decode_body(bomb, "zstd", LIMIT))
        assert (status_of(error), error.code, error.limit) == (413, "request_too_large", LIMIT)
        assert growth < 50 * MIB


def test_streamed_bomb_is_refused_too(gzip_bomb: bytes) -> None:
    parts = [gzip_bomb[i : i + 65536] for i in range(0, len(gzip_bomb), 65536)]
    error = refused(lambda: read(parts, len(gzip_bomb), "gzip", LIMIT))
    assert (status_of(error), error.limit) == (413, LIMIT)


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding,encode",
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZip", gzip.compress),
        ("zstd", lambda b: zstandard.ZstdCompressor(level=3).compress(b)),
        ("zstd", lambda b: zstandard.ZstdCompressor(level=19, write_checksum=True).compress(b)),
        (None, lambda b: b),
        ("identity", lambda b: b),
        ("", lambda b: b),
    ],
)
def test_round_trips(encoding: str | None, encode: Callable[[bytes], bytes]) -> None:
    sent = encode(PAYLOAD)
    assert decode_body(sent, encoding, LIMIT) == PAYLOAD
    chunks = [sent[i : i + 1000] for i in range(0, len(sent), 1000)]
    assert read(chunks, len(sent), encoding, LIMIT) == PAYLOAD
    assert parse_json(decode_body(sent, encoding, LIMIT))["model"] == "emb"


def test_streamed_zstd_without_content_size_and_several_frames() -> None:
    frame = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    one = frame.compress(PAYLOAD) + frame.flush()
    skippable = struct.pack("<II", 0x184D2A53, 4) + b"skip"
    assert decode_body(skippable + one + one, "zstd", LIMIT) == PAYLOAD * 2


def test_several_gzip_members_decode_in_sequence() -> None:
    assert decode_body(gzip.compress(b"[1,") + gzip.compress(b"2]"), "gzip", LIMIT) == b"[1,2]"


def test_large_output_steps_are_not_lost() -> None:
    # Output far larger than one decompression step, from a few bytes of input.
    data = b"a" * (5 * MIB + 7)
    assert decode_body(gzip.compress(data), "gzip", LIMIT) == data
    assert decode_body(zstandard.ZstdCompressor().compress(data), "zstd", LIMIT) == data


# -- malformed streams -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding,sent",
    [
        ("gzip", gzip.compress(PAYLOAD)[:-9]),
        ("gzip", gzip.compress(PAYLOAD)[:20]),
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(PAYLOAD)[:100] + b"\x00" * 50 + gzip.compress(PAYLOAD)[150:]),
        ("gzip", gzip.compress(b"{}") + b"trailing garbage"),
        ("gzip", b""),
        ("zstd", zstandard.ZstdCompressor().compress(PAYLOAD)[:-3]),
        ("zstd", zstandard.ZstdCompressor().compress(PAYLOAD)[:5]),
        ("zstd", b"not zstd at all"),
        ("zstd", zstandard.ZstdCompressor().compress(b"{}") + b"trailing garbage"),
        ("zstd", b""),
    ],
)
def test_truncated_or_corrupt_streams_are_400_encoding_malformed(encoding: str, sent: bytes) -> None:
    error = refused(lambda: decode_body(sent, encoding, LIMIT))
    assert (status_of(error), error.code, error.reason) == (400, "invalid_request", "encoding_malformed")


def test_corrupt_zstd_checksum_is_malformed() -> None:
    frame = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(PAYLOAD))
    frame[-1] ^= 0xFF
    error = refused(lambda: decode_body(bytes(frame), "zstd", LIMIT))
    assert error.reason == "encoding_malformed"


# -- where decoding runs: a small body on the spot, the rest handed on (api/app.py) -------------

SMALL = 16 * 1024
ZSTD = zstandard.ZstdCompressor(level=3).compress


def _wide_window_frame() -> bytes:
    """A small zstd frame whose header asks for a 16 MiB window."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    stream = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return stream.compress(b'{"a": 1}') + stream.flush()


@pytest.mark.parametrize("encoding,encode", [("gzip", gzip.compress), ("zstd", ZSTD)])
def test_decode_small_decodes_only_what_stays_small(encoding: str, encode: Callable[[bytes], bytes]) -> None:
    small = b'{"input": "' + b"x" * 1000 + b'"}'
    assert decode_small(encode(small), encoding, LIMIT, SMALL) == small
    # A few hundred bytes as sent, 8 MiB once decoded: handed on after about SMALL bytes of output.
    inflating = b"a" * (8 * MIB)
    sent = encode(inflating)
    assert len(sent) < SMALL
    assert decode_small(sent, encoding, LIMIT, SMALL) is None
    assert decode_body(sent, encoding, LIMIT) == inflating
    # Larger than SMALL as sent: handed on without decoding a byte (corrupt data raises nothing here).
    corrupt = encode(small)[:8] + os.urandom(SMALL)
    assert decode_small(corrupt, encoding, LIMIT, SMALL) is None
    assert refused(lambda: decode_body(corrupt, encoding, LIMIT)).reason == "encoding_malformed"


def test_decode_small_returns_an_identity_body_as_it_is() -> None:
    large = PAYLOAD * 4
    for encoding in (None, "identity"):
        assert decode_small(large, encoding, LIMIT, SMALL) is large


@pytest.mark.parametrize("encoding,sent,status,reason", [
    ("gzip", gzip.compress(PAYLOAD)[:20], 400, "encoding_malformed"),
    ("zstd", b"not zstd at all", 400, "encoding_malformed"),
    ("br", b"{}", 415, "encoding_unsupported"),
    ("zstd", _wide_window_frame(), 415, "zstd_window_too_large"),
])
def test_decode_small_raises_what_decode_body_raises(encoding: str, sent: bytes, status: int, reason: str) -> None:
    error = refused(lambda: decode_small(sent, encoding, LIMIT, SMALL))
    assert (status_of(error), error.reason) == (status, reason)
    again = refused(lambda: decode_body(sent, encoding, LIMIT))
    assert (status_of(again), again.reason) == (status, reason)


def test_decode_small_refuses_a_body_past_a_limit_below_small() -> None:
    # With a limit under SMALL, passing the limit is the refusal, not a hand-off.
    for encoding, encode in (("gzip", gzip.compress), ("zstd", ZSTD)):
        sent = encode(b"a" * 2000)
        error = refused(lambda sent=sent, encoding=encoding: decode_small(sent, encoding, 1000, SMALL))
        assert (status_of(error), error.reason, error.limit) == (413, "decoded_body_too_large", 1000)


def test_zstd_window_over_8_mib_is_refused() -> None:
    frame = _wide_window_frame()
    assert zstandard.get_frame_parameters(frame).window_size == 16 * MIB
    error = refused(lambda: decode_body(frame, "zstd", LIMIT))
    assert (status_of(error), error.code, error.reason, error.limit) == (
        415, "unsupported_media_type", "zstd_window_too_large", ZSTD_MAX_WINDOW,
    )
    exact = zstandard.ZstdCompressionParameters.from_level(3, window_log=23)
    stream = zstandard.ZstdCompressor(compression_params=exact).compressobj()
    assert decode_body(stream.compress(b'{"a": 1}') + stream.flush(), "zstd", LIMIT) == b'{"a": 1}'


# -- codings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip, zstd", "gzip,gzip", "zstd, gzip", "br", "deflate", "compress", "gzip;q=1"])
def test_other_or_several_codings_are_415(encoding: str) -> None:
    error = refused(lambda: decode_body(gzip.compress(b"{}"), encoding, LIMIT))
    assert (status_of(error), error.code) == (415, "unsupported_media_type")
    # Refused before a byte of the body is read.
    streamed = refused(lambda: asyncio.run(read_body(_never_read(), 100, encoding, 1000)))
    assert status_of(streamed) == 415


def test_identity_layers_are_no_layer() -> None:
    assert content_coding("identity") == content_coding(" , ") == "identity"
    assert content_coding("gzip, identity") == "gzip"
    assert content_coding("ZSTD") == "zstd"


# -- size limits -------------------------------------------------------------------------------


def test_over_limit_as_sent() -> None:
    body = b"[" + b"1," * 600 + b"1]"
    error = refused(lambda: decode_body(body, None, 1000))
    assert (status_of(error), error.code, error.limit, error.reason) == (
        413, "request_too_large", 1000, "body_too_large")
    assert decode_body(body[:1000], None, 1000) == body[:1000]
    # Content-Length alone refuses it; the stream is never read.
    error = refused(lambda: asyncio.run(read_body(_never_read(), 5000, None, 1000)))
    assert (status_of(error), error.limit) == (413, 1000)
    # Without Content-Length, the chunk that passes the limit is refused.
    error = refused(lambda: read([body[:600], body[600:]], None, None, 1000))
    assert (status_of(error), error.limit) == (413, 1000)
    # A compressed body is measured as sent too.
    incompressible = zstandard.ZstdCompressor().compress(os.urandom(2000))
    error = refused(lambda: decode_body(incompressible, "zstd", 1000))
    assert error.reason == "body_too_large"


def test_over_limit_as_decoded() -> None:
    body = b"[" + b"1," * 60000 + b"1]"
    for encoding, sent in (("gzip", gzip.compress(body)), ("zstd", zstandard.ZstdCompressor().compress(body))):
        assert len(sent) < 100_000 < len(body)
        error = refused(lambda sent=sent, encoding=encoding: decode_body(sent, encoding, 100_000))
        assert (status_of(error), error.code, error.limit, error.reason) == (
            413, "request_too_large", 100_000, "decoded_body_too_large",
        )
        assert decode_body(sent, encoding, len(body)) == body  # exactly at the limit is fine


def test_content_length_must_match_the_body() -> None:
    error = refused(lambda: read([b"{}"], 5, None, 1000))
    assert (status_of(error), error.code) == (400, "invalid_request")


# -- JSON --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,words",
    [
        (b'{"input": "\xff"}', "UTF-8"),
        (b'{"input": "caf\xc3"}', "UTF-8"),
        (b'{"input": "\xed\xa0\x80"}', "UTF-8"),  # a surrogate encoded in UTF-8
        (b'{"input": "\\ud800"}', "surrogate"),  # a high surrogate with no low one
        (b'{"input": "\\udc00x"}', "surrogate"),  # a low surrogate alone
        (b'{"input": "\\ud800\\u0041"}', "surrogate"),
        (b'{"input": ', "not valid JSON"),
        (b"", "not valid JSON"),
        (b"{'input': 1}", "not valid JSON"),
        (b'{"a": NaN}', "not valid JSON"),
        (b'{"a": 1e999}', "not valid JSON"),
        (b"[" * 2000 + b"]" * 2000, "deeper than 64"),
        (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "deeper than 64"),
        (b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), "deeper than 64"),
        (b'{"top_n": 18446744073709551616}', "64-bit"),
        (b'{"top_n": -9223372036854775809}', "64-bit"),
        (b'[1, 2, 123456789012345678901234567890]', "64-bit"),
    ],
)
def test_bad_json_is_400_with_a_clear_message(data: bytes, words: str) -> None:
    error = refused(lambda: parse_json(data))
    assert (status_of(error), error.code) == (400, "invalid_request")
    assert words in error.message


def test_json_that_is_fine() -> None:
    assert parse_json(b'{"input": "\\ud83d\\ude80 \xf0\x9f\x9a\x80"}') == {"input": "🚀 🚀"}
    deepest = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert parse_json(deepest) is not None
    wide = b"[" + b",".join([b"[[1]]"] * 500) + b"]"  # many brackets, shallow
    assert len(parse_json(wide)) == 500
    # The 64-bit range is exact; long digit runs in strings or floats are not integers.
    assert parse_json(b"[18446744073709551615, -9223372036854775808]") == [2**64 - 1, -(2**63)]
    assert parse_json(b'{"id": "123456789012345678901234567890", "x": 1.5e300, "y": 12345678901234567890.5}')["id"]


@pytest.mark.parametrize("data", [
    b"18446744073709551616",  # the whole body, no byte around it
    b'{"s": "' + b"x" * 100_000 + b'", "n": [1, 2, -9223372036854775809]}',  # after a long string
    b"[" + b"7" * 40 + b"]",
])
def test_an_integer_past_64_bits_is_refused_wherever_it_stands(data: bytes) -> None:
    error = refused(lambda: parse_json(data))
    assert (status_of(error), error.code) == (400, "invalid_request") and "64-bit range" in error.message


def test_a_run_of_18_digits_is_an_integer_like_any_other() -> None:
    assert parse_json(b"[" + b"9" * 18 + b", -" + b"9" * 18 + b"]") == [int("9" * 18), -int("9" * 18)]


# -- multipart/form-data -----------------------------------------------------------------------

IMAGE = bytes(range(256)) * 8 + b"\r\n--almost-the-boundary\r\n\r\n" + b"\x00\r\r\n\n"
BOUNDARY = "----edge-runtime-7d1f"


def multipart(parts: list[tuple[str, bytes, str | None]], boundary: str = BOUNDARY) -> bytes:
    out = b"preamble to ignore\r\n"
    for name, content, ctype in parts:
        out += f"--{boundary}\r\n".encode()
        out += f'Content-Disposition: form-data; name="{name}"'.encode()
        out += (b'; filename="x.png"' if ctype and ctype.startswith("image/") else b"") + b"\r\n"
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\nepilogue".encode()


REQUEST = b'{"model": "d", "state": "<r>", "assets": {"<r>": {"type": "image", "part": "asset-0"}}, "questions": {}}'


def test_multipart_request_and_images() -> None:
    body = multipart([("request", REQUEST, "application/json"), ("asset-0", IMAGE, "image/png"),
                      ("asset-1", b"", "image/jpeg")])
    request, parts = parse_multipart(body, f'multipart/form-data; boundary="{BOUNDARY}"')
    assert request["assets"]["<r>"]["part"] == "asset-0"
    assert parts == {"asset-0": IMAGE, "asset-1": b""}
    # Unquoted boundary, no preamble, RFC 2231 encoded name.
    bare = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=request\r\n\r\n{{}}\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name*=UTF-8''%C3%A9t%C3%A9\r\n\r\nxyz\r\n"
            f"--{BOUNDARY}--").encode()
    assert parse_multipart(bare, f"multipart/form-data; boundary={BOUNDARY}") == ({}, {"été": b"xyz"})


@pytest.mark.parametrize(
    "body,content_type",
    [
        (multipart([("request", REQUEST, None)]), "multipart/form-data"),  # no boundary
        (multipart([("request", REQUEST, None)]), "multipart/form-data; boundary=" + "b" * 71),
        (multipart([("request", REQUEST, None)]), "multipart/form-data; boundary=other"),
        (multipart([("asset-0", IMAGE, "image/png"), ("request", REQUEST, None)]), None),  # request not first
        (multipart([("request", REQUEST, None), ("a", b"1", None), ("a", b"2", None)]), None),  # name twice
        (multipart([("request", REQUEST, None), ("request", REQUEST, None)]), None),
        (multipart([("request", b"{not json", None)]), None),
        (multipart([("request", REQUEST, None)])[: -len(f"--{BOUNDARY}--\r\nepilogue") - 2], None),  # unclosed
        (multipart([]), None),  # no parts at all
        (f"--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\n{{}}\r\n--{BOUNDARY}--".encode(), None),  # no name
        (f"--{BOUNDARY}\r\nContent-Disposition: form-data\r\n\r\n{{}}\r\n--{BOUNDARY}--".encode(), None),
        (f"--{BOUNDARY}\r\n\r\n{{}}\r\n--{BOUNDARY}--".encode(), None),  # no headers
        (f"--{BOUNDARY}junk\r\nContent-Disposition: form-data; name=request\r\n\r\n{{}}\r\n"
         f"--{BOUNDARY}--".encode(), None),
        (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=request\r\n"
         f"Content-Transfer-Encoding: base64\r\n\r\ne30=\r\n--{BOUNDARY}--".encode(), None),
    ],
)
def test_malformed_multipart_is_400(body: bytes, content_type: str | None) -> None:
    ctype = content_type or f"multipart/form-data; boundary={BOUNDARY}"
    error = refused(lambda: parse_multipart(body, ctype))
    assert (status_of(error), error.code) == (400, "invalid_request")


def test_multipart_with_another_content_type_is_415() -> None:
    error = refused(lambda: parse_multipart(b"{}", "application/json"))
    assert (status_of(error), error.code) == (415, "unsupported_media_type")


def test_inline_parts_resolves_claimed_parts_to_base64() -> None:
    from edge_runtime.api.body import inline_parts

    request = {"state": "<r>", "assets": {"<r>": {"type": "image", "part": "receipt"}, "<s>": {"type": "image",
                                                                                         "data_base64": "AA=="}}}
    out = inline_parts(request, {"receipt": b"\x89PNG"})
    assert out["assets"]["<r>"] == {"type": "image", "data_base64": "iVBORw=="}
    assert out["assets"]["<s>"] == {"type": "image", "data_base64": "AA=="}
    assert "part" in request["assets"]["<r>"]  # the caller's object is left as it was
    assert inline_parts({"state": "x"}, {}) == {"state": "x"}


@pytest.mark.parametrize("request_body, parts, reason", [
    ({"state": "x"}, {"extra": b"1"}, "asset_unreferenced"),
    ({"assets": {"<a>": {"type": "image", "part": "missing"}}}, {}, "asset_part_missing"),
    ({"assets": {"<a>": {"type": "image", "part": "p"}, "<b>": {"type": "image", "part": "p"}}}, {"p": b"1"},
     "asset_part_reused"),
])
def test_inline_parts_refuses_unclaimed_missing_and_reused_parts(request_body, parts, reason) -> None:
    from edge_runtime.api.body import inline_parts

    with pytest.raises(ApiError) as err:
        inline_parts(request_body, parts)
    assert (status_of(err.value), err.value.code, err.value.reason) == (400, "invalid_request", reason)
