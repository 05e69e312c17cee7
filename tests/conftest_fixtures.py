"""Session-wide package fixtures: tiny random-weight packages per kind, and the MiniLM package.

Imported by tests/conftest.py. Packages are built once per test session under a session temp
directory, through the same converter path as real models.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

# converters must never reach the network from tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

__all__ = ["fixture_package", "minilm_package", "pytest_configure"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers these fixtures' tests use."""
    config.addinivalue_line("markers", "minilm: uses the real all-MiniLM-L6-v2 package (runs in the normal suite)")


@pytest.fixture(scope="session")
def fixture_package(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """A factory ``fixture_package(kind, quantize=False) -> Path`` of cached fixture packages (seed 0)."""
    from converters.fixture import build_fixture

    root = tmp_path_factory.mktemp("fixture-packages")
    cache: dict[tuple[str, bool], Path] = {}

    def get(kind: str, quantize: bool = False) -> Path:
        key = (kind, bool(quantize))
        if key not in cache:
            out = root / (f"{kind}-int8" if quantize else kind)
            cache[key] = build_fixture(kind, out, seed=0, quantize=bool(quantize))
        return cache[key]

    return get


@pytest.fixture(scope="session")
def minilm_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default minilm-embedding package (fp32 + int8), built once per session."""
    from converters.default import MINILM_NAME, build_minilm

    root = tmp_path_factory.mktemp("default-packages")
    build_minilm(root)
    return root / MINILM_NAME
