"""int8 exactness, goldens and batch invariance on other CPU classes, emulated by QEMU's user-mode emulator
(scripts/cpu_class_check.py runs the checks; it says how each class is emulated).

- x86, AVX2 only (``qemu-x86_64 -cpu EPYC-Rome``): ONNX Runtime runs the U8S8 AVX2 kernel whose 16-bit pair
  sums saturate, the kernel of the low-footprint edge nodes; a weight of 127 saturates as on a real AVX2
  EPYC, and a package converted here has exact integer products and passes its goldens there.
- ARM (``--arch aarch64``, chroot into an aarch64 userland): plain NEON (cortex-a72: the X8S8 kernel whose
  pair sums wrap for code 0 against weight -128), UDOT (neoverse-n1), I8MM without SVE (max,sve=off), and
  I8MM with SVE (max). On the cores without SVE the softmax's tail makes padding change a row; rows padded
  to the row multiple answer alike alone and batched. Goldens recorded here pass with the class pair's
  tolerance.

The default suite runs one package per architecture (the int8 embedding fixture: AVX2-only and plain
NEON, the classes nearest a kernel's limits) when the emulator is there, and says why it skipped
otherwise: scripts/test.sh installs qemu-user for x86; the aarch64 userland is built by
`make arm64-userland` (scripts/arm64_userland.sh, about 5 minutes as root), never by the default suite.
`make test-heavy` runs every ARM class on the default models and a fixture of every kind, against the
same probe rows run natively here.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import numpy_helper

from converters.quantize import Int8Recipe, check_integer_products
from converters.small_forward import bodies
from edge_runtime.engine import cpu
from edge_runtime.engine.probe import bitwise_equal
from edge_runtime.families.registry import read_package
from edge_runtime.packages.golden import check_tolerance
from tests.support.scripts import load_script
from tests.support.server_harness import ROOT

SCRIPT = ROOT / "scripts" / "cpu_class_check.py"
CHECK = load_script(SCRIPT)
ARM_CPUS: dict[str, str] = CHECK.ARM_CPUS
ARM_MISSING = CHECK.arm64_missing(CHECK.DEFAULT_ARM64_ROOT)
needs_arm = pytest.mark.skipif(ARM_MISSING is not None, reason=f"aarch64 emulation: {ARM_MISSING}")
#: per emulated ARM class: its architecture class, and whether ONNX Runtime runs the plain-NEON X8S8 kernel
ARM_CLASSES = {"neon": ("aarch64", True), "udot": ("aarch64", False), "i8mm": ("aarch64", False),
               "sve": ("aarch64-sve", False)}


def _recipe(package_dir: Path) -> Int8Recipe:
    return Int8Recipe.from_card(read_package(package_dir).card.raw["variants"]["int8"]["recipe"])


#: The longest one check may run: QEMU runs SVE's vector instructions a lane at a time, and the whole table
#: under the SVE class took more than an hour on 2 shared cores (2026-12-06).
CHECK_LIMIT_S = 7200


def _check(*args: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=CHECK_LIMIT_S)
    assert done.stdout.startswith("{"), done.stderr[-3000:]
    return json.loads(done.stdout), done


def test_a_weight_past_the_recipe_bound_is_caught(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    """The check can fail: one int8 weight widened to 127 (a recipe that could saturate) is named."""
    package = read_package(fixture_package("embedding", quantize=True))
    model = onnx.load(str(package.graph("int8")))
    node = next(n for body in bodies(model) for n in body.graph.node if n.op_type == "MatMulIntegerToFloat")
    init = next(t for t in model.graph.initializer if t.name == node.input[1])
    w = numpy_helper.to_array(init).copy()
    w.flat[0] = 127
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    with pytest.raises(ValueError, match="bounds"):
        check_integer_products(tampered, package.file("tokenizer.json"), _recipe(package.path))


def _assert_served(variants: dict[str, Any], checked_on: str, row_multiple: int) -> None:
    """Every variant ready, its goldens (recorded here) passed with the class pair's tolerance, its rows
    batched as the probe proved with every trial of that grouping exact."""
    for name, v in variants.items():
        check = v["self_check"]
        assert v["status"] == "ready" and check["status"] == "passed", (name, v)
        assert (check["golden_class"], check["checked_on"]) == (cpu.arch_class(), checked_on), check
        assert check["tolerance"] == check_tolerance("cpu", cpu.arch_class(), checked_on)[0], check
        assert v["row_multiple"] == row_multiple and v["numerics"] == "exact", v
        if v["grouping"] != "alone":
            assert all(t["exact"] for t in v["probe"] if t["grouping"] == v["grouping"]), v["probe"]


@pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                    reason="qemu-x86_64 is not installed (scripts/test.sh installs Debian's qemu-user)")
def test_int8_fixture_is_exact_and_passes_its_goldens_on_an_avx2_only_cpu(
        fixture_package: Callable[..., Path]) -> None:
    package = fixture_package("embedding", quantize=True)
    # the int8 variant alone: the class's own kernels are the integer ones (emulation is ~15x slower)
    report, done = _check("--cpu", "EPYC-Rome", "--variant", "int8", str(package))
    features = report["cpu_features"]
    assert features["AVX2"] and not features["AVX512F"], features  # the emulated class, not this host's
    assert not any(v for k, v in features.items() if "VNNI" in k), features
    # the emulator runs ONNX Runtime's saturating AVX2 kernel, so what follows is a real proof
    assert report["pair_sums"] == {"weight_127": 1_048_544, "weight_64": 255 * 64 * 64, "saturates": True,
                                   "weight_64_exact": True}
    checked = report["packages"][str(package)]
    assert checked["integer_products"]["int8"]["gemms"] > 0
    assert checked["integer_products"]["int8"]["max_relative_error"] <= 1e-6
    _assert_served(checked["variants"], "x86_64", 1)
    assert set(checked["variants"]) == {"int8"} and checked["variants"]["int8"]["grouping"] == "padded"
    assert done.returncode == 0, done.stderr[-2000:]


@needs_arm
def test_int8_fixture_on_plain_neon_is_exact_batches_exactly_and_passes_its_goldens(
        fixture_package: Callable[..., Path]) -> None:
    package = fixture_package("embedding", quantize=True)
    report, done = _check("--arch", "aarch64", "--cpu", ARM_CPUS["neon"], str(package))
    assert (report["machine"], report["arch_class"], report["row_multiple"]) == ("aarch64", "aarch64", 8)
    assert report["cpu_features"] == []  # ARMv8.0: no dot product, no I8MM, no SVE
    # ONNX Runtime runs the plain-NEON X8S8 kernel: code 0 against -128 wraps its 16-bit pair sums, the
    # recipe's bound of 64 does not; and its softmax rounds by the row's tail unless padded to 8
    assert report["arm_pair_sums"] == {"weight_128_negative": -2_097_152, "weight_64_negative": 0, "wraps": True,
                                       "weight_64_exact": True}
    assert report["softmax_tail"]["differ"] > 0 and report["softmax_tail"]["differ_padded_to_8"] == 0
    checked = report["packages"][str(package)]
    assert checked["integer_products"]["int8"]["gemms"] > 0
    assert checked["integer_products"]["int8"]["max_relative_error"] <= 1e-6
    _assert_served(checked["variants"], "aarch64", 8)
    assert {v["grouping"] for v in checked["variants"].values()} == {"padded"}
    assert done.returncode == 0, done.stderr[-2000:]


# ---- make test-heavy: every ARM class, the default models and a fixture of every kind ----------------------


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Path], dict[str, Any], Path]]:
    """The packages (fixtures of every kind, built once into .cache/cpu-classes, and the defaults, converted
    into models/ when missing), and their report and probe-row outputs on this CPU."""
    if ARM_MISSING is not None:
        pytest.skip(f"aarch64 emulation: {ARM_MISSING}")
    packages = CHECK.build_fixtures(ROOT / ".cache" / "cpu-classes")
    if not all((ROOT / "models" / name / "MANIFEST.json").is_file() for name in CHECK.DEFAULT_PACKAGES):
        subprocess.run([sys.executable, "-m", "converters", "default", "--out", str(ROOT / "models")],
                       cwd=ROOT, check=True)
    # resolved, as the script names them in its report (models/ may be a link)
    packages = [p.resolve() for p in [*packages, *(ROOT / "models" / name for name in CHECK.DEFAULT_PACKAGES)]]
    outputs = tmp_path_factory.mktemp("native") / "outputs.pickle"
    report, done = _check("--outputs", str(outputs), *map(str, packages))
    assert done.returncode == 0, done.stderr[-3000:]
    yield packages, report, outputs


@pytest.mark.heavy
@needs_arm
@pytest.mark.timeout(CHECK_LIMIT_S + 600)  # the check's own limit, and the native fixtures' build before it
@pytest.mark.parametrize("name", list(ARM_CPUS))
def test_every_kind_and_default_on_an_emulated_arm_class(name: str, native: tuple[list[Path], dict[str, Any], Path],
                                                         tmp_path: Path) -> None:
    packages, here, here_outputs = native
    arch, plain_neon = ARM_CLASSES[name]
    outputs = tmp_path / "outputs.pickle"
    report, done = _check("--arch", "aarch64", "--cpu", ARM_CPUS[name], "--rows", str(here_outputs),
                          "--outputs", str(outputs), *map(str, packages))
    assert report["arch_class"] == arch and report["row_multiple"] == cpu.row_multiple(arch)
    assert report["arm_pair_sums"]["wraps"] is plain_neon and report["arm_pair_sums"]["weight_64_exact"]
    assert (report["softmax_tail"]["differ"] > 0) is (arch == "aarch64")
    assert report["softmax_tail"]["differ_padded_to_8"] == 0
    ran = pickle.loads(outputs.read_bytes())
    across = CHECK.compare_outputs(pickle.loads(here_outputs.read_bytes()), ran)
    for package in map(str, packages):
        checked, native_variants = report["packages"][package], here["packages"][package]["variants"]
        assert not any("error" in v for v in checked["integer_products"].values()), checked["integer_products"]
        _assert_served(checked["variants"], arch, cpu.row_multiple(arch))
        for variant, v in checked["variants"].items():
            key = f"{Path(package).name}/{variant}"
            # the probe proves on this class what it proves natively: the same rows share a forward
            assert (v["grouping"], v["numerics"]) == (native_variants[variant]["grouping"], "exact"), (key, v)
            if ran[key]["batched"] is not None:  # the probe rows, all in one padded batch, as alone
                assert bitwise_equal(ran[key]["batched"], ran[key]["alone"]), key
            print(f"{name} {key}: self-check {v['self_check']['max_abs_diff']:.3g} (tolerance "
                  f"{v['self_check']['tolerance']:g}), outputs vs native {across[key]['max_abs_diff']:.3g}, "
                  f"grouping {v['grouping']}")
    assert done.returncode == 0, done.stderr[-3000:]
