"""int8 exactness on another CPU class: an AVX2-only CPU, emulated by QEMU's user-mode emulator.

ONNX Runtime picks its integer GEMM kernel from CPUID; under ``qemu-x86_64 -cpu EPYC-Rome`` (AVX2, no
AVX-512, no VNNI) it runs the U8S8 AVX2 kernel whose 16-bit pair sums saturate, the kernel of the
low-footprint edge nodes. The script first shows that this kernel is the one running (a weight of 127
saturates as on a real AVX2 EPYC), then checks a package converted on this machine: exact integer
products and its golden self-check, recorded here, passing there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from converters.quantize import Int8Recipe, check_integer_products
from edge_runtime.families.registry import read_package
from tests.support.server_harness import ROOT

SCRIPT = ROOT / "scripts" / "cpu_class_check.py"


def _recipe(package_dir: Path) -> Int8Recipe:
    return Int8Recipe.from_card(read_package(package_dir).card.raw["variants"]["int8"]["recipe"])


def test_a_weight_past_the_recipe_bound_is_caught(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    """The check can fail: one int8 weight widened to 127 (a recipe that could saturate) is named."""
    package = read_package(fixture_package("embedding", quantize=True))
    model = onnx.load(str(package.graph("int8")))
    node = next(n for n in model.graph.node if n.op_type == "MatMulIntegerToFloat")
    init = next(t for t in model.graph.initializer if t.name == node.input[1])
    w = numpy_helper.to_array(init).copy()
    w.flat[0] = 127
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    with pytest.raises(ValueError, match="bounds"):
        check_integer_products(tampered, package.file("tokenizer.json"), _recipe(package.path))


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                    reason="qemu-x86_64 is not installed (scripts/test.sh installs Debian's qemu-user)")
def test_int8_fixture_is_exact_and_passes_its_goldens_on_an_avx2_only_cpu(
        fixture_package: Callable[..., Path]) -> None:
    package = fixture_package("embedding", quantize=True)
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "EPYC-Rome", str(package)],
                          capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout)
    features = report["cpu_features"]
    assert features["AVX2"] and not features["AVX512F"], features  # the emulated class, not this host's
    assert not any(v for k, v in features.items() if "VNNI" in k), features
    # the emulator runs ONNX Runtime's saturating AVX2 kernel, so what follows is a real proof
    assert report["pair_sums"] == {"weight_127": 1_048_544, "weight_64": 255 * 64 * 64, "saturates": True,
                                   "weight_64_exact": True}
    checked = report["packages"][str(package)]
    assert checked["integer_products"]["int8"]["gemms"] > 0
    assert checked["integer_products"]["int8"]["max_relative_error"] <= 1e-6
    assert checked["served"]["variants"]["int8"] == {"status": "ready", "self_check": "passed"}
    assert checked["served"]["passed"] and done.returncode == 0, done.stderr[-2000:]
