"""The decision-vision command line: ``export SRC --kind decision-vision`` (its limits and temperature) and
``fixture --kind decision-vision``."""

from __future__ import annotations

import argparse

from converters.command_line import identity
from converters.package_writer import ExportResult


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """export: the input and request limits and the readout temperature (packages are fp32, always
    state-once, with the plain prompt layout)."""
    if command != "export":
        return
    parser.add_argument("--max-input-tokens", type=int, help="input limit (default: the model's positions)")
    parser.add_argument("--max-request-tokens", type=int,
                        help="the state once and every question (default max_input_tokens)")
    parser.add_argument("--temperature", type=float, default=1.0, help="readout temperature (default 1.0)")


def run(args: argparse.Namespace) -> ExportResult:
    """``export`` or ``fixture`` with ``--kind decision-vision``."""
    if args.command == "fixture":
        from converters.decision_vision.fixture import build_decision_vision_fixture_result

        return build_decision_vision_fixture_result(args.out, seed=args.seed)
    from converters.decision_vision.export import DecisionVisionOptions, export_decision_vision

    return export_decision_vision(args.src, args.out, DecisionVisionOptions(
        max_input_tokens=args.max_input_tokens, max_request_tokens=args.max_request_tokens,
        temperature=args.temperature, **identity(args)))
