"""Assets: images held by reference, replaced wherever a reference occurs in a string.

The contract's rules (HTTP API reference, "Assets"): a top-level ``assets`` object maps each
reference (1 to 1,024 bytes, 65,536 for all of them) to ``{"type": "image", "data_base64"}`` (a
multipart body's ``part`` assets arrive here already inlined by the body decoder). A string equal
to a reference is that image; a longer string is split at each occurrence (the longest reference
wins where two start at the same place); object keys are never replaced; each use adds the image
again; every asset must be used (asset_unreferenced). This module knows JSON values, not
questions: a family decides where a use may sit (its card's image_placements).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_runtime.media.dataurl import b64_bytes
from edge_runtime.media.errors import MediaError

MIN_REFERENCE_BYTES = 1
MAX_REFERENCE_BYTES = 1024
MAX_REFERENCES_BYTES = 65_536
#: The contract's size of one asset image, whatever a model's own image_max_bytes.
MAX_ASSET_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Assets:
    """Validated assets: each reference's image bytes, and a matcher for the references."""

    images: dict[str, bytes]
    pattern: re.Pattern[str]

    def uses(self, text: str) -> list[str]:
        """The references a string holds, in order (each occurrence once)."""
        return [m.group(0) for m in self.pattern.finditer(text)]

    def used_in(self, value: Any) -> list[str]:
        """Every reference used in the strings of a JSON value (keys excluded), in order."""
        return [ref for text in _strings(value) for ref in self.uses(text)]


def check_references(references: Iterable[str]) -> None:
    """Refuse an empty or over-long reference, or references too long together: each with its own
    fixed reason and the limit, so the Router can pass the reason on without the request's data."""
    total = 0
    for reference in references:
        size = len(reference.encode("utf-8", "surrogatepass"))
        if size < MIN_REFERENCE_BYTES:
            raise MediaError("asset_reference_empty", "an assets reference is empty: a reference has 1 to "
                          f"{MAX_REFERENCE_BYTES} bytes", MIN_REFERENCE_BYTES)
        if size > MAX_REFERENCE_BYTES:
            raise MediaError("asset_reference_too_long", f"an assets reference has {size} bytes, more than "
                          f"{MAX_REFERENCE_BYTES}", MAX_REFERENCE_BYTES)
        total += size
    if total > MAX_REFERENCES_BYTES:
        raise MediaError("asset_references_too_long", f"the assets references have {total} bytes together, "
                      f"more than {MAX_REFERENCES_BYTES}", MAX_REFERENCES_BYTES)


def parse_assets(raw: Mapping[str, Any] | None, max_bytes: int) -> Assets | None:
    """Validate the request's assets and decode their bytes; MediaError with a fixed reason otherwise."""
    if not raw:
        return None
    check_references(raw)
    images: dict[str, bytes] = {}
    for ref, asset in raw.items():
        if asset.get("type") != "image" or not isinstance(asset.get("data_base64"), str):
            raise MediaError("asset_malformed", f"assets[{ref!r}] must be {{\"type\": \"image\", \"data_base64\"}}")
        try:
            images[ref] = b64_bytes(asset["data_base64"], min(max_bytes, MAX_ASSET_BYTES), "image")
        except MediaError as e:  # the same refusal, naming the asset
            raise MediaError(e.reason, f"assets[{ref!r}]: {e.message}", e.limit) from None
    # longest first: where two references start at the same place, the longer one is meant
    pattern = re.compile("|".join(re.escape(r) for r in sorted(images, key=len, reverse=True)))
    return Assets(images, pattern)


def replace_in(value: Any, assets: Assets, name: Any) -> tuple[Any, list[str]]:
    """``value`` with every use replaced by ``name(k)`` (k counts uses from 0), and the uses in order."""
    used: list[str] = []

    def use(m: re.Match[str]) -> str:
        used.append(m.group(0))
        return str(name(len(used) - 1))

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return assets.pattern.sub(use, v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}  # keys are never replaced
        return v

    return walk(value), used


def state_with_assets(state: Any, images: int, assets: Assets | None, used: list[str] | None
                      ) -> tuple[Any, list[str]]:
    """The state with its asset uses replaced and those uses (recorded in ``used`` too): a use in
    the state is one more image after the entry's ``images``, named ``[image k]`` where it was."""
    if assets is None:
        return state, []
    first = images + 1
    state, uses = replace_in(state, assets, lambda k: f"[image {first + k}]")
    if used is not None:
        used.extend(uses)
    return state, uses


def check_all_used(assets: Assets, used: Iterable[str]) -> None:
    """asset_unreferenced for an asset no string of the request uses."""
    seen = set(used)
    unused = [r for r in assets.images if r not in seen]
    if unused:
        raise MediaError("asset_unreferenced", f"{len(unused)} asset(s) are not referenced by any string of the "
                      "request; every asset must be used")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for x in value:
            yield from _strings(x)
    elif isinstance(value, dict):
        for x in value.values():
            yield from _strings(x)


__all__ = ["Assets", "MAX_ASSET_BYTES", "MAX_REFERENCES_BYTES", "MAX_REFERENCE_BYTES", "MIN_REFERENCE_BYTES",
           "check_all_used", "check_references", "parse_assets", "replace_in"]
