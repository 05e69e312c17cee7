"""The decision-codes command line: its export and fixture options, and the check that another kind was not
given them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from converters.decision_codes.export import DecisionCodesOptions, export_decision_codes
from converters.decision_codes.fixture import build_decision_codes_fixture_result
from converters.errors import ConversionError
from converters.export import (
    ExportResult,
)
from edge_runtime.families.codes_prompt import (
    ATTENTION_MODES,
)

_CLI_FLAGS = ("attention_mode", "prompt_layout", "temperature", "temperature_by_questions",
              "validated_input_tokens", "max_request_tokens")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_cli_arguments(parser: argparse.ArgumentParser, fixture: bool = False) -> None:
    """The decision-codes options of ``export`` (and a few of ``fixture``)."""
    g = parser.add_argument_group("decision-codes")
    g.add_argument("--attention-mode", choices=ATTENTION_MODES, default=None,
                   help="causal: a row per question; prefix_causal: the state once, questions branched (state-once)")
    g.add_argument("--prompt-layout", choices=("header-v1",), default=None,
                   help="header-v1: list the request's questions in front of the state")
    if fixture:
        return
    g.add_argument("--temperature", type=float, help="readout temperature (default 1.0, or the source's)")
    g.add_argument("--temperature-by-questions", type=_json_object,
                   help='e.g. \'{"max_questions": [1], "temperature": [1.046, 1.0]}\'')
    g.add_argument("--validated-input-tokens", type=int, help="per-question cap without options.long_context")
    g.add_argument("--max-request-tokens", type=int,
                   help="state-once: the state once and every question (default max_input_tokens)")


def reject_cli_arguments(args: argparse.Namespace) -> None:
    """ConversionError when decision-codes options were given for another kind."""
    given = [f"--{k.replace('_', '-')}" for k in _CLI_FLAGS if getattr(args, k, None) is not None]
    if given:
        raise ConversionError(f"{', '.join(given)} apply to kind decision-codes only")


def export_from_args(args: argparse.Namespace) -> ExportResult:
    """``export SRC --kind decision-codes`` from parsed arguments."""
    opts = DecisionCodesOptions(
        quantize=args.quantize,
        attention_mode=args.attention_mode or "causal", prompt_layout=args.prompt_layout,
        temperature=args.temperature, temperature_by_questions=args.temperature_by_questions,
        max_input_tokens=args.max_input_tokens, validated_input_tokens=args.validated_input_tokens,
        max_request_tokens=args.max_request_tokens, name=args.name, description=args.description,
        version=args.version, release_date=args.release_date, revision=args.revision,
        license=args.license, source_name=args.source_name)
    return export_decision_codes(args.src, args.out, opts)


def fixture_from_args(args: argparse.Namespace) -> ExportResult:
    """``fixture --kind decision-codes`` from parsed arguments."""
    return build_decision_codes_fixture_result(args.out, seed=args.seed, attention_mode=args.attention_mode or "causal",
                                               prompt_layout=args.prompt_layout, quantize=args.quantize)


def run(args: argparse.Namespace) -> ExportResult:
    """``export`` or ``fixture`` with ``--kind decision-codes``."""
    return (export_from_args if args.command == "export" else fixture_from_args)(args)
