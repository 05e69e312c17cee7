"""The multimodal converter's command line: export and fixture for image-text-embedding (SigLIP, CLIP) and
audio-embedding (Whisper encoders, CLAP) from parsed arguments."""

from __future__ import annotations

import argparse

from converters.errors import ConversionError


def run(args: argparse.Namespace) -> object:
    """``export`` or ``fixture`` with one of this family's kinds, from parsed arguments."""
    from converters.decision_codes.cli import reject_cli_arguments
    from converters.multimodal.export import MultimodalOptions, export_multimodal
    from converters.multimodal.fixture import build_multimodal_fixture

    reject_cli_arguments(args)
    if args.command == "fixture":
        if args.quantize not in (None, "int8"):
            raise ConversionError(f"--quantize {args.quantize} does not apply to multimodal fixtures (int8 does)")
        arch = args.arch or ("whisper" if args.kind == "audio-embedding" else "siglip")
        return build_multimodal_fixture(arch, args.out, seed=args.seed, source_dir=args.keep_source,
                                        quantize=args.quantize)
    if args.quantize not in (None, "int8"):
        raise ConversionError(f"--quantize {args.quantize} does not apply to --kind {args.kind}: multimodal "
                              "packages take int8 (exact per-token), whose rows do not depend on their batch")
    unsupported = [flag for flag, value in (("--layers", args.layers),
                                            ("--pooling", args.pooling), ("--thresholds", args.thresholds),
                                            ("--normalize", args.normalize is not None)) if value]
    if unsupported:
        raise ConversionError(f"{', '.join(unsupported)} do not apply to --kind {args.kind}")
    opts = MultimodalOptions(kind=args.kind, name=args.name, description=args.description, version=args.version,
                             release_date=args.release_date, revision=args.revision, license=args.license,
                             source_name=args.source_name, dimensions=args.dimensions, quantize=args.quantize)
    return export_multimodal(args.src, args.out, opts)
