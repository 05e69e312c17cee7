"""The multimodal converter's command line: export and fixture for image-text-embedding (SigLIP, CLIP) and
audio-embedding (Whisper encoders, CLAP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from converters.command_line import identity, int_list
from converters.errors import ConversionError
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """``--quantize`` (exact int8 only); export: ``--dimensions``; fixture: ``--arch``, ``--keep-source``."""
    parser.add_argument("--quantize", choices=("int8", "int8-dynamic"),
                        help="int8: the exact (per-token) int8 of every tower; dynamic int8 is refused")
    if command == "export":
        parser.add_argument("--dimensions", type=int_list, default=[], help="Matryoshka sizes, e.g. 512,256")
        return
    parser.add_argument("--arch", choices=("siglip", "clip", "whisper", "clap", "siglip-base-vision"),
                        help="the tiny architecture (default siglip, or whisper for audio); siglip-base-vision is "
                             "SigLIP base's vision tower at its real shape, for benchmarks")
    parser.add_argument("--keep-source", type=Path, help="write the Hugging Face source here and keep it")


def run(args: argparse.Namespace) -> ExportResult:
    """``export`` or ``fixture`` with one of this family's kinds, from parsed arguments."""
    from converters.multimodal.export import MultimodalOptions, export_multimodal
    from converters.multimodal.fixture import build_multimodal_fixture

    if args.command == "fixture":
        if args.quantize not in (None, "int8"):
            raise ConversionError(f"--quantize {args.quantize} does not apply to multimodal fixtures (int8 does)")
        arch = args.arch or ("whisper" if args.kind == "audio-embedding" else "siglip")
        return build_multimodal_fixture(arch, args.out, seed=args.seed, source_dir=args.keep_source,
                                        quantize=args.quantize)
    if args.quantize not in (None, "int8"):
        raise ConversionError(f"--quantize {args.quantize} does not apply to --kind {args.kind}: multimodal "
                              "packages take int8 (exact per-token), whose rows do not depend on their batch")
    opts = MultimodalOptions(kind=args.kind, dimensions=args.dimensions, quantize=args.quantize, **identity(args))
    return export_multimodal(args.src, args.out, opts)
