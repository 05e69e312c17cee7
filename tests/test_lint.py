"""The code passes the project's ruff rules and mypy's type check (pyproject.toml [tool.ruff], [tool.mypy])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.server_harness import ROOT


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is pinned in the test extra"
    return found


def test_ruff_passes() -> None:
    result = subprocess.run([_tool("ruff"), "check", "edge_runtime", "converters", "bench", "tests"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_passes() -> None:
    # The files and per-library settings are pyproject.toml's; no module is exempt.
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
