"""Are a package's int8 variants exact, do its goldens hold and do its rows batch exactly, on this CPU
class or an emulated one?

    python scripts/cpu_class_check.py [--cpu EPYC-Rome] PACKAGE...
    python scripts/cpu_class_check.py --arch aarch64 --cpu cortex-a72 [--root DIR] PACKAGE...

With ``--cpu MODEL`` the script runs itself again under QEMU's user-mode emulator, which executes ONNX
Runtime's own kernels as that CPU would:

- x86 (``qemu-x86_64 -cpu MODEL``; Debian's ``qemu-user``): ONNX Runtime chooses kernels from CPUID,
  which QEMU answers for the model. ``EPYC-Rome`` has AVX2 and no AVX-512 and no VNNI, the class of the
  low-footprint edge nodes, where the U8S8 GEMM sums u8 x s8 products in 16-bit pairs (vpmaddubsw) that
  saturate: a weight of 127 against 64 activation codes of 255 saturates (1,048,544 for 2,072,640, as on
  a real 2-core AVX2 AMD EPYC), and a weight of 64 does not.
- aarch64 (``--arch aarch64``): chroot into an aarch64 userland (scripts/arm64_userland.sh builds one)
  with ``QEMU_CPU=MODEL``, in a private mount namespace holding only /proc and, at their own paths, this
  project and the packages: with the host's /sys visible ``import onnxruntime`` segfaults under
  qemu-user (pytorch/cpuinfo), without it ONNX Runtime reads the emulated CPU's HWCAP bits. Models
  (qemu 7.2): ``cortex-a72`` (plain NEON: the X8S8 kernel, whose 16-bit pair sums wrap for activation
  code 0 against weight -128), ``neoverse-n1`` (UDOT), ``max,sve=off`` (I8MM's UMMLA), ``max`` (I8MM and
  SVE, whose softmax needs no row multiple). The report shows which kernel ran: the wrap on plain NEON
  only, and the softmax's tail rounding (a row alone against the same row padded with masked values).

Then, per package: every int8 variant's integer GEMMs checked against exact numpy integer arithmetic
on real sentences (converters.quantize.check_integer_products), and every variant loaded as the
server loads it (edge_runtime.loading.load_model): the golden self-check against the goldens the
converting machine recorded (with the tolerance of its architecture-class pair), the batch-invariance
probe (its grouping and trials) and the row multiple. ``--outputs FILE`` also pickles each variant's
outputs on probe rows run alone and batched (``--rows FILE``: the rows of an earlier run's outputs,
so that two CPU classes are compared on identical inputs, by ``--compare A B``); ``--row-multiple N``
pads as a CPU class with that multiple would (the proof that padding changes no number here). Prints one JSON report;
exits 0 when every check passed. Emulation is slow: the int8 MiniLM loads in about 70 s instead of 1 s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's edge_runtime and converters, whatever the venv has installed
#: The x86 CPU features the report names (numpy reads them with CPUID, so an emulated CPU reports its own).
FEATURES = ("AVX2", "FMA3", "AVX512F", "AVX512_VNNI", "AVX512VNNI", "AVXVNNI", "AVX512_BF16", "AMX_INT8")
#: Where scripts/arm64_userland.sh builds the aarch64 userland unless told otherwise.
DEFAULT_ARM64_ROOT = Path(os.environ.get("EDGE_RUNTIME_ARM64_ROOT", "/var/cache/edge-runtime/arm64-root"))
#: The aarch64 CPU classes qemu 7.2 emulates, by the int8 kernel ONNX Runtime runs on them.
ARM_CPUS = {"neon": "cortex-a72", "udot": "neoverse-n1", "i8mm": "max,sve=off", "sve": "max"}
#: Probe rows per variant for --outputs: the family's own probe_row at these token lengths.
ROW_LENGTHS = (3, 9, 17, 40, 64, 5, 23, 128)
#: The task-heads fixtures checked: one layout per head kind the family reads (sequence, token BIO,
#: grounded runs, pooled 2D Matryoshka, relevance), each with its exact int8.
TASK_HEAD_LAYOUTS = ("domain", "pii", "halu", "embedding", "reranker")
#: The default packages `python -m converters default` writes (under models/).
DEFAULT_PACKAGES = ("minilm-embedding", "sparrow-nano")


def build_fixtures(out: Path) -> list[Path]:
    """A fixture package of every kind `python -m converters fixture` serves, under ``out`` (built once, on
    this machine: the converter extra must be installed), with its exact int8 variant where the kind has one."""
    from converters.__main__ import ENCODER_KINDS, KIND_CHOICES, MULTIMODAL_KINDS

    quantized = {*ENCODER_KINDS, "decision-codes", *MULTIMODAL_KINDS}
    builds = [(kind, kind, ["--quantize", "int8"] if kind in quantized else []) for kind in KIND_CHOICES
              if kind != "task-heads"]
    # the task-heads kind is one layout per fixture (its exact int8 is written by default)
    builds += [(f"task-heads-{layout}", "task-heads", ["--layout", layout]) for layout in TASK_HEAD_LAYOUTS]
    packages = []
    for name, kind, options in builds:
        target = out / name
        if not (target / "MANIFEST.json").is_file():
            subprocess.run([sys.executable, "-m", "converters", "fixture", "--kind", kind, "--out", str(target),
                            *options], cwd=ROOT, check=True)
        packages.append(target)
    return packages


def cpu_features() -> dict[str, bool]:
    """Which of FEATURES this x86 CPU (or the emulated one) has, as numpy's dispatcher sees them."""
    from numpy._core._multiarray_umath import __cpu_features__ as found

    return {name: bool(found[name]) for name in FEATURES if name in found}


