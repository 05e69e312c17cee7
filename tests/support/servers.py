"""Session servers over the fixture packages, started once and shared by the server tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_harness import Server, write_models_file

ENCODER_KINDS = {
    "emb": "embedding",
    "cls": "sequence-classification",
    "ml": "multi-label",
    "tok": "token-classification",
    "rr": "rerank",
}


@pytest.fixture(scope="session")
def encoder_models(fixture_package: Callable[..., Path]) -> list[dict[str, Any]]:
    """models.yaml entries for every encoder kind, plus a one-slot queue model for overload tests."""
    models = [{"name": name, "package": str(fixture_package(kind)), "device": "cpu", "threads": 1}
              for name, kind in ENCODER_KINDS.items()]
    models.append({"name": "emb-int8", "package": str(fixture_package("embedding", quantize=True)),
                   "variant": "int8", "device": "cpu", "threads": 1})
    models.append({"name": "emb-q1", "package": str(fixture_package("embedding")), "device": "cpu",
                   "threads": 1, "max_queue": 1})
    return models


@pytest.fixture(scope="session")
def server(encoder_models: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server over every encoder fixture, ready before the first test that uses it."""
    models_file = write_models_file(tmp_path_factory.mktemp("server") / "models.yaml", encoder_models)
    srv = Server(models_file, "--max-request-bytes", "1048576", "--max-bundle-tasks", "8")
    try:
        srv.wait()
        yield srv
    finally:
        srv.stop()
