"""The encoder family's cards: its kinds and their surfaces, its schema (card.schema.json beside this
file) and the rules between head, labels and graph outputs that a schema cannot express."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_runtime.packages import CARD_FILE, FamilyCard, PackageError, schema_fragment, tokenizer_files
from edge_runtime.packages.reader import HEAD_FILE

#: kind -> the surfaces it serves
KINDS: dict[str, tuple[str, ...]] = {
    "embedding": ("embeddings",),
    "sequence-classification": ("classify",),
    "multi-label": ("classify",),
    "token-classification": ("classify",),
    "rerank": ("rerank",),
}


def check_encoder_card(card: dict[str, Any]) -> None:
    """Raise PackageError (naming card.json) when the head names no graph output, the Matryoshka
    sizes miss the dimension, thresholds and labels differ, or BIO labels lack 'O'."""
    def bad(reason: str) -> PackageError:
        return PackageError(CARD_FILE, reason)

    kind, head, labels = card["kind"], card["head"], card["labels"]
    outputs = set(card["graph"]["outputs"])
    if kind == "embedding":
        for layer, out in head["layers"].items():
            if out not in outputs:
                raise bad(f"head.layers[{layer!r}] names {out!r}, which is not a graph output")
        dims = head["dimensions"]
        if head["dimension"] not in dims or max(dims) != head["dimension"]:
            raise bad("head.dimensions must contain head.dimension as its largest size")
    elif head["output"] not in outputs:
        raise bad(f"head.output {head['output']!r} is not a graph output")
    if kind == "multi-label" and set(head["thresholds"]) != set(labels):
        raise bad("head.thresholds must have exactly one threshold per label")
    if kind == "token-classification" and "O" not in labels:
        raise bad("BIO labels must include 'O'")


def encoder_files(card: dict[str, Any]) -> dict[str, str]:
    """The tokenizer, and head.npz where the embedding head projects through dense layers."""
    files = tokenizer_files(card)
    if (card.get("head") or {}).get("dense"):
        files[HEAD_FILE] = "the dense projections' weights"
    return files


CARD = FamilyCard(kinds=KINDS, schema=schema_fragment(Path(__file__).with_name("card.schema.json")),
                  check=check_encoder_card, files=encoder_files)
