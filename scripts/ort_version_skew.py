"""What two ONNX Runtime versions change on the CPU: the GPU image's onnxruntime-gpu against the CPU pin.

    .venv/bin/python scripts/ort_version_skew.py --python /tmp/ort1311/bin/python
    .venv/bin/python scripts/ort_version_skew.py --python A/bin/python --python B/bin/python --packages DIR...

onnxruntime-gpu has no release of the CPU pin's version (the GPU image runs 1.31.1, the project pins
1.32.0), and its CPU provider is the same code as onnxruntime of its own version, so an environment
with ``onnxruntime==1.31.1`` measures on any CPU what the version skew costs. Each interpreter needs
the server's dependencies with the onnxruntime to compare, and ``onnx`` (before onnxruntime 1.27 also
``sympy``) for the int8 check; this tree goes on its PYTHONPATH. Each loads every variant of every
package on the CPU as the server does and reports: its onnxruntime version, the load status, the golden
self-check's largest difference, the grouping the batch-invariance probe proved, and the outputs of
probe rows run alone; for an exact int8 variant also the integer-products check (every integer GEMM
against exact numpy arithmetic). The first interpreter draws the probe rows and the second runs the
same rows, so the largest raw-output difference between the versions is on identical inputs. With one
``--python`` the other is this interpreter. Default packages: a fixture of every kind
scripts/gpu_check.py builds (in its cache) and the default packages under models/ where they exist.

Exit status 0 when every variant loaded ready under both versions with the same grouping and numerics,
and every int8 integer check passed under both; the differences are reported, not judged.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

#: the default packages `python -m converters default` writes, checked where they have been converted
DEFAULT_PACKAGES = ("minilm-embedding", "sparrow-nano")
#: rows per variant, drawn by the family's own probe_row at these token lengths (as gpu_check does)
ROW_LENGTHS = (3, 9, 17, 40, 64, 5, 23, 128)


def default_packages(fixtures: Path, models: Path) -> list[Path]:
    """A fixture of every kind (built into ``fixtures`` if missing) and the converted default packages."""
    from gpu_check import build_fixtures

    found = build_fixtures(fixtures)
    return found + [models / name for name in DEFAULT_PACKAGES if (models / name / "MANIFEST.json").is_file()]


def _variant_report(package: Path, variant: str, rows: list[Any] | None) -> tuple[dict[str, Any], list[Any]]:
    """One variant loaded on the CPU: its load facts and its outputs on ``rows`` (drawn here when None)."""
    from edge_runtime.config import ModelConfig
    from edge_runtime.loading import ServedModel, load_model

    model = ServedModel(ModelConfig(name=package.name, package=package, variant=variant, device="cpu"))
    load_model(model)
    facts: dict[str, Any] = {"status": model.status, "reason": model.reason,
                             "self_check": model.self_check.get("status"),
                             "self_check_max_abs_diff": model.self_check.get("max_abs_diff"),
                             "grouping": model.grouping, "numerics": model.numerics}
    outputs: list[Any] = []
    if model.status == "ready" and model.family is not None:
        if rows is None:
            limit = model.family.max_input_tokens
            rows = [model.family.probe_row(min(n, limit)) for n in ROW_LENGTHS]
        facts["rows"] = rows
        outputs = [model.family.forward([row])[0] for row in rows]
    if model.executor is not None:
        model.executor.close()
    return facts, outputs


def worker(packages: Sequence[Path], result_file: Path, rows_file: Path | None) -> None:
    """Measure every variant of ``packages`` under this interpreter's onnxruntime; pickle to ``result_file``.

    ``rows_file``: the other interpreter's result, whose probe rows this run reuses (same inputs)."""
    import onnxruntime
    from cpu_class_check import _integer_checks

    from edge_runtime.families.registry import read_package

    given = pickle.loads(rows_file.read_bytes())["variants"] if rows_file is not None else {}
    variants: dict[str, dict[str, Any]] = {}
    for package in packages:
        card = read_package(package).card.raw
        integer = _integer_checks(package) if (package / "tokenizer.json").is_file() else {}
        for variant in sorted(card["variants"]):
            key = f"{package.name}/{variant}"
            rows = given[key].get("rows") if key in given else None
            facts, outputs = _variant_report(package, variant, rows)
            facts["outputs"] = outputs
            if variant in integer:
                facts["integer_products"] = integer[variant]
            variants[key] = facts
            print(f"[{onnxruntime.__version__}] {key}: {facts['status']}, self-check "
                  f"{facts['self_check_max_abs_diff']}, {facts['grouping']} ({facts['numerics']})",
                  file=sys.stderr, flush=True)
    result_file.write_bytes(pickle.dumps({"onnxruntime": onnxruntime.__version__, "variants": variants}))


