"""One server for the whole Router-conformance suite: the embedded defaults and a fixture of every
encoder kind and decision family, with a small bundle cap so that the Router's split is exercised."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.router import api
from tests.router.goshapes import decode
from tests.support.server_harness import Server, write_models_file

#: --max-bundle-tasks of the suite's server: small, so that a stage of the Router's splits.
BUNDLE_CAP = 4

#: Served name -> role. Encoder fixtures cover sequence (with pairs), multi-label, token (with grounded
#: items), rerank, text and image-text embeddings; decision fixtures cover every family.
ENCODERS = {"emb": "embedding", "cls": "sequence-classification", "ml": "multi-label",
            "tok": "token-classification", "rr": "rerank"}
DECIDERS = {"sparrow-nano": "sparrow", "codes": "decision-codes", "decision2": "decision2", "vela2": "vela2",
            "vision": "decision-vision"}
#: Task-heads fixtures shaped like the Router's own Vela 1.0 specialists (converters/task_heads/fixture.py):
#: an operating point's windows and thresholds, grounded spans, 2D Matryoshka exits, per-exit pair scorers.
TASK_HEADS = {"vela-hazard": "task-hazard", "vela-halu": "task-halu", "vela-emb": "task-embedding",
              "vela-rr": "task-reranker"}
EMBEDDERS = ("minilm-embedding", "emb", "siglip", "vela-emb")
RERANKERS = ("rr", "vela-rr")


@dataclass
class Router:
    """The suite's server, its decoded /v1/models and /health, as the Router first reads them."""

    server: Server
    raw_models: dict[str, Any]

    @property
    def models(self) -> api.ModelList:
        """/v1/models as ``api.ModelList`` (a DecodeError here is the Router failing ``Client.Models``)."""
        return decode(api.ModelList, self.raw_models)

    def card(self, name: str) -> api.ModelCard:
        """The card whose id is ``name`` (group.go ``refresh`` keys cards by id)."""
        for card in self.models.data or []:
            if card.id == name:
                return card
        raise AssertionError(f"/v1/models has no card {name!r}: {[c.id for c in self.models.data or []]}")


@pytest.fixture(scope="session")
def router_models(fixture_package: Callable[..., Path], minilm_package: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """models.yaml entries: the embedded defaults as models.yaml serves them, then the fixtures."""
    from converters.decision_vision.fixture import build_decision_vision_fixture_result
    from converters.multimodal.fixture import build_multimodal_fixture
    from converters.sparrow.export import build_sparrow_package

    root = tmp_path_factory.mktemp("router-packages")
    packages = {
        "minilm-embedding": (minilm_package, {"variant": "int8"}),
        "sparrow-nano": (build_sparrow_package(root / "sparrow"), {"variant": "fp32", "aliases": ["jev-latest"]}),
        "siglip": (build_multimodal_fixture("siglip", root / "siglip").path, {}),
        "vision": (build_decision_vision_fixture_result(root / "vision").path, {}),
    }
    for name, kind in {**ENCODERS, **TASK_HEADS, "codes": "decision-codes", "decision2": "decision2",
                       "vela2": "vela2"}.items():
        packages[name] = (fixture_package(kind), {})
    return [{"name": name, "package": str(path), "device": "cpu", "threads": 1, **extra}
            for name, (path, extra) in packages.items()]


@pytest.fixture(scope="session")
def router(router_models: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """The server, started once, ready before the first test; /v1/models decoded the Router's way."""
    models_file = write_models_file(tmp_path_factory.mktemp("router-server") / "models.yaml", router_models)
    srv = Server(models_file, "--max-bundle-tasks", str(BUNDLE_CAP), "--max-request-bytes", str(8 << 20))
    try:
        srv.wait()
        listed = srv.client.get("/v1/models")
        assert listed.status_code == 200, listed.text
        yield Router(srv, listed.json())
    finally:
        srv.stop()
