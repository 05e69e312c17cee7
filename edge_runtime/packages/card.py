"""card.json: parsing and validation (JSON Schema, then the checks a schema cannot express).

This module names no family: the registry (edge_runtime/families/registry.py) hands the reader every
served family's :class:`FamilyCard` (its kinds and their surfaces, its schema, its checks and the files
its packages hold) as :class:`CardRules`, which compose card.schema.json with them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jsonschema

from edge_runtime.packages.errors import PackageError
from edge_runtime.packages.golden import DEFAULT_GOLDEN_CLASS

CARD_FILE = "card.json"
CARD_FORMAT = "edge-runtime-package/1"
SCHEMA_PATH = Path(__file__).with_name("card.schema.json")
TOKENIZER_FILE = "tokenizer.json"
DECISION_CONFIG_FILE = "decision_config.json"


def tokenizer_files(card: dict[str, Any]) -> dict[str, str]:
    """The files most packages hold besides their variants' graphs and goldens: the tokenizer."""
    return {TOKENIZER_FILE: "the tokenizer"}


def decision_files(card: dict[str, Any]) -> dict[str, str]:
    """A decision family's files: the tokenizer and decision_config.json."""
    return {TOKENIZER_FILE: "the tokenizer", DECISION_CONFIG_FILE: "the decision configuration"}


def _no_goldens(card: dict[str, Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class FamilyCard:
    """What the package reader knows of one family's cards, supplied by the family's registry entry.

    ``kinds``: each kind the family serves and the surfaces it fixes; ``schema``: a JSON Schema
    fragment (``allOf`` rules and the ``$defs`` they refer to) its cards must meet too; ``check``: the
    rules between members a schema cannot express (raises PackageError); ``files``: the files its
    packages hold besides each variant's graph and golden (path -> what it is); ``goldens``: further
    golden files the reader checks are readable without pickle.
    """

    kinds: Mapping[str, tuple[str, ...]]
    schema: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[dict[str, Any]], None] | None = None
    files: Callable[[dict[str, Any]], dict[str, str]] = tokenizer_files
    goldens: Callable[[dict[str, Any]], list[str]] = _no_goldens


def schema_fragment(path: Path) -> dict[str, Any]:
    """A family's card schema fragment (``families/<family>/card.schema.json``)."""
    fragment: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return fragment


class CardRules:
    """The card rules of every served family (family name -> :class:`FamilyCard`), composed once
    into one validator with card.schema.json."""

    def __init__(self, families: Mapping[str, FamilyCard]) -> None:
        self.families = dict(families)
        owners = [kind for card in self.families.values() for kind in card.kinds]
        if len(set(owners)) != len(owners):
            raise ValueError(f"a kind belongs to one family: {owners}")

    @cached_property
    def kind_surfaces(self) -> dict[str, tuple[str, ...]]:
        """kind -> the surfaces it serves, for every family's kinds."""
        return {kind: surfaces for card in self.families.values() for kind, surfaces in card.kinds.items()}

    def schema(self) -> dict[str, Any]:
        """card.schema.json with the families filled in: the family and kind names, each family's
        kinds, each kind's surfaces, and each family's own rules."""
        schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
        schema["properties"]["family"] = {"enum": list(self.families)}
        schema["properties"]["kind"] = {"enum": list(self.kind_surfaces)}
        rules: list[dict[str, Any]] = []
        for name, card in self.families.items():
            kinds = list(card.kinds)
            rules.append({"if": {"properties": {"family": {"const": name}}, "required": ["family"]},
                          "then": {"properties": {"kind": {"const": kinds[0]} if len(kinds) == 1
                                                  else {"enum": kinds}}}})
        for kind, surfaces in self.kind_surfaces.items():
            rules.append({"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
                          "then": {"properties": {"surfaces": {"const": list(surfaces)}}}})
        for card in self.families.values():
            rules += copy.deepcopy(card.schema.get("allOf", []))
            schema["$defs"].update(copy.deepcopy(card.schema.get("$defs", {})))
        schema["allOf"] = rules
        return schema

    @cached_property
    def validator(self) -> jsonschema.protocols.Validator:
        """The validator of :meth:`schema`, checked once."""
        schema = self.schema()
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema)


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
    def golden_class(self) -> str:
        """The architecture class the goldens were recorded on (engine/cpu.py); x86_64 for cards older
        than the ``goldens`` member, all converted on x86."""
        return str(self.raw.get("goldens", {}).get("arch_class", DEFAULT_GOLDEN_CLASS))

    @property
    def question_types(self) -> tuple[str, ...]:
        """The decision question types the card lists (empty for models without decisions)."""
        return tuple(self.raw.get("question_types", ()))


def _where(error: jsonschema.ValidationError) -> str:
    path = "/".join(str(p) for p in error.absolute_path)
    return f" (at {path})" if path else ""


def validate_card(obj: Any, rules: CardRules) -> None:
    """Validate a card object against card.schema.json composed with the served families' ``rules``,
    then its family's checks and the rules between members every card has.

    Raises PackageError naming card.json with the first (most relevant) problem.
    """
    errors = list(rules.validator.iter_errors(obj))
    # identity first: a wrong family or kind explains the other mismatches that follow from it
    first = [e for e in errors if list(e.absolute_path)[:1] in (["format"], ["family"], ["kind"])]
    error = jsonschema.exceptions.best_match(first or errors)
    if error is not None:
        raise PackageError(CARD_FILE, f"{error.message}{_where(error)}")
    check = rules.families[obj["family"]].check
    if check is not None:
        check(obj)
    _check_consistency(obj)


def _check_consistency(card: dict[str, Any]) -> None:
    """Rules between members every card has that JSON Schema does not express."""
    def bad(reason: str) -> PackageError:
        return PackageError(CARD_FILE, reason)

    files = [v["file"] for v in card["variants"].values()]
    goldens = [v["golden"] for v in card["variants"].values()]
    if len(set(files)) != len(files) or len(set(goldens)) != len(goldens):
        raise bad("variants must name distinct graph and golden files")
    limits = card["limits"]
    if "truncate_tokens" in limits and limits["truncate_tokens"] > limits["max_input_tokens"]:
        raise bad("limits.truncate_tokens exceeds limits.max_input_tokens")


def parse_card(data: bytes, rules: CardRules) -> Card:
    """Parse and validate the bytes of card.json under the served families' ``rules``."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(CARD_FILE, f"not valid JSON: {e}") from None
    validate_card(obj, rules)
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
