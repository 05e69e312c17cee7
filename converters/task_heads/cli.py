"""The task-heads converter's command line: ``export --kind task-heads`` (a ModernBERT task source; the head is
read from its files), ``fixture --kind task-heads --layout L`` (a package) and ``fixture --kind
task-heads-source --layout L`` (the source itself, the input of export)."""

from __future__ import annotations

import argparse

from converters.command_line import identity, int_list, source_fixture_out
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """``--layout`` for fixtures; for export the input limit, a pooled head's exits, a grounded head's template."""
    if command == "fixture":
        from converters.task_heads.fixture import LAYOUTS

        parser.add_argument("--layout", choices=sorted(LAYOUTS), required=True,
                            help="which catalogue layout to write (shapes of the Router's models, shrunk)")
        return
    parser.add_argument("--quantize", choices=("int8", "int8-dynamic", "none"), default="int8",
                        help="the variant written beside fp32: int8 = per-token scales, batch-invariant, exact "
                             "integer products (the default, what a CPU serves); int8-dynamic = ONNX Runtime's "
                             "dynamic quantization (approximate); none = fp32 only")
    parser.add_argument("--max-input-tokens", type=int,
                        help="the longest row (default: the model's, at most 8192; longer texts are windowed)")
    parser.add_argument("--layers", type=int_list, default=[],
                        help="pooled heads: layer exits to serve (default: those the package ships graphs for)")
    parser.add_argument("--dimensions", type=int_list, default=[],
                        help="pooled heads: Matryoshka sizes (default: as the representation contract says)")
    parser.add_argument("--exit-normalization", choices=("none", "final_norm"),
                        help="pooled heads without a representation contract: normalise earlier exits or not")
    parser.add_argument("--input-pair",
                        help="grounded heads without an operating point: the first text's template, naming "
                             "{question} and {context} (default 'User request: {question}\\n\\n{context}')")
    parser.add_argument("--token-threshold", type=float,
                        help="grounded heads without an operating point: the positive label's threshold (0.5)")


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` of the task-heads kinds."""
    if args.command == "fixture":
        from converters.task_heads.fixture import build_fixture_result, write_source

        if args.kind == "task-heads-source":
            path = write_source(args.layout, source_fixture_out(args.out), seed=args.seed)
            print(path)
            return None
        return build_fixture_result(args.layout, args.out, seed=args.seed)
    from converters.task_heads.export import TaskOptions, export_task_heads

    return export_task_heads(args.src, args.out, TaskOptions(
        max_input_tokens=args.max_input_tokens, layers=args.layers, dimensions=args.dimensions,
        exit_normalization=args.exit_normalization, input_pair=args.input_pair,
        token_threshold=args.token_threshold, quantize=None if args.quantize == "none" else args.quantize,
        **identity(args)))