def _matmul_integer(a: np.ndarray, w: int) -> int:
    """ONNX Runtime's MatMulInteger of one row of uint8 codes ``a`` [1, K] against a [K, 16] weight of ``w``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    k = a.shape[1]
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "pair_sums",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [k, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(session.run(None, {"a": a, "b": np.full((k, 16), w, np.int8)})[0][0, 0])


def pair_sum_probe() -> dict[str, int]:
    """64 activations of 255 against weights of 127 and of 64 (x86's worst case).

    The exact products are 2,072,640 and 1,044,480; a kernel with 16-bit pair sums returns 1,048,544 for
    the first (each pair 2 x 255 x 127 = 64,770 saturates at 32,767) and the exact second (32,640 fits).
    """
    a = np.full((1, 64), 255, np.uint8)
    return {f"weight_{w}": _matmul_integer(a, w) for w in (127, 64)}


def arm_pair_sum_probe() -> dict[str, int]:
    """64 activations of code 0 against weights of -128 and of -64 (plain NEON's worst case).

    ARM's X8S8 kernel takes a code as ``code - 128`` and adds two int8 x int8 products in one int16 lane:
    (-128) x (-128) twice is 32,768, which wraps (-2,097,152 for 0 over 64 terms); the recipe's bound
    of 64 gives 16,384 a pair, which fits. Every other kernel gives 0 for both.
    """
    a = np.zeros((1, 64), np.uint8)
    return {f"weight_{abs(w)}_negative": _matmul_integer(a, w) for w in (-128, -64)}


def softmax_tail_probe(longest: int = 24, extra: int = 17) -> dict[str, int]:
    """How often ONNX Runtime's Softmax of a row alone differs from the same row with masked padding
    after it (float32's lowest, as the attention masks add), over every length up to ``longest`` and up
    to ``extra`` padded positions; and how often once both widths are rounded up to a multiple of 8."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    masked = np.finfo(np.float32).min

    def run(row: np.ndarray, width: int) -> np.ndarray:
        x = np.full((1, width), masked, np.float32)
        x[0, :len(row)] = row
        return np.asarray(session.run(None, {"x": x})[0][0, :len(row)])

    pairs = differ = differ_padded = 0
    for n in range(1, longest + 1):
        row = rng.standard_normal(n).astype(np.float32) * 4
        alone, alone8 = run(row, n), run(row, -(-n // 8) * 8)
        for width in range(n + 1, n + extra + 1):
            pairs += 1
            differ += int(run(row, width).tobytes() != alone.tobytes())
            differ_padded += int(run(row, -(-width // 8) * 8).tobytes() != alone8.tobytes())
    return {"pairs": pairs, "differ": differ, "differ_padded_to_8": differ_padded}


def _integer_checks(package_dir: Path) -> dict[str, Any]:
    """Every exact (per-token) int8 graph's integer products against numpy's: an encoder's on 17 real
    sentences, any other graph (decision backbones, multimodal towers) on its own golden cases' feeds."""
    from converters.quantize import Int8Recipe, check_integer_products, check_integer_products_on
    from edge_runtime.families.registry import read_package
    from edge_runtime.packages.golden import read_golden

    package = read_package(package_dir)
    card = package.card.raw
    graphs = {v: (package.graph(v), package.golden(v), e) for v, e in card["variants"].items()
              if e.get("quantization") == "per-token"}
    recipes = {v: e["recipe"] for v, (_, _, e) in graphs.items()}
    for tower, spec in card.get("towers", {}).items():  # a multimodal package's other towers
        for v, own in spec.get("variants", {}).items():
            if v in recipes and own["graph"] != card["variants"][v]["file"]:
                graphs[f"{v}:{tower}"] = (package.file(own["graph"]), read_golden(package.file(own["golden"])),
                                          {"recipe": recipes[v]})
    found: dict[str, Any] = {}
    for name, (graph, cases, entry) in graphs.items():
        recipe = Int8Recipe.from_card(entry["recipe"])
        try:
            if card["family"] == "encoder":
                found[name] = check_integer_products(graph, package.file("tokenizer.json"), recipe)
            else:
                checks = [check_integer_products_on(graph, case.feeds, recipe) for case in cases]
                found[name] = {"gemms": checks[0]["gemms"], "rows": sum(c["rows"] for c in checks),
                               "max_relative_error": max(c["max_relative_error"] for c in checks),
                               "pair_sum_bound": checks[0]["pair_sum_bound"], "on": "golden feeds"}
        except ValueError as exc:
            found[name] = {"error": str(exc)}
    return found


def variant_report(package: Path, variant: str, rows: list[Any] | None,
                   outputs: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """One variant loaded on the CPU as the server loads it: its load facts (status, the self-check as
    /v1/models states it, the probe's grouping and trials, the row multiple), and with ``outputs`` its
    probe rows (drawn here when ``rows`` is None) with their outputs alone and in one batch."""
    from edge_runtime.config import ModelConfig
    from edge_runtime.loading import ServedModel, load_model

    # one intra-op thread: a count never moves an output (tests/test_threads_by_measurement.py), and the
    # thread measurement a larger budget starts would cost minutes under emulation for nothing checked here
    model = ServedModel(ModelConfig(name=package.name, package=package, variant=variant, device="cpu", threads=1))
    load_model(model)
    info = model.info()
    facts: dict[str, Any] = {"status": model.status, "reason": model.reason, "self_check": model.self_check,
                             "grouping": model.grouping, "numerics": model.numerics,
                             "row_multiple": info.get("engine_args", {}).get("row_multiple"),
                             "probe": info.get("engine_args", {}).get("probe")}
    ran: dict[str, Any] = {}
    if outputs and model.status == "ready" and model.family is not None:
        if rows is None:
            limit = model.family.max_input_tokens
            rows = [model.family.probe_row(min(n, limit)) for n in ROW_LENGTHS]
        forward = model.family.forward
        ran = {"rows": rows, "alone": [forward([row])[0] for row in rows]}
        # every row in one right-padded batch: what grouping "padded" promises answers as alone
        ran["batched"] = forward(rows) if model.grouping == "padded" else None
    if model.executor is not None:
        model.executor.close()
    return facts, ran


def report(packages: list[Path], rows: dict[str, Any] | None = None, outputs: bool = False,
           only: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """The JSON report of this CPU (its class, the kernel probes, each package's checks) and, with
    ``outputs``, each variant's probe rows and outputs by ``package-name/variant``; ``only`` limits the
    variants loaded (all when empty)."""
    from edge_runtime.engine import cpu
    from edge_runtime.families.registry import read_package

    here = cpu.cpu_class()
    result: dict[str, Any] = {"machine": cpu.machine(), "arch_class": cpu.arch_class(),
                              "row_multiple": cpu.row_multiple(), "int8_instructions": here["int8_instructions"]}
    probe = pair_sum_probe()
    result["pair_sums"] = {**probe, "saturates": probe["weight_127"] != 255 * 127 * 64,
                           "weight_64_exact": probe["weight_64"] == 255 * 64 * 64}
    if cpu.machine() == cpu.AARCH64:
        result["cpu_features"] = sorted(cpu.hwcap_flags())
        arm = arm_pair_sum_probe()
        result["arm_pair_sums"] = {**arm, "wraps": arm["weight_128_negative"] != 0,
                                   "weight_64_exact": arm["weight_64_negative"] == 0}
        result["softmax_tail"] = softmax_tail_probe()
    else:
        result["cpu_features"] = cpu_features()
    result["packages"] = {}
    ran: dict[str, Any] = {}
    for p in packages:
        variants: dict[str, Any] = {}
        for variant in sorted(read_package(p).card.raw["variants"]):
            if only and variant not in only:
                continue
            key = f"{p.name}/{variant}"
            given = (rows or {}).get(key, {}).get("rows")
            variants[variant], ran[key] = variant_report(p, variant, given, outputs)
        integer = _integer_checks(p)
        result["packages"][str(p)] = {"integer_products": integer, "variants": variants}
    return result, ran


def compare_outputs(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Two runs' outputs of the same probe rows (``--outputs`` of two CPU classes, or padded and not, the
    second run given the first's ``--rows``), per variant both ran: bit-identical, and the largest difference."""
    from edge_runtime.engine.probe import bitwise_equal, max_abs_diff

    return {key: {"bit_identical": bitwise_equal(a[key]["alone"], b[key]["alone"]),
                  "max_abs_diff": max_abs_diff(a[key]["alone"], b[key]["alone"])}
            for key in a if a[key] and b.get(key)}


def passed(found: dict[str, Any]) -> bool:
    """Every integer check exact within the recipe's bounds and every variant ready (self-check passed)."""
    kernels = found["pair_sums"]["weight_64_exact"] and found.get("arm_pair_sums", {}).get("weight_64_exact", True)
    return kernels and all(
        all(v["status"] == "ready" for v in pkg["variants"].values())
        and not any("error" in v for v in pkg["integer_products"].values())
        for pkg in found["packages"].values())


#: prctl(2)'s option that sends a child a signal when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the emulated child, before exec: killed when this script dies (a test that times out kills
    this script; the emulator, minutes into its run, would otherwise go on as an orphan)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _under_x86_emulator(cpu: str, argv: list[str]) -> int:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        print("error: --cpu needs qemu-x86_64 (Debian: apt-get install qemu-user)", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([qemu, "-cpu", cpu, sys.executable, str(Path(__file__).resolve()), *argv],
                          env=env, capture_output=True, text=True, preexec_fn=_die_with_parent)
    # QEMU warns once per CPUID feature TCG cannot emulate (rdseed, sha-ni, ...): none is an int8 path
    sys.stderr.write("".join(line for line in done.stderr.splitlines(keepends=True)
                             if "TCG doesn't support" not in line))
    sys.stdout.write(done.stdout)
    return done.returncode


def arm64_missing(root: Path) -> str | None:
    """Why aarch64 programs cannot run here (None when they can): the emulator registered with binfmt_misc's
    F flag, the userland's Python, root (chroot, mounts) and util-linux's unshare."""
    if os.geteuid() != 0:
        return "needs root (chroot and a private mount namespace)"
    if shutil.which("unshare") is None:
        return "needs util-linux's unshare"
    registered = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    try:
        flags = registered.read_text()
    except OSError:
        return "qemu-aarch64 is not registered with binfmt_misc (scripts/qemu_binfmt.sh, as root)"
    if "enabled" not in flags.splitlines()[0] or not any(line.startswith("flags:") and "F" in line
                                                        for line in flags.splitlines()):
        return "qemu-aarch64 is not enabled with the F flag in binfmt_misc (scripts/qemu_binfmt.sh)"
    if not (root / "opt" / "venv" / "bin" / "python").exists():
        return f"no aarch64 userland at {root} (scripts/arm64_userland.sh builds one in about 5 minutes)"
    return None


def _under_arm64_emulator(cpu: str, root: Path, argv: list[str], paths: Sequence[Path]) -> int:
    """This script under ``QEMU_CPU=cpu`` in the aarch64 userland ``root``: a private mount namespace with
    /proc and, read-only at their own paths, this project and ``paths`` (the last of them read-write)."""
    missing = arm64_missing(root)
    if missing is not None:
        print(f"error: --arch aarch64 {missing}", file=sys.stderr)
        return 2
    root = root.resolve()
    binds = [(ROOT, "ro"), *((p, "ro") for p in paths[:-1]), *((p, "rw") for p in paths[-1:])]
    steps = [f"mount -t proc proc {shlex.quote(str(root / 'proc'))}"]
    for source, mode in binds:
        target = root / str(source.resolve()).lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        steps.append(f"mount --bind -o {mode} {shlex.quote(str(source.resolve()))} {shlex.quote(str(target))}")
    env = ["PATH=/opt/venv/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", f"QEMU_CPU={cpu}",
           f"PYTHONPATH={ROOT}", "PYTHONDONTWRITEBYTECODE=1", "HF_HUB_OFFLINE=1", "TOKENIZERS_PARALLELISM=false"]
    inner = ["chroot", str(root), "/usr/bin/env", "-i", *env, "/opt/venv/bin/python",
             str(Path(__file__).resolve()), *argv]
    script = " && ".join([*steps, "exec " + shlex.join(inner)])
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, preexec_fn=_die_with_parent)
    sys.stderr.write(done.stderr)
    sys.stdout.write(done.stdout)
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", type=Path, help="converted package directories")
    parser.add_argument("--cpu", help="run under QEMU with this CPU model (x86: e.g. EPYC-Rome; "
                                      f"aarch64: {', '.join(ARM_CPUS.values())})")
    parser.add_argument("--arch", choices=("x86_64", "aarch64"), default="x86_64", help="the emulated architecture")
    parser.add_argument("--root", type=Path, default=DEFAULT_ARM64_ROOT,
                        help="the aarch64 userland (scripts/arm64_userland.sh; default %(default)s)")
    parser.add_argument("--outputs", type=Path, help="pickle each variant's probe rows and outputs here")
    parser.add_argument("--rows", type=Path, help="the --outputs of an earlier run, whose probe rows to run")
    parser.add_argument("--variant", action="append", default=[],
                        help="load only this variant of each package (repeatable; default: every variant)")
    parser.add_argument("--row-multiple", type=int, help="pad rows to this multiple, as another CPU class would")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                        help="compare two runs' --outputs (the second given the first's --rows) and exit")
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (pickle.loads(p.read_bytes()) for p in args.compare)
        compared = compare_outputs(a, b)
        print(json.dumps(compared, indent=1))
        return 0 if compared and all(c["bit_identical"] for c in compared.values()) else 1
    packages = [p.resolve() for p in args.packages]
    inner = [str(p) for p in packages]
    for flag, value in (("--outputs", args.outputs), ("--rows", args.rows), ("--row-multiple", args.row_multiple)):
        if value is not None:
            inner += [flag, str(value.resolve() if isinstance(value, Path) else value)]
    for variant in args.variant:
        inner += ["--variant", variant]
    if args.arch == "aarch64":
        if not args.cpu:
            parser.error("--arch aarch64 needs --cpu")
        # the outputs' folder last: the only one the emulated run may write
        extra = [*packages, *([args.rows.resolve().parent] if args.rows is not None else [])]
        return _under_arm64_emulator(args.cpu, args.root, inner,
                                     [*extra, args.outputs.resolve().parent] if args.outputs else extra)
    if args.cpu:
        return _under_x86_emulator(args.cpu, inner)
    if args.row_multiple is not None:
        from edge_runtime.engine import cpu

        cpu.ROW_MULTIPLE[cpu.arch_class()] = args.row_multiple
    rows = pickle.loads(args.rows.read_bytes()) if args.rows is not None else None
    found, ran = report(packages, rows, outputs=args.outputs is not None, only=args.variant)
    if args.outputs is not None:
        args.outputs.write_bytes(pickle.dumps(ran))
    print(json.dumps(found, indent=1, default=str))
    return 0 if passed(found) else 1


if __name__ == "__main__":
    sys.exit(main())
