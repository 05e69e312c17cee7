"""Are a package's int8 variants exact, and do its goldens hold, on this CPU class or an emulated one?

    python scripts/cpu_class_check.py [--cpu EPYC-Rome] PACKAGE...

With ``--cpu MODEL`` the script runs itself again under QEMU's user-mode emulator (``qemu-x86_64 -cpu
MODEL``; Debian's ``qemu-user``), which executes ONNX Runtime's own kernels as that CPU would:
ONNX Runtime chooses kernels from CPUID, which QEMU answers for the model. ``EPYC-Rome`` has AVX2
and no AVX-512 and no VNNI, the class of the low-footprint edge nodes, where ONNX Runtime's U8S8
GEMM sums u8 x s8 products in 16-bit pairs (vpmaddubsw) that saturate. The report first shows that the
emulation reaches that kernel: a weight of 127 against 64 activation codes of 255 saturates (1,048,544
for 2,072,640, as on a real 2-core AVX2 AMD EPYC), and a weight of 64 does not.

Then, per package: every int8 variant's integer GEMMs checked against exact numpy integer arithmetic
on real sentences (converters.quantize.check_integer_products), and every variant loaded as the
server loads it (``python -m edge_runtime check``): the golden self-check against the goldens the
converting machine recorded, and the batch-invariance probe. Prints one JSON report; exits 0 when
every check passed. Emulation is slow (the int8 MiniLM loads in about 70 s instead of 1 s).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: The CPU features the report names (numpy reads them with CPUID, so an emulated CPU reports its own).
FEATURES = ("AVX2", "FMA3", "AVX512F", "AVX512_VNNI", "AVX512VNNI", "AVXVNNI", "AVX512_BF16", "AMX_INT8")


def cpu_features() -> dict[str, bool]:
    """Which of FEATURES this CPU (or the emulated one) has, as numpy's dispatcher sees them."""
    from numpy._core._multiarray_umath import __cpu_features__ as found

    return {name: bool(found[name]) for name in FEATURES if name in found}


def pair_sum_probe() -> dict[str, int]:
    """ONNX Runtime's MatMulInteger of 64 activations of 255 against weights of 127 and of 64.

    The exact products are 2,072,640 and 1,044,480; a kernel with 16-bit pair sums returns 1,048,544 for
    the first (each pair 2 x 255 x 127 = 64,770 saturates at 32,767) and the exact second (32,640 fits).
    """
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "pair_sums",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 64]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [64, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    a = np.full((1, 64), 255, np.uint8)
    return {f"weight_{w}": int(session.run(None, {"a": a, "b": np.full((64, 16), w, np.int8)})[0][0, 0])
            for w in (127, 64)}


def _integer_checks(package_dir: Path) -> dict[str, Any]:
    from converters.quantize import Int8Recipe, check_integer_products
    from edge_runtime.families.registry import read_package

    package = read_package(package_dir)
    found: dict[str, Any] = {}
    for variant, entry in package.card.raw["variants"].items():
        if entry.get("quantization") != "per-token":
            continue
        recipe = Int8Recipe.from_card(entry["recipe"])
        try:
            found[variant] = check_integer_products(package.graph(variant), package.file("tokenizer.json"), recipe)
        except ValueError as exc:
            found[variant] = {"error": str(exc)}
    return found


def _served_checks(package_dir: Path) -> dict[str, Any]:
    """Each variant loaded as the server loads it: golden self-check and probe (edge_runtime check)."""
    from edge_runtime.cli import main as edge_runtime_main
    from edge_runtime.families.registry import read_package

    variants = sorted(read_package(package_dir).card.raw["variants"])
    lines = "".join(f"  - name: {v}\n    package: {package_dir.resolve()}\n    variant: {v}\n    device: cpu\n"
                    for v in variants)
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models.yaml"
        models.write_text("models:\n" + lines)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = edge_runtime_main(["check", "--models", str(models)])
    rows = [line.split("\t") for line in out.getvalue().splitlines() if line.count("\t") >= 2]
    return {"passed": code == 0, "variants": {r[0]: {"status": r[1], "self_check": r[2]} for r in rows}}


def report(packages: list[Path]) -> dict[str, Any]:
    """The JSON report of this CPU: features, the pair-sum probe, and each package's checks."""
    probe = pair_sum_probe()
    result: dict[str, Any] = {
        "cpu_features": cpu_features(),
        "pair_sums": {**probe, "saturates": probe["weight_127"] != 255 * 127 * 64,
                      "weight_64_exact": probe["weight_64"] == 255 * 64 * 64},
        "packages": {},
    }
    for p in packages:
        result["packages"][str(p)] = {"integer_products": _integer_checks(p), "served": _served_checks(p)}
    return result


def passed(found: dict[str, Any]) -> bool:
    """Every integer check exact and every variant ready."""
    return found["pair_sums"]["weight_64_exact"] and all(
        pkg["served"]["passed"] and not any("error" in v for v in pkg["integer_products"].values())
        for pkg in found["packages"].values())


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", type=Path, help="converted package directories")
    parser.add_argument("--cpu", help="run under qemu-x86_64 with this CPU model (e.g. EPYC-Rome)")
    args = parser.parse_args(argv)
    if args.cpu:
        qemu = shutil.which("qemu-x86_64")
        if qemu is None:
            print("error: --cpu needs qemu-x86_64 (Debian: apt-get install qemu-user)", file=sys.stderr)
            return 2
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [qemu, "-cpu", args.cpu, sys.executable, str(Path(__file__).resolve()),
               *[str(p) for p in args.packages]]
        # QEMU warns once per CPUID feature TCG cannot emulate (rdseed, sha-ni, ...): none is an int8 path
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stderr.write("".join(line for line in done.stderr.splitlines(keepends=True)
                                 if "TCG doesn't support" not in line))
        sys.stdout.write(done.stdout)
        return done.returncode
    found = report(args.packages)
    print(json.dumps(found, indent=1))
    return 0 if passed(found) else 1


if __name__ == "__main__":
    sys.exit(main())
