"""Fixtures of the reliability tests: the sparrow-nano package and per-module server starters."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.support import StartServer
from tests.support.server_harness import Server, write_models_file


@pytest.fixture(scope="session")
def sparrow_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sparrow-nano decisions package, built once per session (about a second)."""
    from converters.sparrow.export import build_sparrow_package

    return build_sparrow_package(tmp_path_factory.mktemp("reliability-sparrow"))


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartServer]:
    """``start_server(models, *flags)``: a ready server of its own; every one is stopped after the module."""
    started: list[Server] = []

    def start(models: list[dict[str, Any]], *flags: str) -> Server:
        root = tmp_path_factory.mktemp("reliability-server")
        srv = Server(write_models_file(root / "models.yaml", models), *flags)
        started.append(srv)
        srv.wait()
        return srv

    yield start
    for srv in started:
        srv.stop()
