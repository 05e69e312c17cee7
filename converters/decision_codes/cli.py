"""The decision-codes command line: ``export SRC --kind decision-codes`` and ``fixture --kind decision-codes``,
and their options."""

from __future__ import annotations

import argparse
import json
from typing import Any

from converters.command_line import identity
from converters.package_writer import ExportResult
from edge_runtime.families.codes_prompt import ATTENTION_MODES


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """The attention mode, prompt layout and int8 variant (export and fixture); for export the temperatures
    and the limits."""
    parser.add_argument("--attention-mode", choices=ATTENTION_MODES, default="causal",
                        help="causal: a row per question; prefix_causal: the state once, questions branched "
                             "(state-once)")
    parser.add_argument("--prompt-layout", choices=("header-v1",), default=None,
                        help="header-v1: list the request's questions in front of the state")
    parser.add_argument("--quantize", choices=("int8", "int8-dynamic"),
                        help="int8: also write the per-token (exact) int8 backbone; dynamic int8 is refused")
    if command != "export":
        return
    parser.add_argument("--temperature", type=float, help="readout temperature (default 1.0, or the source's)")
    parser.add_argument("--temperature-by-questions", type=_json_object,
                        help='e.g. \'{"max_questions": [1], "temperature": [1.046, 1.0]}\'')
    parser.add_argument("--max-input-tokens", type=int, help="input limit (default: as the model declares)")
    parser.add_argument("--validated-input-tokens", type=int, help="per-question cap without options.long_context")
    parser.add_argument("--max-request-tokens", type=int,
                        help="state-once: the state once and every question (default max_input_tokens)")


def run(args: argparse.Namespace) -> ExportResult:
    """``export`` or ``fixture`` with ``--kind decision-codes``."""
    if args.command == "fixture":
        from converters.decision_codes.fixture import build_decision_codes_fixture_result

        return build_decision_codes_fixture_result(args.out, seed=args.seed, attention_mode=args.attention_mode,
                                                   prompt_layout=args.prompt_layout, quantize=args.quantize)
    from converters.decision_codes.export import DecisionCodesOptions, export_decision_codes

    return export_decision_codes(args.src, args.out, DecisionCodesOptions(
        quantize=args.quantize, attention_mode=args.attention_mode, prompt_layout=args.prompt_layout,
        temperature=args.temperature, temperature_by_questions=args.temperature_by_questions,
        max_input_tokens=args.max_input_tokens, validated_input_tokens=args.validated_input_tokens,
        max_request_tokens=args.max_request_tokens, **identity(args)))
