"""bench.int8_kernels' pure helpers: which int8 kernel MLAS picks, what a profiled GEMM multiplied, which
glue step a profiled node is (no model, no timing)."""

from __future__ import annotations

import pytest

from bench.int8_kernels import INTEGER_MATMUL, _macs, glue_part, picked_isa
from edge_runtime.engine.cpu import all_flags

AVX512 = {"avx2", "avx512f", "avx512bw", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(("flags", "isa"), [
    (set(), None),
    ({"avx2"}, "AVX2"),
    ({"avx2", "avx_vnni"}, "AVX-VNNI"),
    (AVX512 - {"avx512vl"}, "AVX2"),  # MLAS's AVX-512 core kernels need BW, DQ and VL together
    (AVX512 | {"avx_vnni"}, "AVX-512 core"),  # the AVX-512 kernel replaces the AVX-VNNI one
    (AVX512 | {"avx512_vnni", "avx_vnni"}, "AVX-512 VNNI"),
    (AVX512 | {"avx512_vnni", "amx_tile", "amx_int8"}, "AMX"),
])
def test_the_isa_follows_mlas_dispatch_order(flags: set[str], isa: str | None) -> None:
    picked = picked_isa(flags)
    assert (picked.name.split(" (")[0] if picked else None) == isa


def test_flags_are_read_from_the_first_cpu() -> None:
    text = "processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert all_flags(text) == {"fpu", "avx2", "avx512_vnni"}


def test_macs_come_from_the_activation_and_output_shapes() -> None:
    """The profiler leaves out a prepacked weight's shape: K from A, N from the output."""
    args = {"input_type_shape": [{"uint8": [32, 14, 384]}, {"float": [1]}, {"float": [1536]}, {"uint8": [1]}],
            "output_type_shape": [{"float": [32, 14, 1536]}]}
    assert _macs(args) == 32 * 14 * 384 * 1536


def test_glue_steps_are_the_rewriters_nodes_only() -> None:
    assert glue_part("er_q//encoder/layer.0/x/Smooth_kernel_time") == "Smooth"
    assert glue_part("er_q//encoder/layer.0/query/MatMul/TokenScale_kernel_time") == "TokenScale"
    assert glue_part(f"er_q//encoder/layer.0/query/MatMul/{INTEGER_MATMUL}_kernel_time") is None
    assert glue_part("/encoder/layer.0/attention/output/LayerNorm/LayerNormalization_kernel_time") is None
