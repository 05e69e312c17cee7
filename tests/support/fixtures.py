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
    """A factory ``fixture_package(kind, quantize=False) -> Path`` of cached fixture packages (seed 0).

    quantize: False, True (the exact ``int8`` variant) or a variant name such as ``int8-dynamic``.
    ``vela2`` is the converted Vela 2.0 fixture; ``vela2-source`` the upstream-format package it was
    converted from; likewise ``decision2`` / ``decision2-source`` (qwen-full) and ``decision2-lora`` /
    ``decision2-lora-source`` (qwen-adapter, base at ``<source>-base``); ``task-<layout>`` is the task-heads
    package of a catalogue layout (converters/task_heads/fixture.py LAYOUTS), ``task-<layout>-source`` its
    source.
    """
    from converters.encoder.fixture import build_fixture

    root = tmp_path_factory.mktemp("fixture-packages")
    cache: dict[tuple[str, str | None], Path] = {}

    def get(kind: str, quantize: bool | str = False) -> Path:
        variant = "int8" if quantize is True else (quantize or None)
        key = (kind, variant)
        if kind in ("vela2", "vela2-source") and key not in cache:
            cache[("vela2-source", None)], cache[("vela2", None)] = _vela2(root)
        if kind in _DECISION2 and key not in cache:
            cache[key] = _decision2(root, kind)
        if kind.startswith("task-") and key not in cache:
            from converters.task_heads.fixture import build_fixture_result, write_source

            layout = kind.removeprefix("task-").removesuffix("-source")
            if ("task-" + layout + "-source", None) not in cache:
                cache[("task-" + layout + "-source", None)] = write_source(layout, root / f"task-{layout}-source")
            if not kind.endswith("-source"):
                cache[key] = build_fixture_result(layout, root / kind).path
        if key not in cache:
            out = root / (f"{kind}-{variant}" if variant else kind)
            if kind == "decision-codes":
                from converters.decision_codes.fixture import build_decision_codes_fixture

                cache[key] = build_decision_codes_fixture(out, seed=0, quantize=variant)
            else:
                cache[key] = build_fixture(kind, out, seed=0, quantize=variant)
        return cache[key]

    return get


#: The vela2 test fixture reads 1,024 tokens per sequence (the upstream recipe's 2,048 makes every
#: windowed request 2x dearer; the golden request needs about 830). Windows, cuts and head: same code.
VELA2_TEST_MAX_LENGTH = 1024


def _vela2(root: Path) -> tuple[Path, Path]:
    """The upstream-format Vela 2.0 source fixture, and the package `export --kind vela2` makes of it
    (its parity check runs the golden request and 50 generated ones)."""
    from converters.vela2.export import Vela2Options, export_vela2
    from converters.vela2.fixture import write_source_fixture

    src = write_source_fixture(root / "vela2-source", seed=0, max_length=VELA2_TEST_MAX_LENGTH)
    opts = Vela2Options(name="fixture-vela2", description="Tiny random-weight Vela 2.0 fixture (seed 0)",
                        version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
                        source_name="edge-runtime fixture vela2-tiny (seed 0)", check_requests=50)
    export_vela2(src, root / "vela2", opts)
    return src, root / "vela2"


_DECISION2 = ("decision2", "decision2-source", "decision2-lora", "decision2-lora-source")


def _decision2(root: Path, kind: str) -> Path:
    """Decision 2.0 fixtures: the upstream-format sources (qwen-full; qwen-adapter with its base at
    ``<path>-base``) and the packages `export --kind decision2` makes of them."""
    from converters.decision2.export import Decision2Options, export_decision2
    from converters.decision2.fixture import write_decision2_fixture

    lora = kind.startswith("decision2-lora")
    src = root / ("decision2-lora-source" if lora else "decision2-source")
    if not src.exists():
        write_decision2_fixture(src, seed=0, adapter=lora)
    if kind.endswith("-source"):
        return src
    out = root / ("decision2-lora" if lora else "decision2")
    opts = Decision2Options(name=f"fixture-{kind}", description="Tiny random-weight Decision 2.0 fixture (seed 0)",
                            version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
                            source_name=f"edge-runtime fixture {kind} (seed 0)")
    export_decision2(src, out, opts)
    return out


@pytest.fixture(scope="session")
def minilm_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default minilm-embedding package (fp32 + int8), built once per session."""
    from converters.default import MINILM_NAME, build_minilm

    root = tmp_path_factory.mktemp("default-packages")
    build_minilm(root)
    return root / MINILM_NAME
