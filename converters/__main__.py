"""python -m converters export | fixture | default (see docs/packages.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from converters.errors import ConversionError

KIND_CHOICES = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank",
                "decision-codes", "decision-vision")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _thresholds(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        label, sep, value = part.rpartition("=")
        try:
            if not sep or not label:
                raise ValueError
            out[label] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected label=threshold[,label=threshold...], got {part!r}") from None
    return out


def _parser() -> argparse.ArgumentParser:
    from converters.decision_codes import add_cli_arguments

    p = argparse.ArgumentParser(prog="python -m converters", description="Build edge-runtime model packages.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="export a Hugging Face encoder directory (or hub id) as a package")
    e.add_argument("src", metavar="SRC", help="local Hugging Face model directory, or a hub id when online")
    e.add_argument("--out", required=True, type=Path, help="package directory to write (replaced if present)")
    e.add_argument("--kind", required=True, choices=KIND_CHOICES)
    e.add_argument("--name", help="package name (default: the source directory's name)")
    e.add_argument("--quantize", choices=("int8",), help="also write a dynamic int8 variant")
    e.add_argument("--layers", type=_int_list, default=[], help="embedding: encoder layers to expose, e.g. 3,5")
    e.add_argument("--dimensions", type=_int_list, default=[], help="embedding: Matryoshka sizes, e.g. 384,256,128")
    e.add_argument("--pooling", choices=("mean", "cls", "last"), help="embedding: override the declared pooling")
    e.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                   help="embedding: L2-normalise (default: as declared, else yes)")
    e.add_argument("--thresholds", type=_thresholds, help="multi-label: label=0.3,... (default 0.5 each)")
    e.add_argument("--max-input-tokens", type=int, help="input limit (default: as the model declares)")
    e.add_argument("--description")
    e.add_argument("--version", default="1.0.0", help="package version (default 1.0.0)")
    e.add_argument("--release-date", help="YYYY-MM-DD (default: today, UTC)")
    e.add_argument("--revision", help="default: the first 12 hex digits of the source stamp")
    e.add_argument("--license", help="default: the model card's license, else 'unknown'")
    e.add_argument("--source-name", help="name of the upstream model (default: the source directory's name)")
    add_cli_arguments(e)

    f = sub.add_parser("fixture", help="build a tiny random-weight package for tests")
    f.add_argument("--kind", required=True, choices=KIND_CHOICES)
    f.add_argument("--out", required=True, type=Path)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--quantize", choices=("int8",))
    add_cli_arguments(f, fixture=True)

    d = sub.add_parser("default", help="build the embedded default packages offline")
    d.add_argument("--out", required=True, type=Path, help="directory that receives one package per model")
    d.add_argument("--force", action="store_true", help="rebuild even when the packages are up to date")
    return p


def _summary(result: object) -> None:
    card = result.card  # type: ignore[attr-defined]
    print(json.dumps({"path": str(result.path), "name": card["name"], "digest": result.digest,  # type: ignore[attr-defined]
                      "max_abs_diff": card["verification"]["max_abs_diff"],
                      "variants": {k: v.get("agreement") for k, v in card["variants"].items()},
                      "timings_s": {k: round(v, 2) for k, v in result.timings.items()}},  # type: ignore[attr-defined]
                     indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for a conversion error)."""
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.command in ("export", "fixture") and args.kind == "decision-vision":
            from converters import decision_vision

            run = decision_vision.export_from_args if args.command == "export" else decision_vision.fixture_from_args
            _summary(run(args))
        elif args.command in ("export", "fixture") and args.kind == "decision-codes":
            from converters import decision_codes

            run = decision_codes.export_from_args if args.command == "export" else decision_codes.fixture_from_args
            _summary(run(args))
        elif args.command == "export":
            from converters.decision_codes import reject_cli_arguments
            from converters.export import ExportOptions, export_model

            reject_cli_arguments(args)
            opts = ExportOptions(
                kind=args.kind, name=args.name, quantize=args.quantize, layers=args.layers,
                dimensions=args.dimensions, thresholds=args.thresholds, pooling=args.pooling,
                normalize=args.normalize, max_input_tokens=args.max_input_tokens, description=args.description,
                version=args.version, release_date=args.release_date, revision=args.revision,
                license=args.license, source_name=args.source_name)
            _summary(export_model(args.src, args.out, opts))
        elif args.command == "fixture":
            from converters.decision_codes import reject_cli_arguments
            from converters.fixture import build_fixture_result

            reject_cli_arguments(args)
            _summary(build_fixture_result(args.kind, args.out, seed=args.seed, quantize=args.quantize == "int8"))
        else:
            from converters.default import build_defaults

            for line in build_defaults(args.out, force=args.force):
                print(line)
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
