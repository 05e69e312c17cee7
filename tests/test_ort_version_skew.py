"""scripts/ort_version_skew.py, which measures what the GPU image's onnxruntime version changes on the CPU."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.scripts import load_script
from tests.support.server_harness import ROOT

SCRIPT = ROOT / "scripts" / "ort_version_skew.py"


def _facts(outputs: list[Any], status: str = "ready", grouping: str = "padded", **extra: Any) -> dict[str, Any]:
    return {"status": status, "reason": None, "self_check": "passed", "self_check_max_abs_diff": 0.0,
            "grouping": grouping, "numerics": "exact", "outputs": outputs, **extra}


def test_the_skew_check_of_one_interpreter_against_itself_finds_no_difference(
        fixture_package: Callable[..., Path]) -> None:
    package = fixture_package("embedding", quantize=True)  # fp32 and the exact int8 variant
    result = subprocess.run([sys.executable, str(SCRIPT), "--python", sys.executable, "--packages", str(package)],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    variants = [line for line in lines if line.startswith(f"{package.name}/")]
    assert [line.split(":", 1)[0] for line in variants] == [f"{package.name}/fp32", f"{package.name}/int8"]
    assert all("max|d| 0 (bit-identical)" in line and "A ready" in line and "B ready" in line for line in variants)
    assert variants[1].count("integer products under") == 2 and "FAILED" not in variants[1]
    assert lines[-1].endswith("largest output difference between the versions: 0")


def test_the_comparison_reports_a_difference_and_fails_on_a_changed_probe_or_status() -> None:
    skew = load_script(SCRIPT)
    row = [np.array([1.0, 2.0], np.float32)]
    moved = [np.array([1.0, 2.5], np.float32)]
    a: dict[str, Any] = {"onnxruntime": "1.32.0", "variants": {"p/fp32": _facts(row)}}
    b: dict[str, Any] = {"onnxruntime": "1.31.1", "variants": {"p/fp32": _facts(moved)}}
    lines, ok = skew.compare(a, b)
    assert ok  # a difference is reported, not judged
    assert "A vs B on 1 rows (2 values): max|d| 0.5" in lines[1] and "bit-identical" not in lines[1]
    assert lines[-1].endswith("largest output difference between the versions: 0.5")

    b["variants"]["p/fp32"] = _facts(row, grouping="alone")
    assert not skew.compare(a, b)[1]
    b["variants"]["p/fp32"] = _facts([], status="failed")
    assert not skew.compare(a, b)[1]
    b["variants"]["p/fp32"] = _facts(row, integer_products={"error": "saturated"})
    lines, ok = skew.compare(a, b)
    assert not ok and "integer products under 1.31.1: FAILED saturated" in lines[1]
    # outputs with no numbers in them prove nothing
    a["variants"]["p/fp32"] = b["variants"]["p/fp32"] = _facts([{"label": "x"}])
    assert not skew.compare(a, b)[1]
