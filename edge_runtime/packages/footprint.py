"""A package's footprint: the memory a loaded variant is expected to hold.

The figure comes from the card (``memory.resident_bytes``) when a converter recorded it. Today's
converters do not, so it is estimated from the package's file sizes: twice the variant's graph
files (ONNX Runtime holds the weights and builds its optimized copy while the session is made)
plus every other file the variant reads (tokenizer, goldens, heads, other graphs of its family);
the graphs of the other variants are not counted. The estimate is labelled as one wherever shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

GRAPH_FACTOR = 2


@dataclass(frozen=True)
class Need:
    """Bytes a version is expected to hold, and where the figure comes from (card or estimate)."""

    bytes: int
    source: str


def package_need(package: Path, variant: str) -> Need:
    """The card's recorded need, else an estimate from the manifest's file sizes (see the module)."""
    try:
        card = json.loads((package / "card.json").read_text(encoding="utf-8"))
        manifest = json.loads((package / "MANIFEST.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot size package {package}: {exc}") from None
    recorded = (card.get("memory") or {}).get("resident_bytes")
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return Need(recorded, "card")
    variants = card.get("variants") or {}
    if variant not in variants:  # "auto" (chosen by device at load): count the fp32 graph, the larger
        variant = "fp32"
    mine = (variants.get(variant) or {}).get("file")
    others = {v.get("file") for name, v in variants.items() if name != variant} - {mine}
    graphs = rest = 0
    for rel, entry in (manifest.get("files") or {}).items():
        size = int(entry.get("size", 0))
        stem = rel.removesuffix(".data")  # an external-data file belongs to its graph
        if stem in others or (stem.endswith(".onnx") and _variant_of(stem, variants) not in (None, variant)):
            continue
        if rel.endswith((".onnx", ".onnx.data")):
            graphs += size
        else:
            rest += size
    return Need(GRAPH_FACTOR * graphs + rest, "estimate from package file sizes (2 x graphs + other files)")


def _variant_of(graph: str, variants: dict[str, dict[str, str]]) -> str | None:
    """The variant whose graph file ``graph`` is a split or tower graph of (model.int8.question.onnx
    belongs to int8), None when it is shared by every variant."""
    for name, v in variants.items():
        stem = str(v.get("file", "")).removesuffix(".onnx")
        if stem and stem != "model" and graph.startswith(stem + "."):
            return name
    return None
