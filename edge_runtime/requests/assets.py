"""The contract's limits on asset references (the placeholder keys of a request's ``assets``).

A reference has 1 to 1,024 bytes of UTF-8, and all of a request's references together at most
65,536. A reference that breaks one is refused as a whole request (400 invalid_request) with its
own fixed reason and the limit, so the Router can pass the reason on without the request's data.
"""

from __future__ import annotations

from collections.abc import Iterable

from edge_runtime.errors import ApiError

MIN_REFERENCE_BYTES = 1
MAX_REFERENCE_BYTES = 1024
MAX_REFERENCES_BYTES = 65536


def check_references(references: Iterable[str]) -> None:
    """Refuse an empty or over-long reference, or references that are too long together."""
    total = 0
    for reference in references:
        size = len(reference.encode("utf-8", "surrogatepass"))
        if size < MIN_REFERENCE_BYTES:
            raise ApiError("invalid_request", "an assets reference is empty: a reference has 1 to "
                           f"{MAX_REFERENCE_BYTES} bytes", reason="asset_reference_empty", limit=MIN_REFERENCE_BYTES)
        if size > MAX_REFERENCE_BYTES:
            raise ApiError("invalid_request", f"an assets reference has {size} bytes, more than "
                           f"{MAX_REFERENCE_BYTES}", reason="asset_reference_too_long", limit=MAX_REFERENCE_BYTES)
        total += size
    if total > MAX_REFERENCES_BYTES:
        raise ApiError("invalid_request", f"the assets references have {total} bytes together, more than "
                       f"{MAX_REFERENCES_BYTES}", reason="asset_references_too_long", limit=MAX_REFERENCES_BYTES)
