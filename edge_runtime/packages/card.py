"""card.json: parsing and validation (JSON Schema, then the checks a schema cannot express)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from edge_runtime.packages.errors import PackageError

CARD_FILE = "card.json"
CARD_FORMAT = "edge-runtime-package/1"
SCHEMA_PATH = Path(__file__).with_name("card.schema.json")

#: kind -> the surfaces it serves; the schema enforces the same mapping.
KIND_SURFACES: dict[str, tuple[str, ...]] = {
    "embedding": ("embeddings",),
    "sequence-classification": ("classify",),
    "multi-label": ("classify",),
    "token-classification": ("classify",),
    "rerank": ("rerank",),
    "sparrow": ("decisions",),
    "decision-codes": ("decisions",),
    "image-text-embedding": ("embeddings",),
    "audio-embedding": ("embeddings",),
    "vela2": ("decisions",),
    "decision2": ("decisions",),
    "decision-vision": ("decisions",),
    "decision3": ("decisions",),
}
DECISION_FAMILIES = frozenset({"sparrow", "decision-codes", "vela2", "decision2", "decision-vision", "decision3"})


@dataclass(frozen=True)
class Variant:
    """One graph of the package (fp32, int8, ...)."""

    name: str
    file: str
    dtype: str
    golden: str
    agreement: dict[str, Any] | None


@dataclass(frozen=True)
class Card:
    """A validated card. ``raw`` keeps the whole JSON object, family-specific members included."""

    name: str
    family: str
    kind: str
    surfaces: tuple[str, ...]
    description: str
    version: str
    release_date: str
    revision: str
    labels: tuple[str, ...]
    head: dict[str, Any]
    limits: dict[str, Any]
    variants: dict[str, Variant]
    modalities: tuple[str, ...]
    raw: dict[str, Any]

    @property
    def question_types(self) -> tuple[str, ...]:
        """The decision question types the card lists (empty for models without decisions)."""
        return tuple(self.raw.get("question_types", ()))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f" (at {path})" if path else ""


def validate_card(obj: Any) -> None:
    """Validate a card object against card.schema.json and the cross-field rules.

    Raises PackageError naming card.json with the first (most relevant) problem.
    """
    errors = list(_validator().iter_errors(obj))
    # identity first: a wrong family or kind explains the other mismatches that follow from it
    first = [e for e in errors if list(e.absolute_path)[:1] in (["format"], ["family"], ["kind"])]
    error = jsonschema.exceptions.best_match(first or errors)
    if error is not None:
        raise PackageError(CARD_FILE, f"{error.message}{_where(error)}")
    _check_consistency(obj)


def _check_consistency(card: dict[str, Any]) -> None:
    """Rules between members that JSON Schema does not express."""
    def bad(reason: str) -> PackageError:
        return PackageError(CARD_FILE, reason)

    kind, head, labels = card["kind"], card["head"], card["labels"]
    outputs = set(card["graph"]["outputs"])
    if card["family"] == "encoder":
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
    files = [v["file"] for v in card["variants"].values()]
    goldens = [v["golden"] for v in card["variants"].values()]
    if len(set(files)) != len(files) or len(set(goldens)) != len(goldens):
        raise bad("variants must name distinct graph and golden files")
    limits = card["limits"]
    if "truncate_tokens" in limits and limits["truncate_tokens"] > limits["max_input_tokens"]:
        raise bad("limits.truncate_tokens exceeds limits.max_input_tokens")


def parse_card(data: bytes) -> Card:
    """Parse and validate the bytes of card.json."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(CARD_FILE, f"not valid JSON: {e}") from None
    validate_card(obj)
    raw = copy.deepcopy(obj)
    variants = {
        name: Variant(name=name, file=v["file"], dtype=v["dtype"], golden=v["golden"],
                      agreement=copy.deepcopy(v.get("agreement")))
        for name, v in obj["variants"].items()
    }
    return Card(
        name=obj["name"], family=obj["family"], kind=obj["kind"], surfaces=tuple(obj["surfaces"]),
        description=obj["description"], version=obj["version"], release_date=obj["release_date"],
        revision=obj["revision"], labels=tuple(obj["labels"]), head=copy.deepcopy(obj["head"]),
        limits=copy.deepcopy(obj["limits"]), variants=variants, modalities=tuple(obj["modalities"]),
        raw=raw,
    )
