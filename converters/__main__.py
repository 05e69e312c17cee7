"""python -m converters export | fixture | default (see docs/packages.md).

``export SRC --kind K ...`` and ``fixture --kind K ...``: the kind picks its converter's command line
(``converters/<family>/cli.py``, by CONVERTERS), which owns every option beyond the common ones
(converters/command_line.py), so that an option of one family never needs a rejection in another.
``export`` without ``--kind`` reads the kind from the source's own files (converters/detect.py) and says
what it chose and why.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from converters import CONVERTER_VERSION
from converters.command_line import kind_parser
from converters.encoder.source_fixtures import KINDS as ENCODER_SOURCE_KINDS
from converters.errors import ConversionError
from converters.package_writer import ExportResult

ENCODER_KINDS = ("embedding", "sequence-classification", "multi-label", "token-classification", "rerank")
#: kinds served by the multimodal embedding family (converters/multimodal/)
MULTIMODAL_KINDS = ("image-text-embedding", "audio-embedding")
KIND_CHOICES = (*ENCODER_KINDS, "decision-codes", *MULTIMODAL_KINDS, "vela2", "decision2", "decision-vision",
                "decision3", "task-heads")
#: fixture kinds beyond the export kinds: upstream-format sources that `export` then converts
#: (ENCODER_SOURCE_KINDS: the Router catalogue's Qwen3-Embedding, EmbeddingGemma and PEFT LoRA layouts)
SOURCE_FIXTURE_KINDS = ("vela2-source", "decision2-source", "decision2-lora-source", "decision3-source",
                        "task-heads-source", *ENCODER_SOURCE_KINDS)

#: The converter of every kind `export` and `fixture` take: the module (converters/<family>/cli.py) whose
#: ``add_options(parser, command, kind)`` adds the kind's options and whose ``run(args)`` returns the written
#: package's result for the summary, or None when it printed its own.
CONVERTERS: dict[str, str] = {
    **dict.fromkeys((*ENCODER_KINDS, *ENCODER_SOURCE_KINDS), "converters.encoder.cli"),
    **dict.fromkeys(MULTIMODAL_KINDS, "converters.multimodal.cli"),
    "decision-codes": "converters.decision_codes.cli",
    "decision-vision": "converters.decision_vision.cli",
    **dict.fromkeys(("vela2", "vela2-source"), "converters.vela2.cli"),
    **dict.fromkeys(("decision2", "decision2-source", "decision2-lora-source"), "converters.decision2.cli"),
    **dict.fromkeys(("decision3", "decision3-source"), "converters.decision3.cli"),
    **dict.fromkeys(("task-heads", "task-heads-source"), "converters.task_heads.cli"),
}
def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The commands, and what picks a converter: ``--kind`` (and SRC, to detect it); the kind's own parser
    reads the rest. Returns the parser and its export and fixture parsers (for their overviews)."""
    p = argparse.ArgumentParser(prog="python -m converters", description="Build edge-runtime model packages.")
    # the server's managed cache asks this before reusing a package converted earlier (edge_runtime/artifacts.py)
    p.add_argument("--version", action="version", version=CONVERTER_VERSION,
                   help="print the version these converters write into a card's build, and exit")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", add_help=False, help="convert a model directory (or hub id) into a package",
                       description="python -m converters export SRC --kind KIND --out DIR [the kind's options]; "
                                   "`export SRC --kind KIND --help` lists the kind's options")
    e.add_argument("src", metavar="SRC", nargs="?")
    e.add_argument("--kind", choices=KIND_CHOICES,
                   help="what to export; omitted, it is detected from the source's files (and printed)")
    f = sub.add_parser("fixture", add_help=False, help="build a tiny random-weight package for tests",
                       description="python -m converters fixture --kind KIND --out DIR [--seed N] "
                                   "[the kind's options]; `fixture --kind KIND --help` lists the kind's options")
    f.add_argument("--kind", choices=KIND_CHOICES + SOURCE_FIXTURE_KINDS,
                   help="the *-source kinds write upstream-format sources (the input of export): vela2, "
                        "decision2(-lora), decision3, the ModernBERT task heads, and the Router's "
                        "Qwen3-Embedding, EmbeddingGemma and PEFT LoRA layouts")
    for command in (e, f):
        command.add_argument("--out", type=Path)  # read here too, so that its value is never taken for SRC
    d = sub.add_parser("default", help="build the embedded default packages offline")
    d.add_argument("--out", required=True, type=Path, help="directory that receives one package per model")
    d.add_argument("--force", action="store_true", help="rebuild even when the packages are up to date")
    return p, {"export": e, "fixture": f}


def _summary(result: ExportResult | None) -> None:
    if result is None:  # the step printed its own result
        return
    card = result.card
    print(json.dumps({"path": str(result.path), "name": card["name"], "digest": result.digest,
                      "max_abs_diff": card["verification"]["max_abs_diff"],
                      "variants": {k: v.get("agreement") for k, v in card["variants"].items()},
                      "timings_s": {k: round(v, 2) for k, v in result.timings.items()}},
                     indent=2))


def _detect_kind(src: str | None) -> str:
    """The kind the source's files declare (converters/detect.py), printed with why; else the user must say."""
    from converters.detect import detect
    from converters.progress import log

    if src is None:
        raise ConversionError("export needs SRC, the model directory (or hub id) to convert")
    found = detect(Path(src))
    log(f"detected --kind {found.kind}: {found.reason} (pass --kind to override)")
    return found.kind


def _converter(command: str, kind: str) -> tuple[ModuleType, argparse.ArgumentParser]:
    module = importlib.import_module(CONVERTERS[kind])
    parser = kind_parser(command, kind)
    module.add_options(parser, command, kind)
    return module, parser


def _not_taken(command: str, kind: str, extras: Sequence[str]) -> str:
    """Why ``extras`` were refused: the kinds whose options they are, or that no kind knows them."""
    flags = [a.split("=", 1)[0] for a in extras if a.startswith("--")]
    # argparse offers no public question "do you take this option?": its table of option strings answers it
    owners = {flag: [k for k in KIND_CHOICES if k != kind and flag in _converter(command, k)[1]._option_string_actions]
              for flag in flags}
    if not flags or not all(owners.values()):
        return f"unrecognized arguments: {' '.join(extras)}"
    by_owner: dict[str, list[str]] = {}
    for flag, kinds in owners.items():
        by_owner.setdefault(", ".join(kinds), []).append(flag)
    return "; ".join(f"{', '.join(fs)} apply to kind {kinds} only, not {kind}" for kinds, fs in by_owner.items())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 with a one-line message for a conversion error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top, commands = _parser()
    picked, rest = top.parse_known_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if picked.command == "default":
            from converters.default import build_defaults

            top.parse_args(argv)  # nothing beyond its own options
            for line in build_defaults(picked.out, force=picked.force):
                print(line)
            return 0
        if picked.kind is None and any(a in ("-h", "--help") for a in rest):
            print(commands[picked.command].format_help())
            return 0
        kind = picked.kind
        if kind is None:
            if picked.command == "fixture":
                raise ConversionError("fixture needs --kind")
            kind = _detect_kind(picked.src)
        module, parser = _converter(picked.command, kind)
        args, extras = parser.parse_known_args(argv[1:])
        if extras:
            raise ConversionError(_not_taken(picked.command, kind, extras))
        args.kind = kind
        _summary(module.run(args))
    except ConversionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
