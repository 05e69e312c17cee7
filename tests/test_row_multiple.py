"""Batch invariance on every CPU class: the row multiple padded feeds round up to (engine/cpu.py).

ARM cores without SVE run MLAS's generic softmax, whose sum adds a row's ``n mod 4`` tail as scalars, so
the padding a batch adds changes a row's rounding; rounding every width up to a multiple of 8 restores
bit-identity (docs/reference/arm64-notes.md §3.3). Here, on x86: the class is read from the CPU (and from
the auxiliary vector on aarch64, as ONNX Runtime reads it), a graph that rounds by the width's tail
proves "padded" only with the multiple, the planner counts the padded width, and padding to 8 changes
no x86 number for the encoder, causal (branches included) and recurrent forwards.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.engine import BatchLimits, EncoderForward, cpu, create_session, plan_batch, probe, probe_grouping
from edge_runtime.engine.batching import padded_width
from edge_runtime.engine.causal import CausalForward, branch_row, causal_row
from edge_runtime.engine.probe import bitwise_equal
from tests.support.encoder_graphs import encoder_graph, random_rows

NEON = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"


def test_the_architecture_class_and_its_row_multiple() -> None:
    assert cpu.classify("x86_64", {"avx2", "avx512f"}) == "x86_64"
    assert cpu.classify("aarch64", {"asimddp", "i8mm"}) == "aarch64"  # Neoverse N1/N2 without SVE
    assert cpu.classify("aarch64", {"asimddp", "i8mm", "sve"}) == "aarch64-sve"  # Neoverse V1/V2
    assert cpu.classify("riscv64", set()) == "riscv64"
    assert [cpu.row_multiple(c) for c in cpu.ARCH_CLASSES] == [1, 8, 1]
    assert cpu.row_multiple("riscv64") == 1  # unmeasured: nothing padded, the probe still judges
    # the kernels read HWCAP bits; the Features line names the same features
    assert cpu.hwcap_flags({cpu.AT_HWCAP: (1 << 20) | (1 << 22), cpu.AT_HWCAP2: 1 << 13}) == {"asimddp", "sve", "i8mm"}
    assert cpu.hwcap_flags({cpu.AT_HWCAP: 0b11, cpu.AT_HWCAP2: 0}) == set()  # fp, asimd: plain ARMv8
    assert cpu.cpu_flags(NEON) == [] and cpu.cpu_model(NEON) is None


def test_this_machine_is_classed_as_its_cpu_says() -> None:
    here = cpu.cpu_class()
    assert cpu.arch_class() == cpu.classify(cpu.machine(), set(here["int8_instructions"]) | cpu.hwcap_flags())
    if cpu.machine() == "x86_64":
        assert cpu.arch_class() == "x86_64" and cpu.row_multiple() == 1
        assert cpu.hwcap_flags() == set()  # x86's auxiliary vector bits mean other things


def test_padded_width_rounds_up_to_the_multiple() -> None:
    assert [padded_width(n) for n in (1, 7, 9)] == [1, 7, 9]
    assert [padded_width(n, 8) for n in (1, 8, 9, 130)] == [8, 8, 16, 136]
    with pytest.raises(ValueError, match=">= 1"):
        padded_width(3, 0)


def test_the_planner_counts_the_padded_width_in_the_token_budget() -> None:
    limits = BatchLimits(max_tokens=32, max_rows=8)
    # 9-token rows: three fit 32 tokens as they are, two once each pads to 16
    assert plan_batch([9, 9, 9], "padded", limits) == [0, 1, 2]
    assert plan_batch([9, 9, 9], "padded", limits, multiple=8) == [0, 1]
    assert plan_batch([9, 9, 9], "equal_length", limits, multiple=8) == [0, 1]
    assert plan_batch([9, 9, 9], "padded", limits, pads=False, multiple=8) == [0, 1, 2]  # nothing padded


@pytest.fixture(scope="module")
def tail_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return encoder_graph(tmp_path_factory.mktemp("tail") / "tail.onnx", mix="tail")


def _encoder(graph: Path, multiple: int) -> EncoderForward:
    session = create_session(graph, "cpu", threads=1)
    session.row_multiple = multiple  # as the session of an ARM core without SVE sets it
    return EncoderForward(session)


def test_a_graph_that_rounds_by_the_tail_is_exact_padded_only_with_the_multiple(tail_graph: Path) -> None:
    """The ARM softmax's behaviour, stood in for on x86: a term of the padded width mod 8."""
    assert probe_grouping(_encoder(tail_graph, 1), random_rows(5)) == "equal_length"
    forward = _encoder(tail_graph, 8)
    assert forward.row_multiple == 8 and forward.feeds([random_rows(1)(3)])["input_ids"].shape == (1, 8)
    result = probe(forward, random_rows(5))
    assert result.grouping == "padded" and all(t.exact for t in result.trials), result.describe()


def _run_all(forward: Callable[[list], list], rows: list) -> tuple[list, list]:
    return [forward([r])[0] for r in rows], forward(rows)


def test_padding_to_eight_changes_no_x86_number_of_an_encoder(tmp_path: Path) -> None:
    if cpu.machine() != "x86_64":
        pytest.skip("the bit-identity of padded widths is an x86 fact")
    graph = encoder_graph(tmp_path / "invariant.onnx")
    make = random_rows(11)
    rows = [make(n) for n in (1, 3, 8, 9, 17, 40)]
    plain, padded = _run_all(_encoder(graph, 1), rows), _run_all(_encoder(graph, 8), rows)
    assert bitwise_equal(plain, padded)


def test_padding_to_eight_changes_no_x86_number_of_a_causal_lm(tmp_path: Path) -> None:
    """Whole rows, and branches continuing a prefix whose padded keys the prefill drops (a state-once
    package: its graph takes a key/value cache)."""
    if cpu.machine() != "x86_64":
        pytest.skip("the bit-identity of padded widths is an x86 fact")
    from converters.decision_codes.fixture import build_decision_codes_fixture
    from edge_runtime.families.registry import read_package

    package = read_package(build_decision_codes_fixture(tmp_path / "once", attention_mode="prefix_causal"))
    rng = np.random.default_rng(2)
    rows = [causal_row(rng.integers(1, 60, size=n)) for n in (1, 5, 9, 16)]
    rows.append(branch_row(rng.integers(1, 60, size=11), [rng.integers(1, 60, size=n) for n in (2, 7, 3)]))
    results = []
    for multiple in (1, 8):
        session = create_session(package.graph("fp32"), "cpu", threads=1)
        session.row_multiple = multiple
        results.append(_run_all(CausalForward(session), rows))
    assert bitwise_equal(results[0], results[1])
