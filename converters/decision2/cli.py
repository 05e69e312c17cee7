"""The Decision 2.0 converter's command line: ``export SRC [--kind decision2] [--base BASE]`` (detected from
the package's pointer) and ``fixture --kind decision2 | decision2-source | decision2-lora-source``."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from converters.command_line import identity, source_fixture_out
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """export: the pinned base model of a qwen-adapter package."""
    if command == "export":
        parser.add_argument("--base", type=Path, default=None,
                            help="qwen-adapter: the pinned base model directory (default: SRC-base)")


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` with one of this family's kinds; None when it printed its own result."""
    from converters.decision2.export import Decision2Options, export_decision2
    from converters.decision2.fixture import write_decision2_fixture

    if args.command == "export":
        return export_decision2(args.src, args.out, Decision2Options(base=args.base, **identity(args)))
    if args.kind in ("decision2-source", "decision2-lora-source"):
        lora = args.kind == "decision2-lora-source"
        path = write_decision2_fixture(source_fixture_out(args.out), seed=args.seed, adapter=lora)
        print(json.dumps({"path": str(path), "format": "dev2-package/1",
                          "base": str(path.parent / f"{path.name}-base") if lora else None}))
        return None
    with tempfile.TemporaryDirectory(prefix="er-decision2-src-") as tmp:
        src = write_decision2_fixture(Path(tmp) / "decision2-tiny", seed=args.seed)
        return export_decision2(src, args.out, Decision2Options(
            name="fixture-decision2", version="0.0.1", release_date="2025-01-01", license="Apache-2.0",
            description=f"Tiny random-weight Decision 2.0 fixture (seed {args.seed}); for tests",
            source_name=f"edge-runtime fixture decision2-tiny (seed {args.seed})"))
