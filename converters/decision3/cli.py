"""The decision3 command line: ``export SRC --kind decision3`` and ``fixture --kind decision3 |
decision3-source``, their options, and the check that another kind was not given them."""

from __future__ import annotations

import argparse
import json

from converters.decision3 import source as src
from converters.decision3.convert import Decision3Options, build_fixture, export_decision3
from converters.errors import ConversionError
from converters.export import ExportResult


def add_cli_arguments(parser: argparse.ArgumentParser, fixture: bool = False) -> None:
    """The decision3 options of ``export`` (``--no-reference``) and ``fixture`` (``--variant``,
    ``--upstream-attention``)."""
    g = parser.add_argument_group("decision3")
    g.add_argument("--no-reference", action="store_true",
                   help="decision3: skip the Transformers 5 parity check (the card says unverified)")
    if fixture:
        from converters.decision3.fixture import VARIANTS

        g.add_argument("--variant", choices=VARIANTS, default=None,
                       help="decision3: the upstream fixture's variant (default vision)")
        g.add_argument("--upstream-attention", choices=src.ATTENTION_MODES, default=None,
                       help="decision3: the fixture's attention_mode (default noncausal_full_attention)")


def reject_cli_arguments(args: argparse.Namespace) -> None:
    """ConversionError when decision3 options were given for another kind."""
    given = [flag for flag, value in (("--no-reference", getattr(args, "no_reference", False)),
                                      ("--variant", getattr(args, "variant", None)),
                                      ("--upstream-attention", getattr(args, "upstream_attention", None)))
             if value]
    if given:
        raise ConversionError(f"{', '.join(given)} apply to kind decision3 only")


def export_from_args(args: argparse.Namespace) -> ExportResult:
    """``export SRC --kind decision3`` from parsed arguments."""
    from converters.decision_codes.cli import reject_cli_arguments as reject_codes

    reject_codes(args)
    if args.quantize or args.layers or args.dimensions or args.pooling or args.normalize is not None \
            or args.thresholds:
        raise ConversionError("kind decision3 takes only --out, --name, --max-input-tokens, --no-reference and the "
                              "identity options")
    return export_decision3(args.src, args.out, Decision3Options(
        name=args.name, description=args.description, version=args.version, release_date=args.release_date,
        revision=args.revision, license=args.license, source_name=args.source_name,
        reference=not args.no_reference, max_input_tokens=args.max_input_tokens))


def fixture_from_args(args: argparse.Namespace) -> ExportResult | None:
    """``fixture --kind decision3-source`` (the upstream format) or ``--kind decision3`` (converted)."""
    from converters.decision3.fixture import write_source_fixture
    from converters.decision_codes.cli import reject_cli_arguments as reject_codes

    reject_codes(args)
    if args.quantize:
        raise ConversionError("--quantize is not available for decision3")
    variant = args.variant or "vision"
    attention = args.upstream_attention or "noncausal_full_attention"
    if args.kind == "decision3-source":
        path = write_source_fixture(args.out, variant, seed=args.seed, attention_mode=attention)
        print(json.dumps({"path": str(path), "format": src.MANIFEST_SCHEMA, "variant": variant,
                          "attention_mode": attention}))
        return None
    return build_fixture(args.out, variant=variant, attention_mode=attention, seed=args.seed,
                         reference=not args.no_reference)


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` with ``--kind decision3`` (or ``decision3-source``)."""
    return (export_from_args if args.command == "export" else fixture_from_args)(args)
