"""scripts/device_bundle.py's pure parts: the parts join back to the bundle, and the calls it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.scripts import load_script
from tests.support.server_harness import ROOT

bundle = load_script(ROOT / "scripts" / "device_bundle.py")


def test_parts_fit_a_call_and_join_back(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000 + b"tail"
    whole = tmp_path / "bundle.tar"
    whole.write_bytes(data)
    out = tmp_path / "parts"
    out.mkdir()
    parts = bundle.split(whole, out, part_bytes=10_000)
    assert [p.name for p in parts] == [f"part-{i:02d}" for i in range(len(parts))] and len(parts) == 26
    assert all(p.stat().st_size <= 10_000 for p in parts)
    joined = subprocess.run(f"cat {out}/part-*", shell=True, capture_output=True, check=True).stdout
    assert joined == data
    assert bundle.PART_BYTES < 64 * 2**20  # the device tool carries at most 64 MiB a call


def test_each_part_travels_alone_and_the_last_call_runs_the_check(tmp_path: Path) -> None:
    parts = [tmp_path / f"part-{i:02d}" for i in range(3)]
    calls = bundle.calls(parts)
    assert len(calls) == 4
    for part, (command, carry) in zip(parts, calls):
        assert carry == f".device/{part.name}" and command.endswith(f"mv .device/{part.name} {bundle.STAGING}/")
    assert calls[-1] == (f"bash scripts/device_check.sh {bundle.STAGING} 3", "")
    assert (ROOT / "scripts" / "device_check.sh").is_file()


def test_the_device_script_refuses_a_missing_part(tmp_path: Path) -> None:
    (tmp_path / "part-00").write_bytes(b"x")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), str(tmp_path), "2"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    assert done.returncode == 2 and "1 of 2 parts" in done.stderr
