"""Which family serves a package: the card's ``family`` names one entry here.

Adding a family is adding its folder and one entry to :data:`FAMILIES`: its class, the models.yaml
settings it takes, its cards (kinds, schema, checks, files; the package reader asks here, it names no
family itself) and which graphs its packages hold beside their variant's (the loader opens and
self-checks them); the runtime never asks a family what it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime import packages
from edge_runtime.config import ModelConfig
from edge_runtime.families.base import Graph, ModelFamily, open_graphs
from edge_runtime.families.decision2 import family as decision2
from edge_runtime.families.decision3 import family as decision3
from edge_runtime.families.decision_codes import family as decision_codes
from edge_runtime.families.decision_plan import SURFACE as DECISIONS
from edge_runtime.families.decision_vision import family as decision_vision
from edge_runtime.families.encoder import card as encoder_card
from edge_runtime.families.encoder import family as encoder
from edge_runtime.families.multimodal_embedding import card as multimodal_card
from edge_runtime.families.multimodal_embedding import family as multimodal_embedding
from edge_runtime.families.sparrow import family as sparrow
from edge_runtime.families.task_heads import card as task_heads_card
from edge_runtime.families.task_heads import family as task_heads
from edge_runtime.families.vela2 import family as vela2
from edge_runtime.packages import CardRules, FamilyCard, Package, PackageError, decision_files

#: The models.yaml settings (ModelConfig attributes) a family's class may take as keywords.
SETTINGS = ("name", "max_input_tokens", "max_scan_tokens")


def _no_graphs(package: Package) -> list[Graph]:
    return []


def decision_card(kind: str) -> FamilyCard:
    """The cards of a decision family of one kind: the decisions surface, a tokenizer and
    decision_config.json."""
    return FamilyCard(kinds={kind: (DECISIONS,)}, files=decision_files)


@dataclass(frozen=True)
class FamilySpec:
    """A family: its class, built as ``family(package, session, **settings, opened=graphs)``; the
    models.yaml settings it takes (of :data:`SETTINGS`); its cards; and the graphs its packages hold
    beside their variant's (``opened`` is passed only to a family that has some)."""

    family: Callable[..., ModelFamily]
    card: FamilyCard
    settings: tuple[str, ...] = ("name", "max_input_tokens")
    graphs: Callable[..., list[Graph]] = _no_graphs
    #: ``graphs`` takes the served variant too (``graphs(package, variant)``): a package holding a graph
    #: per variant of each of its parts (multimodal towers)
    variant_graphs: bool = False

    @property
    def windows(self) -> bool:
        """Reads long inputs in windows, so limits.max_scan_tokens applies."""
        return "max_scan_tokens" in self.settings

    def build(self, package: Package, session: Any, opened: Mapping[str, Any], config: ModelConfig) -> ModelFamily:
        """The loaded family of one models.yaml entry, over its variant's session and the package's
        other graphs, opened and self-checked by the loader."""
        kwargs: dict[str, Any] = {setting: getattr(config, setting) for setting in self.settings}
        if self.graphs is not _no_graphs:
            kwargs["opened"] = opened
        return self.family(package, session, **kwargs)


FAMILIES: dict[str, FamilySpec] = {
    "encoder": FamilySpec(encoder.EncoderFamily, encoder_card.CARD, ("max_input_tokens", "max_scan_tokens")),
    "task-heads": FamilySpec(task_heads.TaskHeadsFamily, task_heads_card.CARD, ("max_input_tokens", "max_scan_tokens")),
    "sparrow": FamilySpec(sparrow.SparrowFamily, decision_card("sparrow"), ("name",), sparrow.graphs),
    "decision-codes": FamilySpec(decision_codes.DecisionCodesFamily, decision_card("decision-codes")),
    "multimodal-embedding": FamilySpec(multimodal_embedding.MultimodalEmbeddingModel, multimodal_card.CARD,
                                       ("max_input_tokens",), multimodal_embedding.graphs, variant_graphs=True),
    "vela2": FamilySpec(vela2.Vela2Family, decision_card("vela2"), ("name", "max_scan_tokens")),
    "decision2": FamilySpec(decision2.Decision2Family, decision_card("decision2")),
    "decision-vision": FamilySpec(decision_vision.DecisionVisionFamily, decision_card("decision-vision"),
                                  graphs=decision_vision.graphs),
    "decision3": FamilySpec(decision3.Decision3Family, decision_card("decision3"), graphs=decision3.graphs),
}

#: Every served family's card rules: what the package reader and the package writer check cards with.
CARD_RULES = CardRules({name: spec.card for name, spec in FAMILIES.items()})


def read_package(path: Path) -> Package:
    """Verify the package at ``path`` (edge_runtime.packages.read_package) under every served family's
    card rules; PackageError names what is wrong."""
    return packages.read_package(path, CARD_RULES)


def validate_card(obj: Any) -> None:
    """Validate a card object under every served family's card rules; PackageError if it is wrong."""
    packages.validate_card(obj, CARD_RULES)


def family_spec(package: Package, config: ModelConfig) -> FamilySpec:
    """The spec of ``package``'s family; refuses a family this runtime does not serve, and settings
    the family does not read."""
    family = package.card.family
    spec = FAMILIES.get(family)
    if spec is None:
        raise PackageError("card.json", f"family {family!r} is not served by this runtime "
                                        f"(it serves {', '.join(sorted(FAMILIES))})")
    if config.max_scan_tokens is not None and not spec.windows:
        raise ValueError(f"limits.max_scan_tokens applies to models that read inputs in windows; "
                         f"the {family} family does not")
    return spec


def build_family(package: Package, session: Any, config: ModelConfig) -> tuple[ModelFamily, dict[str, dict[str, Any]]]:
    """The family of ``package`` over its variant's session and every other graph of the package,
    opened on the session's device and threads and self-checked; returns it and each graph's check.
    A graph whose golden fails raises RuntimeError."""
    spec = family_spec(package, config)
    graphs = spec.graphs(package, config.variant) if spec.variant_graphs else spec.graphs(package)
    opened, checks = open_graphs(package, graphs, session)
    return spec.build(package, session, opened, config), checks
