"""bench/decision3.py at the fixture's size: the report's structure and the parity of the answers with
Transformers 5 (never the timings). Skipped where .venv-ref is missing."""

from __future__ import annotations

from pathlib import Path

from bench import decision3
from bench.harness.lab import Lab, Settings
from tests.support.d3_models import needs_reference


@needs_reference
def test_decision3_bench_fixture_shape(tmp_path: Path) -> None:
    lab = Lab(Settings(threads=1, rounds=1, packages=tmp_path))
    try:
        tables = decision3.compare(lab, decision3.FIXTURE)
    finally:
        lab.stop_all()
    subject, latency, agreement = tables
    assert subject.title == "decision3 at fixture's shape: what was measured"
    assert [r[0] for r in latency.rows] == ["state-once", "whole rows", "state-once vs whole rows"]
    assert all(len(r) == len(latency.headers) for r in latency.rows)
    assert all(r[2].replace(".", "").isdigit() and r[4].replace(".", "").isdigit() for r in latency.rows[:2])
    assert [r[0] for r in agreement.rows][:2] == ["ours state-once vs Transformers state-once (its cache)",
                                                  "ours whole rows vs Transformers whole rows"]
    # The fixture's 5e-6-class agreement (the converter's bound is 1e-5); a wrong row or readout misses by far more.
    assert decision3.parity(tables) < 1e-5
    # State-once continues from the prefix's states: the same answers as the whole rows up to fp32 rounding.
    assert float(agreement.rows[3][1]) < 1e-6
    assert all(r[3] == "2/2" for r in agreement.rows)
    assert all(float(r[2]) < 1e-3 for r in agreement.rows)  # the logits agree too
    built = tmp_path / "bench-decision3-fixture-shape"
    assert (built / "card.json").is_file()
