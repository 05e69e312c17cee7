"""The decision-vision command line: export and fixture from parsed arguments."""

from __future__ import annotations

import argparse

from converters.decision_vision.export import DecisionVisionOptions, export_decision_vision
from converters.decision_vision.fixture import build_decision_vision_fixture_result
from converters.errors import ConversionError
from converters.export import ExportResult


def export_from_args(args: argparse.Namespace) -> ExportResult:
    """``export SRC --kind decision-vision`` from parsed arguments."""
    if args.quantize:
        raise ConversionError("--quantize: decision-vision packages are fp32")
    _reject_code_flags(args)
    opts = DecisionVisionOptions(
        max_input_tokens=args.max_input_tokens, max_request_tokens=getattr(args, "max_request_tokens", None),
        temperature=args.temperature if getattr(args, "temperature", None) is not None else 1.0,
        name=args.name, description=args.description, version=args.version, release_date=args.release_date,
        revision=args.revision, license=args.license, source_name=args.source_name)
    return export_decision_vision(args.src, args.out, opts)


def _reject_code_flags(args: argparse.Namespace) -> None:
    """decision-codes options that this kind does not read (it is always state-once, plain layout)."""
    given = [f"--{k.replace('_', '-')}" for k in ("attention_mode", "prompt_layout", "temperature_by_questions",
                                                   "validated_input_tokens") if getattr(args, k, None) is not None]
    if given:
        raise ConversionError(f"{', '.join(given)} do not apply to kind decision-vision (always state-once, "
                              "media requests keep the plain layout)")


def fixture_from_args(args: argparse.Namespace) -> ExportResult:
    """``fixture --kind decision-vision`` from parsed arguments."""
    if args.quantize:
        raise ConversionError("--quantize: decision-vision packages are fp32")
    _reject_code_flags(args)
    return build_decision_vision_fixture_result(args.out, seed=args.seed)


def run(args: argparse.Namespace) -> ExportResult:
    """``export`` or ``fixture`` with ``--kind decision-vision``."""
    return (export_from_args if args.command == "export" else fixture_from_args)(args)
