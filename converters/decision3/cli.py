"""The decision3 command line: ``export SRC [--kind decision3]`` (detected from decision_config.json) and
``fixture --kind decision3 | decision3-source``, and their options."""

from __future__ import annotations

import argparse
import json

from converters.command_line import identity
from converters.decision3 import source as src
from converters.decision3.fixture import VARIANTS
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """export: ``--no-reference`` and the input limit; fixture: the upstream fixture's ``--variant`` and
    ``--upstream-attention`` (and, converted, ``--no-reference``)."""
    if command == "export" or kind == "decision3":
        parser.add_argument("--no-reference", action="store_true",
                            help="skip the Transformers 5 parity check (the card says unverified)")
    if command == "export":
        parser.add_argument("--max-input-tokens", type=int, help="input limit (default: the package's)")
        return
    parser.add_argument("--variant", choices=VARIANTS, default="vision",
                        help="the upstream fixture's variant (default vision)")
    parser.add_argument("--upstream-attention", choices=src.ATTENTION_MODES, default="noncausal_full_attention",
                        help="the fixture's attention_mode (default noncausal_full_attention)")


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` with ``--kind decision3`` (or ``decision3-source``, which prints its own
    result and returns None)."""
    from converters.decision3.convert import Decision3Options, build_fixture, export_decision3

    if args.command == "export":
        return export_decision3(args.src, args.out, Decision3Options(
            reference=not args.no_reference, max_input_tokens=args.max_input_tokens, **identity(args)))
    if args.kind == "decision3-source":
        from converters.decision3.fixture import write_source_fixture

        path = write_source_fixture(args.out, args.variant, seed=args.seed, attention_mode=args.upstream_attention)
        print(json.dumps({"path": str(path), "format": src.MANIFEST_SCHEMA, "variant": args.variant,
                          "attention_mode": args.upstream_attention}))
        return None
    return build_fixture(args.out, variant=args.variant, attention_mode=args.upstream_attention, seed=args.seed,
                         reference=not args.no_reference)
