"""Goldens across architecture classes: a card says where its goldens were recorded, and a CPU of another
class self-checks them with the tolerance measured for that pair, stated in /v1/models.

The integer products of the exact int8 variants are the same on every class; the floats around them round
a few ULP differently on ARM, which per-token quantization can turn into a changed activation code
(docs/reference/arm64-notes.md §3.3). Same-class checks keep the contract's 1e-3.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_runtime.config import ModelConfig
from edge_runtime.engine import cpu
from edge_runtime.families.registry import read_package
from edge_runtime.loading import ServedModel, load_model
from edge_runtime.packages.golden import (
    CROSS_CLASS_TOLERANCE,
    GOLDEN_TOLERANCE,
    GoldenCase,
    check_tolerance,
    self_check,
)


class _Session:
    """Answers every case with its recorded outputs shifted by ``shift``, as a CPU of ``arch_class``."""

    def __init__(self, cases: list[GoldenCase], shift: float, arch_class: str) -> None:
        self.cases, self.shift, self.arch_class = cases, shift, arch_class

    def run(self, feeds: Mapping[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        case = next(c for c in self.cases if c.feeds is feeds)
        return {n: case.outputs[n] + np.float32(self.shift) for n in names}


def _cases() -> list[GoldenCase]:
    return [GoldenCase({"x": np.zeros((1, 2), np.int64)}, {"y": np.array([[0.5, -0.25]], np.float32)})]


def test_every_measured_pair_is_of_known_classes_and_looser_than_the_same_class_bound() -> None:
    for pair, (tolerance, basis) in CROSS_CLASS_TOLERANCE.items():
        assert len(pair) == 2 and pair <= set(cpu.ARCH_CLASSES), pair
        assert GOLDEN_TOLERANCE["cpu"] < tolerance < 1.0 and basis


def test_the_tolerance_follows_the_class_pair() -> None:
    assert check_tolerance("cpu", "x86_64", "x86_64")[0] == GOLDEN_TOLERANCE["cpu"]
    assert check_tolerance("cuda", "x86_64", "aarch64")[0] == GOLDEN_TOLERANCE["cuda"]
    for made_on, running_on in (("x86_64", "aarch64"), ("aarch64", "x86_64"), ("aarch64-sve", "x86_64")):
        tolerance, basis = check_tolerance("cpu", made_on, running_on)
        assert tolerance == CROSS_CLASS_TOLERANCE[frozenset({made_on, running_on})][0]
        assert basis.startswith(f"{made_on} -> {running_on}: ")
    tolerance, basis = check_tolerance("cpu", "x86_64", "riscv64")
    assert tolerance == GOLDEN_TOLERANCE["cpu"] and "not measured" in basis


def test_a_cross_class_difference_fails_on_the_recording_class_and_passes_across() -> None:
    cases = _cases()
    shift = 0.01  # what a flipped uint8 activation code does to an int8 MiniLM's outputs, roughly
    same = self_check(_Session(cases, shift, "x86_64"), cases, "cpu", made_on="x86_64")
    assert same["status"] == "failed" and "above 0.001 on cpu" in same["reason"]
    across = self_check(_Session(cases, shift, "aarch64"), cases, "cpu", made_on="x86_64")
    assert across["status"] == "passed", across
    assert across["golden_class"] == "x86_64" and across["checked_on"] == "aarch64"
    assert across["tolerance"] == CROSS_CLASS_TOLERANCE[frozenset({"x86_64", "aarch64"})][0]
    assert across["tolerance_basis"].startswith("x86_64 -> aarch64: measured")
    far = self_check(_Session(cases, 1.0, "aarch64"), cases, "cpu", made_on="x86_64")
    assert far["status"] == "failed" and "on aarch64 (goldens from x86_64)" in far["reason"]


def test_cards_say_where_their_goldens_were_recorded(fixture_package: Callable[..., Path], tmp_path: Path) -> None:
    """The converter writes this machine's class; a card without it is one of the older, x86-made ones."""
    path = fixture_package("embedding", quantize=True)
    package = read_package(path)
    assert package.card.raw["goldens"] == {"arch_class": cpu.arch_class()}
    assert package.card.golden_class == cpu.arch_class()
    raw: dict[str, Any] = {k: v for k, v in package.card.raw.items() if k != "goldens"}
    older = type(package.card)(**{**package.card.__dict__, "raw": raw})
    assert older.golden_class == "x86_64"


def test_models_state_the_self_checks_tolerance_and_classes(fixture_package: Callable[..., Path]) -> None:
    path = fixture_package("embedding", quantize=True)
    model = ServedModel(ModelConfig(name="tiny", package=path, variant="int8", device="cpu"))
    load_model(model)
    try:
        info = model.info()
        assert info["status"] == "ready", info
        check = info["self_check"]
        assert check["status"] == "passed" and check["tolerance"] == GOLDEN_TOLERANCE["cpu"]
        assert check["golden_class"] == check["checked_on"] == cpu.arch_class()
        assert info["engine_args"]["row_multiple"] == cpu.row_multiple()
    finally:
        assert model.executor is not None
        model.executor.close()


@pytest.mark.parametrize("recorded", ["aarch64", "aarch64-sve"])
def test_goldens_recorded_on_arm_load_here_with_the_pairs_tolerance(
        fixture_package: Callable[..., Path], tmp_path: Path, recorded: str) -> None:
    """A package converted on an ARM node: its card names the class, and this CPU checks with the pair's
    tolerance (the cases are this machine's own, so the difference is 0 and the statement is what is tested)."""
    import shutil

    from converters.package_writer import json_bytes
    from edge_runtime.packages import build_manifest

    if cpu.arch_class() == recorded:
        pytest.skip("this machine is of the recording class")
    copy = tmp_path / "pkg"
    shutil.copytree(fixture_package("embedding", quantize=True), copy)
    card = read_package(copy).card.raw
    card["goldens"] = {"arch_class": recorded}
    (copy / "card.json").write_bytes(json_bytes(card))
    (copy / "MANIFEST.json").write_text(__import__("json").dumps(build_manifest(copy)))
    model = ServedModel(ModelConfig(name="tiny", package=copy, variant="int8", device="cpu"))
    load_model(model)
    try:
        check = model.info()["self_check"]
        assert check["status"] == "passed" and check["golden_class"] == recorded, check
        assert check["tolerance"] == check_tolerance("cpu", recorded, cpu.arch_class())[0]
    finally:
        assert model.executor is not None
        model.executor.close()
