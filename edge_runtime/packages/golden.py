"""golden.npz: recorded inputs and outputs of one graph variant, for the self-check at start.

Arrays are named ``"{i}/in/{input}"`` and ``"{i}/out/{output}"``; each case is one row (batch 1).
Files are written byte-for-byte deterministically (fixed zip timestamps, sorted names) so that the
same model gives the same package digest, and read with ``allow_pickle=False``.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_KEY = re.compile(r"^(\d+)/(in|out)/([A-Za-z0-9_.:\-]+)$")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class GoldenCase:
    """One recorded case: the graph feeds and the outputs the variant produced for them."""

    feeds: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]


def golden_bytes(cases: Iterable[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]) -> bytes:
    """Serialise cases into the bytes of a golden npz file (uncompressed, deterministic)."""
    arrays: dict[str, np.ndarray] = {}
    for i, (feeds, outputs) in enumerate(cases):
        if not feeds or not outputs:
            raise ValueError(f"golden case {i} needs at least one input and one output")
        for kind, group in (("in", feeds), ("out", outputs)):
            for name, value in group.items():
                arr = np.ascontiguousarray(np.asarray(value))
                if arr.dtype.hasobject:
                    raise ValueError(f"golden case {i} {kind} {name!r} has dtype object")
                if arr.ndim == 0 or arr.shape[0] != 1:
                    raise ValueError(f"golden case {i} {kind} {name!r} must be one row (batch 1), shape {arr.shape}")
                key = f"{i}/{kind}/{name}"
                if not _KEY.match(key):
                    raise ValueError(f"golden array name {key!r} is not allowed")
                arrays[key] = arr
    return npz_bytes(arrays)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The bytes of an npz file of ``arrays`` that depend on nothing else: names sorted, fixed zip
    timestamps, no compression, no pickles (np.savez stamps the time, so a package's digest would
    change with every conversion). Every npz a package holds is written by this function."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            member = io.BytesIO()
            np.lib.format.write_array(member, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def read_golden(path: Path) -> list[GoldenCase]:
    """Read a golden npz file; raises ValueError on a malformed file (never unpickles)."""
    cases: dict[int, GoldenCase] = {}
    with np.load(path, allow_pickle=False) as npz:
        for key in npz.files:
            m = _KEY.match(key)
            if not m:
                raise ValueError(f"unexpected array {key!r}")
            i, kind, name = int(m.group(1)), m.group(2), m.group(3)
            case = cases.setdefault(i, GoldenCase({}, {}))
            (case.feeds if kind == "in" else case.outputs)[name] = npz[key]
    if not cases:
        raise ValueError("no cases")
    if sorted(cases) != list(range(len(cases))):
        raise ValueError(f"case numbers are not 0..{len(cases) - 1}")
    for i, case in cases.items():
        if not case.feeds or not case.outputs:
            raise ValueError(f"case {i} lacks inputs or outputs")
    return [cases[i] for i in range(len(cases))]


#: How far a self-check's outputs may be from the recording, by the device that runs the graph:
#: the contract's CPU bound, and CUDA's (TF32 off; with TF32 on the tiny fixtures used 8.8e-3).
#: Every graph of every family is checked against this one table.
GOLDEN_TOLERANCE = {"cpu": 1e-3, "cuda": 0.02}

#: The architecture class goldens were recorded on when a card does not say (engine/cpu.py
#: ARCH_CLASSES; packages older than the card's ``goldens`` member were all converted on x86).
DEFAULT_GOLDEN_CLASS = "x86_64"

#: How far a CPU's outputs may be from goldens recorded on another architecture class, per pair of
#: classes (either way round), and where the number comes from. The integer products of the exact int8
#: variants are the same on every class; the float operations around them (LayerNorm, Softmax, GELU)
#: round a few ULP differently, and per-token activation quantization turns such a difference into a
#: changed uint8 code now and then, whose effect cascades through the later layers
#: (docs/reference/arm64-notes.md §3.3). Measured by scripts/cpu_class_check.py --arch aarch64 under
#: QEMU 7.2 against goldens converted on x86 (docs/deployment.md, "ARM64 nodes"): cortex-a72 and
#: neoverse-n1 on both defaults and every fixture kind, max with SVE on the MiniLM int8 default.
CROSS_CLASS_TOLERANCE: dict[frozenset[str], tuple[float, str]] = {
    frozenset({"x86_64", "aarch64"}): (0.1, "measured under QEMU: worst 0.057 (a codes fixture's int8; "
                                            "MiniLM int8 0.04), x1.75"),
    frozenset({"x86_64", "aarch64-sve"}): (0.1, "measured under QEMU: worst 0.0102 (MiniLM int8); "
                                                "the aarch64 pair's bound"),
    frozenset({"aarch64", "aarch64-sve"}): (0.1, "bounded by the two x86_64 pairs"),
}


def golden_tolerance(device: str) -> float:
    """The self-check tolerance on ``device`` (an unknown accelerator gets CUDA's)."""
    return GOLDEN_TOLERANCE.get(device, GOLDEN_TOLERANCE["cuda"])


def check_tolerance(device: str, made_on: str, running_on: str) -> tuple[float, str]:
    """The tolerance of a self-check of goldens recorded on class ``made_on``, run on ``device`` of class
    ``running_on``, and its basis: the device's own on an accelerator or on the recording's class, else
    the class pair's measured one (an unmeasured pair keeps the CPU's same-class bound, and says so)."""
    if device != "cpu" or made_on == running_on:
        return golden_tolerance(device), f"{device}: the recording's class" if device == "cpu" else device
    pair = CROSS_CLASS_TOLERANCE.get(frozenset({made_on, running_on}))
    if pair is None:
        return golden_tolerance(device), f"{made_on} -> {running_on}: not measured; the same-class bound"
    return pair[0], f"{made_on} -> {running_on}: {pair[1]}"


def self_check(session: Any, cases: Sequence[GoldenCase], device: str, what: str = "golden",
               made_on: str = DEFAULT_GOLDEN_CLASS) -> dict[str, Any]:
    """Run every case twice on ``session`` (anything with ``run(feeds, names)``): bitwise deterministic,
    finite, of the recorded shape, and within the tolerance of the recording (:func:`check_tolerance`:
    the device's, or on a CPU of another architecture class than the goldens' ``made_on``, the pair's).
    The session's ``arch_class`` (engine GraphSession) names its class; a session without one counts
    as of the recording's class.

    Returns ``{"status": "passed", "max_abs_diff", "cases", "tolerance", "golden_class",
    "checked_on", "tolerance_basis"}``, ``{"status": "unverified"}`` without cases, or
    ``{"status": "failed", "reason", ...}``; ``what`` names the graph in the reason.
    """
    if not cases:
        return {"status": "unverified"}
    running_on = getattr(session, "arch_class", made_on)
    tolerance, basis = check_tolerance(device, made_on, running_on)
    stated = {"tolerance": tolerance, "golden_class": made_on,
              "checked_on": running_on if device == "cpu" else device, "tolerance_basis": basis}
    worst = 0.0
    for i, case in enumerate(cases):
        names = list(case.outputs)
        first, second = session.run(case.feeds, names), session.run(case.feeds, names)
        for name in names:
            if not np.array_equal(first[name], second[name]):
                return {"status": "failed", "reason": f"{what} case {i} output {name} is not deterministic"}
            got = np.asarray(first[name], dtype=np.float64)
            want = np.asarray(case.outputs[name], dtype=np.float64)
            if got.shape != want.shape or not np.all(np.isfinite(got)):
                return {"status": "failed", "reason": f"{what} case {i} output {name} has the wrong shape or NaN"}
            worst = max(worst, float(np.max(np.abs(got - want))) if got.size else 0.0)
    if worst > tolerance:
        on = f"{running_on} (goldens from {made_on})" if device == "cpu" and made_on != running_on else device
        return {"status": "failed", "max_abs_diff": worst, **stated,
                "reason": f"{what} outputs differ by {worst:.3g}, above {tolerance:g} on {on}"}
    return {"status": "passed", "max_abs_diff": worst, "cases": len(cases), **stated}


def require_passed(result: dict[str, Any]) -> dict[str, Any]:
    """The result of a self-check that must pass (a graph other than the model's main one): a
    failure raises RuntimeError, and the model fails to load with its reason."""
    if result["status"] == "failed":
        raise RuntimeError(f"self-check failed: {result['reason']}")
    return result
