"""The encoder converter's command line: ``export`` and ``fixture`` for the kinds embedding,
sequence-classification, multi-label, token-classification and rerank, and ``fixture`` for the sources in
the Router catalogue's layouts (qwen3-embedding-source, embeddinggemma-source, lora-source)."""

from __future__ import annotations

import argparse
from pathlib import Path

from converters.command_line import identity, int_list
from converters.encoder.source_fixtures import KINDS as SOURCE_KINDS
from converters.package_writer import ExportResult

QUANTIZE = ("int8", "int8-dynamic")


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


def add_options(parser: argparse.ArgumentParser, command: str, kind: str) -> None:
    """``--quantize`` for every kind; for export the input limit, embedding's exits and pooling, multi-label's
    thresholds."""
    parser.add_argument("--quantize", choices=QUANTIZE,
                        help="also write an int8 variant: int8 = per-token scales, batch-invariant (exact); "
                             "int8-dynamic = ONNX Runtime dynamic quantization (approximate)")
    parser.set_defaults(layers=[], dimensions=[], pooling=None, normalize=None, thresholds=None)
    if command != "export":
        if kind in SOURCE_KINDS:
            parser.add_argument("--full-size", action="store_true",
                                help="the real model's depth and embedding rows too (GBs; for measurements)")
        return
    parser.add_argument("--max-input-tokens", type=int, help="input limit (default: as the model declares)")
    parser.add_argument("--base", type=Path, help="a LoRA adapter's base model directory (default: the "
                                                  "base_model_name_or_path of its adapter_config.json)")
    parser.add_argument("--cache-dir", type=Path, help="the Hugging Face cache a LoRA adapter's base repo id is "
                                                       "found in, offline (default: HF_HUB_CACHE)")
    if kind == "embedding":
        parser.add_argument("--layers", type=int_list, default=[], help="encoder layers to expose, e.g. 3,5")
        parser.add_argument("--dimensions", type=int_list, default=[], help="Matryoshka sizes, e.g. 384,256,128")
        parser.add_argument("--pooling", choices=("mean", "cls", "last"), help="override the declared pooling")
        parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                            help="L2-normalise (default: as declared, else yes)")
    if kind == "multi-label":
        parser.add_argument("--thresholds", type=_thresholds, help="label=0.3,... (default 0.5 each)")


def run(args: argparse.Namespace) -> ExportResult | None:
    """``export`` or ``fixture`` with one of the encoder kinds."""
    if args.command == "fixture" and args.kind in SOURCE_KINDS:
        import json

        from converters.encoder.source_fixtures import write_source_fixture

        path = write_source_fixture(args.kind, args.out, seed=args.seed, full_size=args.full_size)
        print(json.dumps({"path": str(path), **({"cache_dir": str(path.with_name(path.name + "-hub"))}
                                                 if args.kind == "lora-source" else {})}))
        return None
    if args.command == "fixture":
        from converters.encoder.fixture import build_fixture_result

        return build_fixture_result(args.kind, args.out, seed=args.seed, quantize=args.quantize)
    from converters.encoder.export import ExportOptions, export_model

    return export_model(args.src, args.out, ExportOptions(
        kind=args.kind, quantize=args.quantize, layers=args.layers, dimensions=args.dimensions,
        thresholds=args.thresholds, pooling=args.pooling, normalize=args.normalize,
        max_input_tokens=args.max_input_tokens, base=args.base, cache_dir=args.cache_dir, **identity(args)))
