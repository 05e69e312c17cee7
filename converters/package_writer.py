"""Write a model package directory: files, golden cases, card.json and MANIFEST.json.

The package is assembled in a temporary sibling directory, verified with the server's own reader,
and only then moved into place, so a reader never sees a half-written package.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from edge_runtime.families.registry import CARD_RULES, read_package, validate_card
from edge_runtime.packages.card import CARD_FILE, CARD_FORMAT
from edge_runtime.packages.golden import golden_bytes
from edge_runtime.packages.manifest import MANIFEST_FILE, build_manifest

GoldenCases = list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
_RESERVED = {CARD_FILE, MANIFEST_FILE}


def card_start(name: str, family: str, kind: str, identity: Mapping[str, Any], modalities: Sequence[str] = ("text",),
               labels: Sequence[str] = ()) -> dict[str, Any]:
    """The members every card opens with: format, name, family, kind, the kind's surfaces, the identity
    (description, version, release date, revision, source: converters.export.identity_card), the
    modalities and the labels. Each converter adds its head, limits, graph, variants, verification."""
    return {"format": CARD_FORMAT, "name": name, "family": family, "kind": kind,
            "surfaces": list(CARD_RULES.kind_surfaces[kind]), **identity, "modalities": list(modalities),
            "labels": list(labels)}


def golden_name(variant: str, file: str) -> str:
    """The golden file of a variant: golden.npz for the main graph model.onnx, golden.<v>.npz otherwise."""
    return "golden.npz" if file == "model.onnx" else f"golden.{variant}.npz"


def check_replaceable(out: Path) -> None:
    """Refuse to write over anything but a package or an empty directory (``--out ~`` must not wipe a home)."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out} exists and is not a directory; refusing to replace it")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise ValueError(f"{out} is a non-empty directory without {MANIFEST_FILE}, not a package; "
                         "refusing to replace it")


def card_json_bytes(card: Mapping) -> bytes:
    """card.json as written: sorted keys, indented, UTF-8, trailing newline."""
    return (json.dumps(card, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _check_rel(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or not p.parts or any(part in ("", ".", "..") for part in p.parts) or "\\" in rel:
        raise ValueError(f"package file name {rel!r} must be a relative posix path inside the package")
    if rel in _RESERVED or (p.name.startswith("golden") and p.suffix == ".npz"):
        raise ValueError(f"{rel!r} is written by write_package itself")
    return p.as_posix()


def write_package(
    out: Path,
    card: dict,
    files: Mapping[str, Path | bytes],
    goldens: Mapping[str, GoldenCases],
) -> str:
    """Write the package ``out`` (replacing an existing one) and return its digest.

    ``files`` maps relative package paths to a source file or bytes (model.onnx, tokenizer.json,
    head.npz, LICENSES/..., ...). ``goldens`` maps each variant of ``card["variants"]`` to its cases
    (one-row feeds and outputs); the writer fills each variant's ``golden`` field. The card is
    validated against the schema before anything is written, and the whole package is verified
    with ``read_package`` before it replaces ``out``. An existing ``out`` must be a package (it has
    MANIFEST.json) or an empty directory.
    """
    out = Path(out)
    card = copy.deepcopy(dict(card))
    variants = card.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ValueError("card.variants must name at least one variant")
    if set(goldens) != set(variants):
        raise ValueError(f"goldens are given for {sorted(goldens)} but the card's variants are {sorted(variants)}")
    for name, v in variants.items():
        if not isinstance(v, dict) or "file" not in v:
            raise ValueError(f"card.variants[{name!r}] needs a file")
        v["golden"] = golden_name(name, v["file"])
        if not goldens[name]:
            raise ValueError(f"variant {name!r} needs at least one golden case")
    validate_card(card)
    entries = {_check_rel(rel): src for rel, src in files.items()}
    check_replaceable(out)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for rel, src in sorted(entries.items()):
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, (bytes, bytearray)):
                dst.write_bytes(bytes(src))
            else:
                shutil.copyfile(src, dst)
        for name, v in variants.items():
            (tmp / v["golden"]).write_bytes(golden_bytes(goldens[name]))
        (tmp / CARD_FILE).write_bytes(card_json_bytes(card))
        manifest = build_manifest(tmp)
        (tmp / MANIFEST_FILE).write_bytes(
            (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode("utf-8"))
        read_package(tmp)  # the server's reader is the judge of a well-formed package
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest["digest"]


def replace_dir(new: Path, target: Path) -> None:
    """Move directory ``new`` to ``target``; an existing target is moved aside first and removed after."""
    if not target.exists() and not target.is_symlink():
        os.rename(new, target)
        return
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    try:
        os.rename(new, target)
    except BaseException:
        os.rename(old, target)
        raise
    if old.is_dir() and not old.is_symlink():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink()
