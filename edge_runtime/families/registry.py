"""Which family serves a package: the card's ``family`` names one entry here.

Adding a family is adding its folder and one entry to :data:`FAMILIES`: how to build it and which
graphs its packages hold beside their variant's (the loader opens and self-checks them); the
runtime never asks a family what it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_runtime.config import ModelConfig
from edge_runtime.families.base import Graph, ModelFamily, open_graphs
from edge_runtime.families.decision2 import family as decision2
from edge_runtime.families.decision3 import family as decision3
from edge_runtime.families.decision_codes import family as decision_codes
from edge_runtime.families.decision_vision import family as decision_vision
from edge_runtime.families.encoder import family as encoder
from edge_runtime.families.multimodal_embedding import family as multimodal_embedding
from edge_runtime.families.sparrow import family as sparrow
from edge_runtime.families.vela2 import family as vela2
from edge_runtime.packages import Package, PackageError

#: ``build(package, session, opened, config)``: the loaded family of one models.yaml entry, over its
#: variant's session and the package's other graphs, opened and self-checked by the loader.
Build = Callable[[Package, Any, Mapping[str, Any], ModelConfig], ModelFamily]


def _no_graphs(package: Package) -> list[Graph]:
    return []


@dataclass(frozen=True)
class FamilySpec:
    """How to build a family, the graphs its packages hold beside their variant's, and which
    models.yaml settings it reads."""

    build: Build
    graphs: Callable[[Package], list[Graph]] = _no_graphs
    windows: bool = False  # reads long inputs in windows, so limits.max_scan_tokens applies


FAMILIES: dict[str, FamilySpec] = {
    "encoder": FamilySpec(
        lambda package, session, opened, config: encoder.EncoderFamily(
            package, session, config.max_input_tokens, config.max_scan_tokens),
        windows=True,
    ),
    "sparrow": FamilySpec(
        lambda package, session, opened, config: sparrow.SparrowFamily(
            package, session, name=config.name, opened=opened),
        graphs=sparrow.graphs,
    ),
    "decision-codes": FamilySpec(
        lambda package, session, opened, config: decision_codes.DecisionCodesFamily(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
    "multimodal-embedding": FamilySpec(
        lambda package, session, opened, config: multimodal_embedding.MultimodalEmbeddingModel(
            package, session, max_input_tokens=config.max_input_tokens, opened=opened),
        graphs=multimodal_embedding.graphs,
    ),
    "vela2": FamilySpec(
        lambda package, session, opened, config: vela2.Vela2Family(
            package, session, name=config.name, max_scan_tokens=config.max_scan_tokens),
        windows=True,
    ),
    "decision2": FamilySpec(
        lambda package, session, opened, config: decision2.Decision2Family(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
    "decision-vision": FamilySpec(
        lambda package, session, opened, config: decision_vision.DecisionVisionFamily(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens, opened=opened),
        graphs=decision_vision.graphs,
    ),
    "decision3": FamilySpec(
        lambda package, session, opened, config: decision3.Decision3Family(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
}


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
    opened, checks = open_graphs(package, spec.graphs(package), session)
    return spec.build(package, session, opened, config), checks