def _run_worker(python: str, packages: Sequence[Path], result_file: Path, rows_file: Path | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [python, str(Path(__file__).resolve()), "--worker", str(result_file), *(
        ["--rows", str(rows_file)] if rows_file is not None else []), "--packages", *map(str, packages)]
    if subprocess.run(cmd, cwd=ROOT, env=env).returncode != 0:
        raise SystemExit(f"ort_version_skew: the measurement under {python} failed (its error is above)")
    found: dict[str, Any] = pickle.loads(result_file.read_bytes())
    return found


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[list[str], bool]:
    """The report lines of two workers' results, and whether every variant agreed in status and probe."""
    from gpu_check import _arrays

    from edge_runtime.engine.probe import bitwise_equal, max_abs_diff

    va, vb = a["onnxruntime"], b["onnxruntime"]
    lines = [f"onnxruntime {va} (A) against {vb} (B), CPU provider"]
    ok = True
    worst_output = 0.0
    worst_check = {va: 0.0, vb: 0.0}
    for key in a["variants"]:
        x, y = a["variants"][key], b["variants"][key]
        same_probe = (x["grouping"], x["numerics"]) == (y["grouping"], y["numerics"])
        ok = ok and x["status"] == y["status"] == "ready" and same_probe
        line = (f"{key}: A {x['status']} self-check {x['self_check_max_abs_diff']} {x['grouping']} ({x['numerics']}); "
                f"B {y['status']} self-check {y['self_check_max_abs_diff']} {y['grouping']} ({y['numerics']})")
        for version, facts in ((va, x), (vb, y)):
            if isinstance(facts["self_check_max_abs_diff"], (int, float)):
                worst_check[version] = max(worst_check[version], float(facts["self_check_max_abs_diff"]))
        if x["outputs"] and y["outputs"]:
            diff = max_abs_diff(x["outputs"], y["outputs"])
            identical = all(bitwise_equal(p, q) for p, q in zip(x["outputs"], y["outputs"]))
            # a comparison of no numbers would prove nothing: count what was compared
            values = sum(a.size for out in x["outputs"] for a in _arrays(out))
            ok = ok and values > 0
            worst_output = max(worst_output, diff)
            line += (f"; A vs B on {len(x['outputs'])} rows ({values} values): max|d| {diff:.3g}"
                     f"{' (bit-identical)' if identical else ''}")
        for version, facts in ((va, x), (vb, y)):
            if "integer_products" in facts:
                check = facts["integer_products"]
                ok = ok and "error" not in check
                line += f"; integer products under {version}: " + (
                    f"FAILED {check['error']}" if "error" in check else
                    f"exact ({check['gemms']} GEMMs, {check['rows']} rows, "
                    f"max rel err {check['max_relative_error']:.3g})")
        lines.append(line)
    lines.append(f"largest self-check difference: {va} {worst_check[va]:.3g}, {vb} {worst_check[vb]:.3g}; "
                 f"largest output difference between the versions: {worst_output:.3g}")
    return lines, ok


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", default=[],
                        help="an interpreter to compare (twice, or once against this one)")
    parser.add_argument("--packages", nargs="*", type=Path,
                        help="packages to compare (default: every fixture kind and models/'s defaults)")
    parser.add_argument("--fixtures", type=Path, default=ROOT / ".cache" / "gpu-check", help="where fixtures are built")
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="where the default packages are")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.packages, args.worker, args.rows)
        return 0
    pythons = args.python if len(args.python) == 2 else [*args.python, sys.executable]
    if len(pythons) != 2:
        parser.error("give --python once or twice")
    packages = [p.resolve() for p in (args.packages or default_packages(args.fixtures, args.models))]
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "a.pickle"
        a = _run_worker(pythons[0], packages, first, None)
        b = _run_worker(pythons[1], packages, Path(tmp) / "b.pickle", first)
    lines, ok = compare(a, b)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
