"""The Vela 2.0 converter's command line: export, fixture and the upstream-format source fixture from
parsed arguments."""

from __future__ import annotations

import argparse
import json

from converters.errors import ConversionError


def run(args: argparse.Namespace) -> object:
    """``export`` or ``fixture`` with one of this family's kinds, from parsed arguments."""
    from converters.decision_codes.cli import reject_cli_arguments
    from converters.vela2.export import DEFAULT_CHECK_REQUESTS, Vela2Options, export_vela2
    from converters.vela2.fixture import build_vela2_fixture_result
    from converters.vela2.verify import LOGIT_TOLERANCE

    reject_cli_arguments(args)
    if args.command == "fixture":
        if getattr(args, "quantize", None):
            raise ConversionError("--quantize is not available for vela2 (its logits are checked in fp32)")
        if args.kind == "vela2-source":
            from converters.vela2.fixture import write_source_fixture

            if args.out.exists():
                raise ConversionError(f"{args.out} exists; a source fixture is written to a new directory")
            print(json.dumps({"path": str(write_source_fixture(args.out, seed=args.seed)), "format": "vela2-unified"}))
            return None
        return build_vela2_fixture_result(args.out, seed=args.seed)
    if args.quantize or args.layers or args.dimensions or args.pooling or args.normalize is not None \
            or args.thresholds or args.max_input_tokens:
        raise ConversionError("kind vela2 takes only --out, --name, --check-requests, --parity-tolerance and the "
                              "identity options")
    checks = DEFAULT_CHECK_REQUESTS if args.check_requests is None else args.check_requests
    if checks < 0:
        raise ConversionError("--check-requests must be at least 0")
    tolerance = LOGIT_TOLERANCE if args.parity_tolerance is None else args.parity_tolerance
    if not 0 < tolerance <= 1e-3:
        raise ConversionError("--parity-tolerance must be in (0, 1e-3]")
    opts = Vela2Options(name=args.name, description=args.description, version=args.version,
                        release_date=args.release_date, revision=args.revision, license=args.license,
                        source_name=args.source_name, check_requests=checks, tolerance=tolerance)
    return export_vela2(args.src, args.out, opts)
