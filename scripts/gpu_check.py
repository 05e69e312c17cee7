"""One command for a person with a GPU: load every fixture kind on CUDA and on the CPU, and compare.

    .venv/bin/python scripts/gpu_check.py                 # fixtures of every kind, built into .cache/gpu-check
    .venv/bin/python scripts/gpu_check.py --packages DIR  # packages you already have

Per package it prints, for each device, the load status, the golden self-check's difference, the
batching mode the load-time probe proved (the grouping, and whether numerics stay exact), the
providers ONNX Runtime runs and their options; then the largest difference between the two devices'
raw outputs on the same probe rows (the family's own random rows, seeded alike), and the forward
time of 32 rows batched as the probe allows against one at a time. ``--device cpu`` runs the same
check against the CPU itself (every difference 0), which is how the test suite keeps this script
working on machines without a GPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edge_runtime.config import ModelConfig  # noqa: E402
from edge_runtime.engine.batching import BatchLimits, plan_batch  # noqa: E402
from edge_runtime.engine.probe import max_abs_diff  # noqa: E402
from edge_runtime.loading import ServedModel, load_model  # noqa: E402

#: every kind `python -m converters fixture` writes a served package for
FIXTURE_KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank",
                 "decision-codes", "image-text-embedding", "audio-embedding", "vela2", "decision2", "decision-vision")
PROBE_LENGTHS = (3, 9, 17, 40, 64)


def build_fixtures(out: Path) -> list[Path]:
    """Every fixture kind under ``out`` (built once; the converter extra must be installed)."""
    packages = []
    for kind in FIXTURE_KINDS:
        target = out / kind
        if not (target / "MANIFEST.json").is_file():
            subprocess.run([sys.executable, "-m", "converters", "fixture", "--kind", kind, "--out", str(target)],
                           cwd=ROOT, check=True)
        packages.append(target)
    return packages


def _arrays(output: Any) -> list[np.ndarray]:
    """Every numeric array in one row's output, in a fixed order (dicts by key, sequences in order)."""
    if isinstance(output, np.ndarray):
        return [output] if output.dtype.kind in "fiub" else []
    if isinstance(output, dict):
        return [a for key in sorted(output) for a in _arrays(output[key])]
    if isinstance(output, (list, tuple)):
        return [a for item in output for a in _arrays(item)]
    if hasattr(output, "__dict__"):
        return _arrays(vars(output))
    return []


def _load(package: Path, device: str) -> ServedModel:
    model = ServedModel(ModelConfig(name=package.name, package=package, device=device, threads=None))
    load_model(model)
    return model


def _rows(model: ServedModel, count: int) -> list[Any]:
    assert model.family is not None
    limit = model.family.max_input_tokens
    return [model.family.probe_row(min(PROBE_LENGTHS[i % len(PROBE_LENGTHS)], limit)) for i in range(count)]


def _batched(model: ServedModel, rows: list[Any]) -> list[Any]:
    """The rows' outputs, run in the forwards the executor would make of them under its grouping."""
    assert model.family is not None and model.grouping is not None and model.executor is not None
    forward = model.executor.forward  # bucketed where the probe chose fixed-shape buckets
    lengths = [forward.length(r) for r in rows]
    outputs: list[Any] = [None] * len(rows)
    pending = list(range(len(rows)))
    while pending:
        chosen = plan_batch([lengths[i] for i in pending], model.grouping, BatchLimits(), True,
                            model.executor.buckets)
        picked = [pending[k] for k in chosen]
        for i, out in zip(picked, forward([rows[i] for i in picked])):
            outputs[i] = out
        pending = [i for i in pending if i not in set(picked)]
    return outputs


def _trial(trial: dict[str, Any]) -> str:
    shape = f" widths {trial['widths']} rows {trial['rows']}" if "widths" in trial else ""
    return f"{trial['grouping']}{shape} {'exact' if trial['exact'] else 'not exact'} max|d| {trial['max_abs_diff']}"


def _timed(run: Any) -> float:
    run()  # warm
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def check(package: Path, device: str) -> list[str]:
    """The report lines of one package, loaded on the CPU and on ``device``."""
    lines = [f"== {package.name}"]
    loaded = [_load(package, "cpu"), _load(package, device)]  # two loads: each family's probe rows start alike
    for dev, model in zip(("cpu", device), loaded):
        args = model.session.engine_args if model.session is not None else {}
        lines.append(f"  {dev}: {model.status}{' (' + model.reason + ')' if model.reason else ''}; "
                     f"self-check {model.self_check.get('status')} max|d| {model.self_check.get('max_abs_diff')}; "
                     f"grouping {model.grouping} ({model.numerics}); providers {args.get('providers')}")
        if model.probe is not None:  # every grouping the probe tried, exact or by how much not
            lines.append(f"    probe: {'; '.join(_trial(t) for t in model.probe.describe())}")
    cpu, other = loaded
    if cpu.status != "ready" or other.status != "ready":
        return lines
    assert cpu.family is not None and other.family is not None
    rows_cpu, rows_other = _rows(cpu, 8), _rows(other, 8)
    alone_cpu = [cpu.family.forward([r])[0] for r in rows_cpu]
    alone_other = [other.family.forward([r])[0] for r in rows_other]
    lines.append(f"  {device} vs cpu, rows alone: max|d| {max_abs_diff(alone_other, alone_cpu):.3g}")
    assert other.executor is not None
    served_alone = [other.executor.forward([r])[0] for r in rows_other]  # a bucket's shape, where bucketed
    lines.append(f"  {device} batched vs alone: max|d| {max_abs_diff(_batched(other, rows_other), served_alone):.3g}")
    rows = _rows(other, 32)
    batched_s = _timed(lambda: _batched(other, rows))
    single_s = _timed(lambda: [other.family.forward([r]) for r in rows])  # type: ignore[union-attr]
    lines.append(f"  {device} forward of 32 rows: {batched_s * 1000:.1f} ms as grouped, "
                 f"{single_s * 1000:.1f} ms one at a time")
    for model in loaded:
        if model.executor is not None:
            model.executor.close()
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--packages", nargs="*", type=Path, help="packages to check (default: every fixture kind)")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "gpu-check", help="where fixtures are built")
    args = parser.parse_args(argv)
    packages = args.packages or build_fixtures(args.out)
    for package in packages:
        print("\n".join(check(package, args.device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
