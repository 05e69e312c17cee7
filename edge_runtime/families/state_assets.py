"""A request's assets as the families that read images in the state only use them (decision-vision,
decision3): parsed once per request, a use in a state becoming one more image after the entry's
``images`` (``[image k]`` where it was), a use in a question refused, every use recorded, and every asset
used by the end of planning (edge_runtime.media.assets holds the contract's rules for the values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edge_runtime.media.assets import Assets, check_all_used, parse_assets, state_with_assets
from edge_runtime.questions import InvalidQuestion, Question
from edge_runtime.requests.decisions import DecisionsRequest, DecisionState


class StateAssets:
    """The assets of one request (none unless the model reads images) and the references used so far."""

    def __init__(self, request: DecisionsRequest, max_bytes: int | None) -> None:
        """``max_bytes``: the model's image_max_bytes, None for a model that reads no images (its
        planning refuses the request's assets without reading them)."""
        self.assets: Assets | None = None
        if request.assets and max_bytes is not None:
            self.assets = parse_assets(request.assets, max_bytes)
        self.used: list[str] = []

    def state(self, entry: DecisionState) -> tuple[Any, list[str]]:
        """The entry's state with its uses replaced, and those uses in order (each one more image)."""
        return state_with_assets(entry.state, len(entry.images), self.assets, self.used)

    def images(self, uses: Sequence[str]) -> list[bytes]:
        """The image bytes of the state's uses, in order."""
        return [] if self.assets is None else [self.assets.images[r] for r in uses]

    def question_refusal(self, model: str, q: Question) -> InvalidQuestion | None:
        """question_images_unsupported for a question whose instructions or options use an asset:
        moving its image into the shared state would change the other answers."""
        if self.assets is None:
            return None
        refs = self.assets.used_in([q.instructions, *(o.description for o in q.options)])
        if not refs:
            return None
        self.used.extend(refs)  # referenced, so not unreferenced, though this question cannot read it
        return InvalidQuestion(q.id, q.type, "question_images_unsupported",
                               f"model {model!r} reads images in the state only (image_placements: state); "
                               "put an image the questions share in the state")

    def check_all_used(self) -> None:
        """asset_unreferenced for an asset that no string of the request used."""
        if self.assets is not None:
            check_all_used(self.assets, self.used)


__all__ = ["StateAssets"]
