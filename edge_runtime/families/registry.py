"""Which family serves a package: the card's ``family`` names one entry here.

Adding a family is adding its module and one line to :data:`FAMILIES`; the runtime never asks a
family what it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edge_runtime.config import ModelConfig
from edge_runtime.families.base import ModelFamily
from edge_runtime.families.decision2.family import Decision2Family
from edge_runtime.families.decision_codes.family import DecisionCodesFamily
from edge_runtime.families.decision_vision.family import DecisionVisionFamily
from edge_runtime.families.encoder.family import EncoderFamily
from edge_runtime.families.multimodal_embedding.family import MultimodalEmbeddingModel
from edge_runtime.families.sparrow.family import SparrowFamily
from edge_runtime.families.vela2.family import Vela2Family
from edge_runtime.packages import Package, PackageError

#: ``build(package, session, config)``: the loaded family of one models.yaml entry.
Build = Callable[[Package, Any, ModelConfig], ModelFamily]


@dataclass(frozen=True)
class FamilySpec:
    """How to build a family, and which models.yaml settings it reads."""

    build: Build
    windows: bool = False  # reads long inputs in windows, so limits.max_scan_tokens applies


FAMILIES: dict[str, FamilySpec] = {
    "encoder": FamilySpec(
        lambda package, session, config: EncoderFamily(
            package, session, config.max_input_tokens, config.max_scan_tokens),
        windows=True,
    ),
    "sparrow": FamilySpec(lambda package, session, config: SparrowFamily(package, session, name=config.name)),
    "decision-codes": FamilySpec(
        lambda package, session, config: DecisionCodesFamily(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
    "multimodal-embedding": FamilySpec(
        lambda package, session, config: MultimodalEmbeddingModel(
            package, session, max_input_tokens=config.max_input_tokens),
    ),
    "vela2": FamilySpec(
        lambda package, session, config: Vela2Family(
            package, session, name=config.name, max_scan_tokens=config.max_scan_tokens),
        windows=True,
    ),
    "decision2": FamilySpec(
        lambda package, session, config: Decision2Family(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
    "decision-vision": FamilySpec(
        lambda package, session, config: DecisionVisionFamily(
            package, session, name=config.name, max_input_tokens=config.max_input_tokens),
    ),
}


def build_family(package: Package, session: Any, config: ModelConfig) -> ModelFamily:
    """The family of ``package`` over its loaded session; refuses settings the family does not read."""
    family = package.card.family
    spec = FAMILIES.get(family)
    if spec is None:
        raise PackageError("card.json", f"family {family!r} is not served by this runtime "
                                        f"(it serves {', '.join(sorted(FAMILIES))})")
    if config.max_scan_tokens is not None and not spec.windows:
        raise ValueError(f"limits.max_scan_tokens applies to models that read inputs in windows; "
                         f"the {family} family does not")
    return spec.build(package, session, config)
