"""The Decision 2.0 converter's command line: export, fixture and the upstream-format source fixtures from
parsed arguments."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from converters.errors import ConversionError


def run(args: argparse.Namespace) -> object:
    """``export`` or ``fixture`` with one of this family's kinds, from parsed arguments."""
    import tempfile

    from converters.decision2.export import Decision2Options, export_decision2
    from converters.decision2.fixture import write_decision2_fixture
    from converters.decision_codes.cli import reject_cli_arguments

    reject_cli_arguments(args)
    if getattr(args, "quantize", None):
        raise ConversionError("--quantize is not available for decision2 (its logits are checked in fp32)")
    if args.command == "fixture":
        if args.kind in ("decision2-source", "decision2-lora-source"):
            if args.out.exists():
                raise ConversionError(f"{args.out} exists; a source fixture is written to a new directory")
            lora = args.kind == "decision2-lora-source"
            path = write_decision2_fixture(args.out, seed=args.seed, adapter=lora)
            print(json.dumps({"path": str(path), "format": "dev2-package/1",
                              "base": str(path.parent / f"{path.name}-base") if lora else None}))
            return None
        with tempfile.TemporaryDirectory(prefix="er-decision2-src-") as tmp:
            src = write_decision2_fixture(Path(tmp) / "decision2-tiny", seed=args.seed)
            return export_decision2(src, args.out, Decision2Options(
                name="fixture-decision2", version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
                description=f"Tiny random-weight Decision 2.0 fixture (seed {args.seed}); for tests",
                source_name=f"edge-runtime fixture decision2-tiny (seed {args.seed})"))
    if args.layers or args.dimensions or args.pooling or args.normalize is not None or args.thresholds \
            or args.max_input_tokens:
        raise ConversionError("kind decision2 takes only --out, --name, --base and the identity options")
    return export_decision2(args.src, args.out, Decision2Options(
        name=args.name, description=args.description, version=args.version, release_date=args.release_date,
        revision=args.revision, license=args.license, source_name=args.source_name, base=args.base))
