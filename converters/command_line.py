"""What every converter's command line shares: the parser a kind's options are added to (``export``: SRC,
``--out``, ``--kind`` and the identity options; ``fixture``: ``--kind``, ``--out``, ``--seed``), and the
identity options as keyword arguments of PackageIdentity. Each ``converters/<family>/cli.py`` adds its own
options (``add_options``) and runs its kinds (``run``); converters/__main__.py picks the module by kind."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from converters.errors import ConversionError

#: The PackageIdentity fields every export takes as options (``--release-date`` for release_date, ...).
IDENTITY_FIELDS = ("name", "description", "version", "release_date", "revision", "license", "source_name")


class KindParser(argparse.ArgumentParser):
    """A kind's parser: a bad option value is a ConversionError (one line, exit status 2), not an exit."""

    def error(self, message: str) -> NoReturn:
        raise ConversionError(message)


def int_list(text: str) -> list[int]:
    """``3,5`` -> [3, 5]: positive integers, comma-separated (an argparse type)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def kind_parser(command: str, kind: str) -> KindParser:
    """The options every kind of ``command`` takes; the kind's cli.py adds its own."""
    p = KindParser(prog=f"python -m converters {command}", description=f"{command} --kind {kind}")
    p.set_defaults(command=command)
    if command == "export":
        p.add_argument("src", metavar="SRC", help="local Hugging Face model directory, or a hub id when online")
        p.add_argument("--out", required=True, type=Path, help="package directory to write (replaced if present)")
        p.add_argument("--kind", help="what to export; may be omitted for a source whose files name its format")
        g = p.add_argument_group("identity")
        g.add_argument("--name", help="package name (default: the source directory's name)")
        g.add_argument("--description")
        g.add_argument("--version", default="1.0.0", help="package version (default 1.0.0)")
        g.add_argument("--release-date", help="YYYY-MM-DD (default: today, UTC)")
        g.add_argument("--revision", help="default: the first 12 hex digits of the source stamp")
        g.add_argument("--license", help="default: the model card's license, else 'unknown'")
        g.add_argument("--source-name", help="name of the upstream model (default: the source directory's name)")
    else:
        p.add_argument("--kind", required=True)
        p.add_argument("--out", required=True, type=Path)
        p.add_argument("--seed", type=int, default=0)
    return p


def identity(args: argparse.Namespace) -> dict[str, Any]:
    """The identity options of ``export`` as PackageIdentity keyword arguments."""
    return {name: getattr(args, name) for name in IDENTITY_FIELDS}


def source_fixture_out(out: Path) -> Path:
    """``out`` for an upstream-format source fixture, which is written to a new directory only."""
    if out.exists():
        raise ConversionError(f"{out} exists; a source fixture is written to a new directory")
    return out


__all__ = ["IDENTITY_FIELDS", "KindParser", "identity", "int_list", "kind_parser", "source_fixture_out"]
