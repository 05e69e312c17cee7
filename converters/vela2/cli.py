"""The Vela 2.0 converter's command line: ``export SRC [--kind vela2]`` (detected from config.json), its parity
options, and ``fixture --kind vela2 | vela2-source``."""

from __future__ import annotations

import argparse
import json

from converters.command_line import identity, source_fixture_out
from converters.errors import ConversionError
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """export: the variant written beside fp32, how many generated requests the parity check runs, and its
    tolerance."""
    if command != "export":
        return
    parser.add_argument("--check-requests", type=int, default=None,
                        help="generated requests the parity check runs besides the golden one (default 50)")
    parser.add_argument("--quantize", choices=("int8", "int8-dynamic", "none"), default="int8",
                        help="the variant written beside fp32: int8 = per-token scales, batch-invariant, exact "
                             "integer products (the default, what a CPU serves); int8-dynamic = ONNX Runtime's "
                             "dynamic quantization (approximate); none = fp32 only")
    parser.add_argument("--parity-tolerance", type=float, default=None,
                        help="the largest |package - PyTorch| logit accepted (default 1e-5; deep fp32 backbones "
                             "may need 1e-4, which the card then records)")


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` with one of this family's kinds; None when it printed its own result."""
    if args.command == "fixture":
        from converters.vela2.fixture import build_vela2_fixture_result, write_source_fixture

        if args.kind == "vela2-source":
            path = write_source_fixture(source_fixture_out(args.out), seed=args.seed)
            print(json.dumps({"path": str(path), "format": "vela2-unified"}))
            return None
        return build_vela2_fixture_result(args.out, seed=args.seed)
    from converters.vela2.export import DEFAULT_CHECK_REQUESTS, Vela2Options, export_vela2
    from converters.vela2.verify import LOGIT_TOLERANCE

    checks = DEFAULT_CHECK_REQUESTS if args.check_requests is None else args.check_requests
    if checks < 0:
        raise ConversionError("--check-requests must be at least 0")
    tolerance = LOGIT_TOLERANCE if args.parity_tolerance is None else args.parity_tolerance
    if not 0 < tolerance <= 1e-3:
        raise ConversionError("--parity-tolerance must be in (0, 1e-3]")
    return export_vela2(args.src, args.out, Vela2Options(
        check_requests=checks, tolerance=tolerance, quantize=None if args.quantize == "none" else args.quantize,
        **identity(args)))
