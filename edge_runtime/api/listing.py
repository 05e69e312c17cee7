"""GET /v1/models as the wire shows it: every model's card and state, the decision models in the
System One SDK's shape (with aliases as their own entries under vllm-sr/5.0), and the limits."""

from __future__ import annotations

from typing import Any

from edge_runtime import API_VERSION
from edge_runtime.loading import ServedModel
from edge_runtime.runtime import Runtime


def list_models(runtime: Runtime) -> dict[str, Any]:
    """GET /v1/models: each model's card and state, the decision models in the SDK's shape, the limits."""
    data = [_card(m, runtime.config.max_inputs, runtime.versions.get(m.name, ())) for m in runtime.models.values()]
    extended = runtime.config.systemone_schema == "vllm-sr/5.0"
    decision = []
    for m in runtime.models.values():
        if m.package is not None and "decisions" in m.package.card.surfaces:
            entry = _decision_model(m, extended)
            decision.append(entry)
            if extended:  # as System One lists jev-latest beside the versioned ids
                decision.extend({**entry, "name": alias, "alias_of": m.name} for alias in m.config.aliases)
    return {
        "object": "list",
        "api_version": API_VERSION,
        "data": data,
        "models": decision,
        "limits": {
            "max_bundle_tasks": runtime.config.max_bundle_tasks,
            "max_request_bytes": runtime.config.max_request_bytes,
            "max_inputs": runtime.config.max_inputs,
        },
    }


def _card(model: ServedModel, max_inputs: int, versions: tuple[ServedModel, ...] = ()) -> dict[str, Any]:
    """One model's entry in ``data``: its card and state, its aliases, its versions (resident and
    recently released: edge_runtime/updates), and in its limits the most inputs one request may
    carry (the Router sizes the classify calls it fuses by it)."""
    entry = {**model.info(), "aliases": list(model.config.aliases),
             "versions": [v.version() for v in (versions or (model,))]}
    if "limits" in entry:
        entry["limits"] = {**entry["limits"], "max_inputs": max_inputs}
    return entry


def _decision_model(model: ServedModel, extended: bool) -> dict[str, Any]:
    """A decision model as the System One SDKs read it; vllm-sr/5.0 adds version, features and card."""
    assert model.package is not None
    card = model.package.card
    entry: dict[str, Any] = {"name": model.name, "description": card.description, "release_date": card.release_date}
    if extended:
        question_types = list(card.question_types)
        features = question_types + [m for m in card.modalities if m != "text"]
        if card.raw.get("usage") == "state_once":
            features.append("state_once")
        if "validated_input_tokens" in card.limits:
            features.append("long_context")
        entry.update(
            version=card.version,
            features=features,
            card={
                "family": card.family,
                "question_types": question_types,
                "presets": list(card.raw.get("presets") or ()),
                "modalities": list(card.modalities),
                "usage": card.raw.get("usage", "per_question"),
                "limits": dict(card.limits),
                "revision": card.revision,
                "model_sha256": model.package.digest,
            },
        )
    return entry
