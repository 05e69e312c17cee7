"""Converting a source artifact once: reused while its files are unchanged (by fingerprint, then by
digest), converted again when they change, once for processes that start together, stopped with the
server, and refused with the command to run where the converters are not installed.

The converter here is a stand-in command line that writes a real package (a copy of a fixture), so
these tests need no torch; tests/router/test_managed.py converts a real source with the converters."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_runtime import artifacts
from edge_runtime.artifacts import ArtifactError, convert_once
from edge_runtime.families.registry import read_package

#: export SRC --out DIR --name NAME: copies the package named by $STAND_IN_PACKAGE, counts its runs
#: in $STAND_IN_LOG, sleeps $STAND_IN_SLEEP seconds first, and fails when SRC holds a file "fail".
#: --version: $STAND_IN_VERSION, else the version the copied package's card records.
STAND_IN = """
import json, os, shutil, sys, time
args = sys.argv[1:]
if args == ["--version"]:
    card = json.load(open(os.path.join(os.environ["STAND_IN_PACKAGE"], "card.json")))
    print(os.environ.get("STAND_IN_VERSION", card["build"]["converter_version"]))
    sys.exit(0)
src, out = args[1], args[args.index("--out") + 1]
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(src + "\\n")
time.sleep(float(os.environ.get("STAND_IN_SLEEP", "0")))
if os.path.exists(os.path.join(src, "fail")):
    print("loading the checkpoint", flush=True)
    print("error: the head weights were not all in the checkpoint", file=sys.stderr)
    sys.exit(2)
shutil.copytree(os.environ["STAND_IN_PACKAGE"], out)
"""


@pytest.fixture
def stand_in(tmp_path: Path, fixture_package: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
             ) -> tuple[list[str], Path]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    log = tmp_path / "runs.log"
    log.write_text("")
    monkeypatch.setenv("STAND_IN_PACKAGE", str(fixture_package("embedding")))
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    return [sys.executable, str(script)], log


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text('{"architectures": ["BertModel"]}')
    (source / "model.safetensors").write_bytes(b"weights" * 100)
    return source


def test_a_source_is_converted_once_and_reused_until_its_content_changes(
        stand_in: tuple[list[str], Path], tmp_path: Path) -> None:
    converter, log = stand_in
    source, package = _source(tmp_path), tmp_path / "cache" / "edge-runtime-packages" / "src-1"
    assert convert_once(source, package, "m", converter=converter).startswith("converted")
    assert read_package(package).card.kind == "embedding"
    assert "files are unchanged" in convert_once(source, package, "m", converter=converter)
    weights = source / "model.safetensors"
    os.utime(weights, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: same bytes
    assert "same content" in convert_once(source, package, "m", converter=converter)
    weights.write_bytes(b"other weights")
    assert convert_once(source, package, "m", converter=converter).startswith("converted")
    assert len(log.read_text().splitlines()) == 2


def test_a_package_made_by_another_converter_version_is_made_again(
        stand_in: tuple[list[str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    converter, log = stand_in
    source, package = _source(tmp_path), tmp_path / "cache" / "pkg"
    convert_once(source, package, "m", converter=converter)
    made_by = artifacts.built_by(package)
    assert made_by is not None and artifacts.converter_version(converter) == made_by
    monkeypatch.setenv("STAND_IN_VERSION", "99.0.0")
    note = convert_once(source, package, "m", converter=converter)
    assert note.startswith("converted") and f"made by converter {made_by}" in note and "here are 99.0.0" in note
    monkeypatch.delenv("STAND_IN_VERSION")
    assert "files are unchanged" in convert_once(source, package, "m", converter=converter)
    # converters that cannot say their version (not installed here): what is there is what can be served
    monkeypatch.setenv("STAND_IN_VERSION", "")
    assert artifacts.converter_version(converter) is None
    assert "files are unchanged" in convert_once(source, package, "m", converter=converter)
    assert len(log.read_text().splitlines()) == 2


def test_processes_starting_together_convert_once(stand_in: tuple[list[str], Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    converter, log = stand_in
    monkeypatch.setenv("STAND_IN_SLEEP", "0.5")
    source, package = _source(tmp_path), tmp_path / "cache" / "pkg"
    notes: list[str] = []
    threads = [threading.Thread(target=lambda: notes.append(convert_once(source, package, "m", converter=converter)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(log.read_text().splitlines()) == 1
    assert sorted(n.split()[0] for n in notes) == ["converted", "reused", "reused"]


def test_a_failed_conversion_says_why_and_leaves_nothing_behind(
        stand_in: tuple[list[str], Path], tmp_path: Path) -> None:
    converter, _ = stand_in
    source, package = _source(tmp_path), tmp_path / "cache" / "pkg"
    (source / "fail").write_text("")
    with pytest.raises(ArtifactError, match="could not be converted .*the head weights were not all"):
        convert_once(source, package, "m", converter=converter)
    assert not package.exists() and not list(package.parent.glob("pkg.tmp-*"))


def test_a_stopping_server_stops_the_conversion(stand_in: tuple[list[str], Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    converter, log = stand_in
    monkeypatch.setenv("STAND_IN_SLEEP", "30")
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    with pytest.raises(ArtifactError, match="stopped"):
        convert_once(_source(tmp_path), tmp_path / "cache" / "pkg", "m", stop, converter=converter)
    assert time.monotonic() - started < 10


def test_without_the_converters_the_reason_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(artifacts, "converters_missing", lambda: ["torch"])
    with pytest.raises(ArtifactError, match=r"python -m converters export SRC --out DIR"):
        convert_once(_source(tmp_path), tmp_path / "cache" / "pkg", "m")
