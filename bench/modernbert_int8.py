"""`python -m bench.modernbert_int8`: the task-heads exact int8 against planted ModernBERT activation outliers.

A trained ModernBERT carries a few hidden channels far larger than the rest in the inputs of its matmuls; one
activation scale per tensor cannot hold them and the rest at once, which is how upstream's dynamic int8 came to
a worst cosine of 0.634 on the Vela Embedding (docs/reference/router-catalogue.md). No trained ModernBERT is
available offline, so the outliers are planted without changing the model's function: in every layer, channel
j of the pre-attention and pre-MLP norms' weights is multiplied by F and column j of the matmul weights that
read them (Wqkv, Wi) divided by F. fp32 answers the same (to rounding); the matmuls' inputs now have K channels
F times the rest, in every token.

For each F, a random-weight source of a layout (default: the Vela Embedding's, pooled with Matryoshka exits)
is planted, converted to fp32 (converters/task_heads), and its graph quantized three ways: the converter's
exact int8 (the calibrated recipe: per-token scales, smoothing, fp32 outlier channels), the exact int8 without
smoothing or outlier channels (DEFAULT_RECIPE), and ONNX Runtime's dynamic int8. Each is read against fp32
through the head, on the real sentences the cards state agreement on (converters/task_heads/verify.py
int8_agreement). A numerics measurement, no timing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FACTORS = (1.0, 10.0, 30.0, 100.0)
CHANNELS = (3, 17)  # planted channels (a trained model has a handful of them)
VARIANTS = ("int8 (calibrated)", "int8 (plain per-token)", "int8-dynamic (ORT)")


def plant(source: Path, factor: float, channels: Sequence[int]) -> None:
    """Multiply ``channels`` of every attention and MLP norm weight by ``factor`` and divide the matching input
    columns of Wqkv and Wi by it: the same function in fp32, outlier channels in the matmuls' inputs."""
    from safetensors.numpy import load_file, save_file

    path = source / "model.safetensors"
    tensors = load_file(str(path))
    idx = list(channels)
    for name in list(tensors):
        for norm, reader in (("attn_norm.weight", "attn.Wqkv.weight"), ("mlp_norm.weight", "mlp.Wi.weight")):
            if name.endswith(norm):
                prefix = name[: -len(norm)]
                tensors[name] = tensors[name].copy()
                tensors[name][idx] *= factor
                weight = tensors[prefix + reader].copy()
                weight[:, idx] /= factor
                tensors[prefix + reader] = weight
    save_file(tensors, str(path), metadata={"format": "pt"})


def measure(layout: str, factor: float, channels: Sequence[int], work: Path, vela_shape: bool = False
            ) -> dict[str, dict[str, Any]]:
    """The three variants' agreement with fp32 for one planted factor."""
    from tokenizers import Tokenizer

    from converters import quantize
    from converters.task_heads import verify
    from converters.task_heads.export import TaskOptions, export_task_heads
    from converters.task_heads.fixture import write_source
    from edge_runtime.families.registry import read_package

    if vela_shape:  # bench/task_heads.py's: Vela 1.0's 307M backbone, random weights
        from bench.task_heads import PARITY_TOKENS, SHAPE, WEIGHT_STD

        source, parity_tokens = write_source(layout, work / "source", shape=SHAPE, weight_std=WEIGHT_STD), PARITY_TOKENS
    else:
        source, parity_tokens = write_source(layout, work / "source"), 256
    if factor != 1.0:
        plant(source, factor, channels)
    export_task_heads(source, work / "package", TaskOptions(name="planted", quantize=None, parity_tokens=parity_tokens))
    package = read_package(work / "package")
    head, kind = dict(package.card.head), package.card.kind.removeprefix("task-")
    weights = package.head_weights() if (work / "package" / "head.npz").is_file() else {}
    outputs = list(package.card.raw["graph"]["outputs"])
    layers = [int(k) for k in head.get("layers", {})] if kind == "pooled" else list(head.get("layers", []))
    tokenizer = Tokenizer.from_file(str(work / "package" / "tokenizer.json"))
    limit = int(package.card.limits["max_input_tokens"])
    calibration = verify.tokenized_rows(tokenizer, verify.samples(kind), head, limit)
    corpus = verify.tokenized_rows(tokenizer, verify.agreement_items(kind), head, limit)
    graph = work / "package" / "model.onnx"
    fp32 = verify.create_session(graph)
    built = {
        VARIANTS[0]: quantize.quantize_int8_exact(graph, work / "calibrated.onnx", quantize.CALIBRATED_RECIPE,
                                                  calibration),
        VARIANTS[1]: quantize.quantize_int8_exact(graph, work / "plain.onnx", quantize.DEFAULT_RECIPE),
        VARIANTS[2]: quantize.quantize_int8_dynamic(graph, work / "dynamic.onnx"),
    }
    return {name: verify.int8_agreement(kind, head, weights, fp32, verify.create_session(path), corpus, outputs,
                                        layers) for name, path in built.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modernbert_int8", description=__doc__)
    parser.add_argument("--layout", default="embedding", help="a task-heads fixture layout (embedding)")
    parser.add_argument("--factors", type=lambda s: [float(x) for x in s.split(",")], default=list(FACTORS))
    parser.add_argument("--channels", type=lambda s: [int(x) for x in s.split(",")], default=list(CHANNELS),
                        help="the planted channels (the calibrated recipe keeps 4 per activation in fp32)")
    parser.add_argument("--vela-shape", action="store_true",
                        help="Vela 1.0's 307M shape (bench/task_heads.py SHAPE) instead of the fixture's")
    args = parser.parse_args(argv)
    from converters.task_heads.verify import AGREEMENT_STRIDE
    from edge_runtime.engine.cpu import cpu_class

    cpu = cpu_class()
    print(f"CPU: {cpu['model']}; int8 instructions: {', '.join(cpu['int8_instructions']) or 'none'}")
    shape = "Vela 1.0's 307M shape" if args.vela_shape else "fixture shape"
    print(f"layout {args.layout} (random weights, {shape}), channels {args.channels} planted in every layer\n")
    print("| planted factor | " + " | ".join(VARIANTS) + " |")
    print("|---|" + "---|" * len(VARIANTS))
    for factor in args.factors:
        with tempfile.TemporaryDirectory(prefix="er-planted-") as tmp:
            result = measure(args.layout, factor, args.channels, Path(tmp), args.vela_shape)
        cells = []
        for name in VARIANTS:
            a = result[name]
            if a["metric"] == "cosine":
                cells.append(f"min cos {a['min_cosine']:.6f}, mean {a['mean_cosine']:.6f}")
            else:
                cells.append(f"max |dp| {a['max_abs_dp']:.4g}" + (f", top-1 {a['top_label_agreement']:.4f}"
                                                                   if "top_label_agreement" in a else ""))
        print(f"| {factor:g} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{result[VARIANTS[0]]['cases']} real sentences (every {AGREEMENT_STRIDE}th of converters/data's STS "
          "Benchmark train sentences), each alone, read through the head against the same graph in fp32.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
