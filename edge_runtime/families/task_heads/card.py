"""The task-heads family's cards: its kinds (one per head) and their surfaces, its schema
(card.schema.json beside this file), the files its packages hold and the rules between members a schema
cannot express."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_runtime.packages import CARD_FILE, FamilyCard, PackageError, schema_fragment
from edge_runtime.packages.card import TOKENIZER_FILE

#: kind -> the surfaces it serves
KINDS: dict[str, tuple[str, ...]] = {
    "task-sequence": ("classify",),
    "task-scores": ("classify",),
    "task-token": ("classify",),
    "task-grounded": ("classify",),
    "task-pooled": ("embeddings",),
    "task-relevance": ("rerank",),
}
#: the card kind -> the head's kind on /v1/classify and in /v1/models (grounded spans are token spans)
HEAD_KINDS = {"task-sequence": "sequence", "task-scores": "scores", "task-token": "token",
              "task-grounded": "token"}
#: kinds whose readout runs in numpy from head.npz (pooled classifiers and pair scorers)
NUMPY_HEADS = ("task-sequence", "task-scores", "task-relevance")
HEAD_WEIGHTS = "head.npz"
OPERATING_POINT = "operating_point.json"


def task_files(card: dict[str, Any]) -> dict[str, str]:
    """The tokenizer, head.npz where the readout runs in numpy, and the source's operating point."""
    files = {TOKENIZER_FILE: "the tokenizer"}
    if card["kind"] in NUMPY_HEADS:
        files[HEAD_WEIGHTS] = "the head's weights"
    if "operating_point" in card["head"]:
        files[OPERATING_POINT] = "the operating point the head was calibrated under"
    return files


def check_task_card(card: dict[str, Any]) -> None:
    """Raise PackageError (naming card.json) when the head names no graph output, thresholds miss labels,
    a window cannot advance, a grounded head's template lacks its fields, or an exit is not declared."""
    def bad(reason: str) -> PackageError:
        return PackageError(CARD_FILE, reason)

    kind, head, labels = card["kind"], card["head"], card["labels"]
    outputs = set(card["graph"]["outputs"])
    named = list(head["layers"].values()) if kind == "task-pooled" else [head["output"]]
    for output in named:
        if output not in outputs:
            raise bad(f"the head reads {output!r}, which is not a graph output")
    window = head.get("window")
    if window is not None and window["overlap"] >= window["tokens"]:
        raise bad("head.window.overlap must be smaller than head.window.tokens")
    if kind == "task-scores" and len(head["thresholds"]) != len(labels):
        raise bad("head.thresholds must have one threshold per label")
    if kind == "task-token" and "O" not in labels:
        raise bad("BIO labels must include 'O'")
    if kind == "task-grounded":
        template = head["input_pair"][0]
        if "{question}" not in template or "{context}" not in template:
            raise bad("head.input_pair's template must name {question} and {context}")
    if kind == "task-pooled":
        dims = head["dimensions"]
        if head["dimension"] not in dims or max(dims) != head["dimension"]:
            raise bad("head.dimensions must contain head.dimension as its largest size")
    if kind == "task-relevance":
        exits = [(e["layer"], e["dimension"]) for e in head["exits"]]
        if any(layer not in head["layers"] for layer, _ in exits):
            raise bad("every exit's layer must be one of head.layers")
        if (head["default"]["layer"], head["default"]["dimension"]) not in exits:
            raise bad("head.default must be one of head.exits")


CARD = FamilyCard(kinds=KINDS, schema=schema_fragment(Path(__file__).with_name("card.schema.json")),
                  check=check_task_card, files=task_files)
