"""Benchmarks: `python -m bench all | embeddings | overhead | longinput | decisions | decision-codes | memory`
(`--record` appends to docs/benchmarks.md).

Each contestant runs in its own process (the server as `python -m edge_runtime serve` on 127.0.0.1,
PyTorch and Optimum in `python -m bench.contestant`, sparrow-nano answered without HTTP in
`python -m bench.decisions in-process`), so torch's OpenMP threads never share a process with ONNX
Runtime's (toolchain notes, pitfall P6). Timings are medians over several
interleaved rounds; on a shared machine, read the ratios rather than the absolute numbers.
"""
