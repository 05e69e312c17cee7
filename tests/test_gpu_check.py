"""scripts/gpu_check.py, the one-command GPU check, run against the CPU itself (every difference 0)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.support.server_harness import ROOT


def test_the_gpu_check_runs_against_the_cpu(fixture_package: Callable[..., Path]) -> None:
    packages = [fixture_package("embedding"), fixture_package("decision-codes")]
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu",
                             "--packages", *map(str, packages)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.startswith("== ")] == [f"== {p.name}" for p in packages]
    assert sum("ready; self-check passed" in line and "(exact)" in line for line in lines) == 4
    assert sum(line.endswith("max|d| 0") for line in lines) == 4  # CPU against itself, alone and batched
    assert sum("forward of 32 rows" in line for line in lines) == 2
