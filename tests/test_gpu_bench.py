"""`python -m bench gpu` at fixture size on the CPU: its tables and numerics, never its timings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench import gpu
from bench.__main__ import main as bench_main


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sentence-transformers directory the embedding fixture is converted from (seed 0)."""
    from converters.encoder.fixture import build_source

    return build_source("embedding", tmp_path_factory.mktemp("gpu-bench") / "source", seed=0)


def test_gpu_bench_tables_on_the_cpu(fixture_package: Callable[..., Path], source: Path) -> None:
    settings = gpu.GpuSettings("cpu", fixture_package("embedding"), source, threads=1, rounds=1,
                               calls_batch1=1, calls_batch32=1, warmup=1)
    speed, numerics, probe = gpu.run(settings)
    labels = [row[0] for row in speed.rows]
    assert len(labels) == 3 and labels[2].startswith("sentence-transformers (torch cpu")
    assert "batching exact (grouping padded, exact)" in labels[0]
    assert "batching padded (grouping padded, exact)" in labels[1]  # padded is proven exact on the CPU
    assert speed.rows[2][5:] == ["1.00x", "1.00x"]  # torch against itself
    # on the CPU our batches are our rows alone, bit for bit, and the exact server is the reference
    assert [row[1:4] for row in numerics.rows[:2]] == [[f"32/{gpu.BATCH}", "0", "0"]] * 2
    assert numerics.rows[0][4] == "1.0000000"
    assert float(numerics.rows[2][3]) < 1e-3  # torch and our graph: one model, two runtimes
    assert [row[:6] for row in probe.rows] == [["ours-exact", "cpu", "exact", "padded", "exact", "–"],
                                               ["ours-padded", "cpu", "padded", "padded", "exact", "–"]]
    assert probe.rows[0][6] == "equal_length: exact (0); padded: exact (0)"


def test_gpu_bench_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["gpu", "--device", "cpu", "--packages", str(tmp_path)]) == 2
    assert "no minilm-embedding package" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_main(["gpu", "--device", "tpu"])
    text = gpu._trial({"grouping": "buckets", "exact": True, "max_abs_diff": 0.0, "widths": [16, 32],
                       "rows": 32, "max_abs_diff_vs_own_length": 2.5e-7})
    assert text == "buckets 16/32 x 32 rows: exact (0, own 2.5e-07)"
