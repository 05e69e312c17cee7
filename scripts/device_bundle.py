"""Everything the GPU check needs on a lent device machine, cut into parts that fit one device call each.

    .venv/bin/python scripts/device_bundle.py            # writes .device/part-NN and prints the calls

A device machine (the `device` tool's `run`) has Python 3.12 with torch (CUDA), onnxruntime (CPU) and
sentence-transformers, no network, and takes at most 64 MiB of carried files per call. So the bundle
holds, in one tar: cp312 wheels of the server's dependencies the image lacks and of onnxruntime-gpu
(ORT_GPU, the version Dockerfile.gpu ships), a fixture package of every kind scripts/gpu_check.py checks,
the default MiniLM as an fp32-only package named ``minilm-embedding`` (bench gpu serves its fp32 graph),
and the all-MiniLM-L6-v2 source directory sentence-transformers loads. The tar is split into parts of
PART_BYTES; each part travels in its own call, back to back while the machine stays warm, and is moved
out of the working tree there (to STAGING); the last call runs scripts/device_check.sh, which joins the
parts, installs the wheels into a venv over the image's Python, and runs the checks. The calls are
printed; docs/deployment.md ("The GPU check on a lent device machine") says the same.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

#: the onnxruntime-gpu Dockerfile.gpu installs (CUDA 13 build)
ORT_GPU = "onnxruntime-gpu==1.31.1"
#: the device image's Python (KINDS.md of the device tool: 3.12 with torch, numpy, pillow, PyYAML,
#: prometheus-client, sentence-transformers); the server's other dependencies travel as wheels
DEVICE_PYTHON = "3.12"
SERVER_WHEELS = ("sanic==25.12.1", "orjson==3.13.0", "zstandard==0.25.0", "jsonschema==4.26.0",
                 "tokenizers==0.22.2")
#: under the 64 MiB a call may carry, with room for the working tree itself
PART_BYTES = 56 * 1024 * 1024
#: where the parts wait on the device machine between calls (outside the working tree it replaces)
STAGING = "/tmp/er-device"


def download_wheels(into: Path) -> None:
    """cp312 manylinux wheels of SERVER_WHEELS (with their dependencies) and of ORT_GPU (without: the
    image has numpy, protobuf, flatbuffers, sympy and packaging)."""
    common = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
              DEVICE_PYTHON, "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
              "--platform", "manylinux_2_17_x86_64", "-d", str(into)]
    subprocess.run([*common, *SERVER_WHEELS], check=True)
    subprocess.run([*common, "--no-deps", ORT_GPU], check=True)


def build(out: Path) -> list[Path]:
    """The bundle's parts under ``out`` (replaced), in order."""
    from gpu_check import build_fixtures

    from bench.harness.lab import minilm_source
    from converters.versions import minilm_fp32

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="er-device-") as tmp:
        stage = Path(tmp) / "bundle"
        download_wheels(stage / "wheels")
        # what device_check.sh installs: pip takes the rest from the image where it satisfies them
        (stage / "requirements.txt").write_text("\n".join([*SERVER_WHEELS, ORT_GPU]) + "\n", encoding="utf-8")
        fixtures = build_fixtures(ROOT / ".cache" / "gpu-check")
        for package in fixtures:
            shutil.copytree(package, stage / "fixtures" / package.name)
        minilm_fp32(stage / "packages" / "minilm-embedding")  # the fp32-only MiniLM (bench swap's B version)
        shutil.copytree(minilm_source(), stage / "minilm-source")
        tar = Path(tmp) / "bundle.tar"
        with tarfile.open(tar, "w") as archive:  # the big files are compressed already or do not compress
            archive.add(stage, arcname="bundle")
        return split(tar, out)


def split(path: Path, out: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """``path`` cut into ``out``/part-00, part-01, ... of at most ``part_bytes`` (cat joins them)."""
    parts = []
    with path.open("rb") as source:
        while chunk := source.read(part_bytes):
            part = out / f"part-{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    return parts


def calls(parts: list[Path]) -> list[tuple[str, str]]:
    """(command, carry) of each device call, in order: one per part, then the check."""
    out = [(f"mkdir -p {STAGING} && mv .device/{p.name} {STAGING}/", f".device/{p.name}") for p in parts]
    out.append((f"bash scripts/device_check.sh {STAGING} {len(parts)}", ""))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / ".device", help="where the parts go (.device/)")
    args = parser.parse_args(argv)
    parts = build(args.out)
    total = sum(p.stat().st_size for p in parts)
    print(f"{len(parts)} parts, {total / 2**20:.0f} MiB, in {args.out}. Device calls, back to back:")
    for i, (command, carry) in enumerate(calls(parts), 1):
        print(f"{i}. command: {command}" + (f"\n   carry: [\"{carry}\"]" if carry else "\n   timeout_s: 600"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
