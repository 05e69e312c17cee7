"""python -m converters export | fixture | default (see docs/packages.md)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from converters.errors import ConversionError

KIND_CHOICES = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank",
                "decision-codes", "image-text-embedding", "audio-embedding", "vela2", "decision2", "decision-vision",
                "decision3")
#: kinds served by the multimodal embedding family (converters/multimodal/)
MULTIMODAL_KINDS = ("image-text-embedding", "audio-embedding")
#: fixture kinds beyond the export kinds: upstream-format sources that `export` then converts
SOURCE_FIXTURE_KINDS = ("vela2-source", "decision2-source", "decision2-lora-source", "decision3-source")


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
    from converters.decision3.cli import add_cli_arguments as add_decision3_arguments
    from converters.decision_codes.cli import add_cli_arguments

    p = argparse.ArgumentParser(prog="python -m converters", description="Build edge-runtime model packages.")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("export", help="export a Hugging Face encoder directory (or hub id) as a package")
    e.add_argument("src", metavar="SRC", help="local Hugging Face model directory, or a hub id when online")
    e.add_argument("--out", required=True, type=Path, help="package directory to write (replaced if present)")
    e.add_argument("--kind", choices=KIND_CHOICES,
                   help="what to export; may be omitted for a package whose config.json names its format (vela2)")
    e.add_argument("--name", help="package name (default: the source directory's name)")
    e.add_argument("--quantize", choices=("int8", "int8-dynamic"),
                   help="also write an int8 variant: int8 = per-token scales, batch-invariant (exact); "
                        "int8-dynamic = ONNX Runtime dynamic quantization (approximate)")
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
    e.add_argument("--check-requests", type=int, default=None,
                   help="vela2: generated requests the parity check runs besides the golden one (default 50)")
    e.add_argument("--parity-tolerance", type=float, default=None,
                   help="vela2: the largest |package - PyTorch| logit accepted (default 1e-5; deep fp32 "
                        "backbones may need 1e-4, which the card then records)")
    e.add_argument("--base", type=Path, default=None,
                   help="decision2 qwen-adapter: the pinned base model directory (default: SRC-base)")
    add_cli_arguments(e)
    add_decision3_arguments(e)

    f = sub.add_parser("fixture", help="build a tiny random-weight package for tests")
    f.add_argument("--kind", required=True, choices=KIND_CHOICES + SOURCE_FIXTURE_KINDS,
                   help="vela2-source writes an upstream-format Vela 2.0 package (the input of export --kind vela2)")
    f.add_argument("--out", required=True, type=Path)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--quantize", choices=("int8", "int8-dynamic"))
    f.add_argument("--arch", choices=("siglip", "clip", "whisper", "clap", "siglip-base-vision"),
                   help="multimodal kinds: the tiny architecture (default siglip, or whisper for audio); "
                        "siglip-base-vision is SigLIP base's vision tower at its real shape, for benchmarks")
    f.add_argument("--keep-source", type=Path, help="multimodal kinds: write the Hugging Face source here and keep it")
    add_cli_arguments(f, fixture=True)
    add_decision3_arguments(f, fixture=True)

    d = sub.add_parser("default", help="build the embedded default packages offline")
    d.add_argument("--out", required=True, type=Path, help="directory that receives one package per model")
    d.add_argument("--force", action="store_true", help="rebuild even when the packages are up to date")
    return p


def _summary(result: object) -> None:
    if result is None:  # the step printed its own result
        return
    card = result.card  # type: ignore[attr-defined]
    print(json.dumps({"path": str(result.path), "name": card["name"], "digest": result.digest,  # type: ignore[attr-defined]
                      "max_abs_diff": card["verification"]["max_abs_diff"],
                      "variants": {k: v.get("agreement") for k, v in card["variants"].items()},
                      "timings_s": {k: round(v, 2) for k, v in result.timings.items()}},  # type: ignore[attr-defined]
                     indent=2))


def _detect_kind(src: str) -> str:
    """The kind a source declares in its own files (Vela 2.0, Decision 2.0, Decision 3.0); else the user must say."""
    from converters.decision2.source import detect as detect_decision2
    from converters.decision3.source import detect as detect_decision3
    from converters.vela2.source import detect

    kind = detect(Path(src)) or detect_decision2(Path(src)) or detect_decision3(Path(src))
    if kind is None:
        raise ConversionError(f"{src}: --kind is required (its config.json names no format this converter detects)")
    return kind


def _encoder(args: argparse.Namespace) -> object:
    """export/fixture for the encoder kinds (embedding, the classify heads, rerank)."""
    from converters.decision_codes.cli import reject_cli_arguments

    reject_cli_arguments(args)
    if args.command == "fixture":
        from converters.fixture import build_fixture_result

        if args.arch or args.keep_source:
            raise ConversionError("--arch and --keep-source apply to image-text-embedding and audio-embedding")
        return build_fixture_result(args.kind, args.out, seed=args.seed, quantize=args.quantize)
    from converters.export import ExportOptions, export_model

    opts = ExportOptions(
        kind=args.kind, name=args.name, quantize=args.quantize, layers=args.layers,
        dimensions=args.dimensions, thresholds=args.thresholds, pooling=args.pooling,
        normalize=args.normalize, max_input_tokens=args.max_input_tokens, description=args.description,
        version=args.version, release_date=args.release_date, revision=args.revision,
        license=args.license, source_name=args.source_name)
    return export_model(args.src, args.out, opts)


def _family(module: str) -> Callable[[argparse.Namespace], object]:
    """The ``run(args)`` of a family's converter command line (``converters/<family>/cli.py``),
    imported when a command needs it, so that the parser loads no converter."""
    def run(args: argparse.Namespace) -> object:
        return importlib.import_module(module).run(args)
    return run


#: The converter of every kind `export` and `fixture` take: ``run(args)`` returns the written package's
#: result for the summary, or None when it printed its own.
CONVERTERS: dict[str, Callable[[argparse.Namespace], object]] = {
    **dict.fromkeys(("embedding", "sequence-classification", "multi-label", "token-classification", "rerank"),
                    _encoder),
    **dict.fromkeys(MULTIMODAL_KINDS, _family("converters.multimodal.cli")),
    "decision-codes": _family("converters.decision_codes.cli"),
    "decision-vision": _family("converters.decision_vision.cli"),
    **dict.fromkeys(("vela2", "vela2-source"), _family("converters.vela2.cli")),
    **dict.fromkeys(("decision2", "decision2-source", "decision2-lora-source"), _family("converters.decision2.cli")),
    **dict.fromkeys(("decision3", "decision3-source"), _family("converters.decision3.cli")),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for a conversion error)."""
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.command == "export" and args.kind is None:
            args.kind = _detect_kind(args.src)
        if args.command == "export" and args.kind != "vela2" and (args.check_requests is not None
                                                                 or args.parity_tolerance is not None):
            raise ConversionError("--check-requests and --parity-tolerance apply to kind vela2 only")
        if args.command == "export" and args.base is not None and args.kind != "decision2":
            raise ConversionError("--base applies to kind decision2 only")
        if args.command in ("export", "fixture") and args.kind not in ("decision3", "decision3-source"):
            from converters.decision3.cli import reject_cli_arguments as reject_decision3

            reject_decision3(args)
        if args.command in ("export", "fixture"):
            _summary(CONVERTERS[args.kind](args))
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
