"""Write a model package directory: files, golden cases, card.json and MANIFEST.json, and the frame
every export runs in (PackageBuild: its named, timed steps and the write at the end).

The package is assembled in a temporary sibling directory, verified with the server's own reader,
and only then moved into place, so a reader never sees a half-written package.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

import numpy as np

from converters.errors import ConversionError
from converters.progress import Step, log
from edge_runtime.engine.cpu import arch_class
from edge_runtime.families.registry import CARD_RULES, read_package, validate_card
from edge_runtime.packages.card import CARD_FILE, CARD_FORMAT
from edge_runtime.packages.golden import golden_bytes
from edge_runtime.packages.manifest import MANIFEST_FILE, build_manifest

GoldenCases = list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]
_RESERVED = {CARD_FILE, MANIFEST_FILE}


@dataclass
class ExportResult:
    """A written package and what the export measured."""

    path: Path
    digest: str
    card: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def card_start(name: str, family: str, kind: str, identity: Mapping[str, Any], modalities: Sequence[str] = ("text",),
               labels: Sequence[str] = ()) -> dict[str, Any]:
    """The members every card opens with: format, name, family, kind, the kind's surfaces, the identity
    (description, version, release date, revision, source: converters.identity.identity_card), the
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


def check_out(out: Path) -> None:
    """ConversionError unless ``out`` may be written (check_replaceable): checked before any work, so that
    a wrong ``--out`` fails at once."""
    try:
        check_replaceable(Path(out))
    except ValueError as e:
        raise ConversionError(str(e)) from None


def json_bytes(obj: Mapping, ensure_ascii: bool = False) -> bytes:
    """A JSON file of the package (card.json, decision_config.json) as written: sorted keys, indented,
    UTF-8, trailing newline."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=ensure_ascii) + "\n").encode("utf-8")


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
    # every golden of the package (the variants', a family's further ones) was recorded here, unless the
    # card says otherwise: a CPU of another class checks them with that pair's tolerance (packages/golden.py)
    card.setdefault("goldens", {"arch_class": arch_class()})
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
        (tmp / CARD_FILE).write_bytes(json_bytes(card))
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


class PackageBuild:
    """One export as a short pipeline of named steps: ``with PackageBuild(out, prefix) as build:``, then
    ``with build.step(key, what):`` for reading the source, exporting the graphs and verifying them (each
    logged, and timed under ``key`` in the result's timings), ``build.work`` for their files, and
    ``build.write(card, files, goldens)`` at the end. ``out`` is checked before any work; the work
    directory is removed when the build ends, written or not."""

    def __init__(self, out: Path, prefix: str) -> None:
        self.out = Path(out)
        self.prefix = prefix
        self.timings: dict[str, float] = {}
        check_out(self.out)
        self._work: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> PackageBuild:
        self._work = tempfile.TemporaryDirectory(prefix=self.prefix)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._work is not None:
            self._work.cleanup()
            self._work = None

    @property
    def work(self) -> Path:
        """The build's temporary directory (graphs, checks)."""
        if self._work is None:
            raise RuntimeError("PackageBuild.work is only there inside its with block")
        return Path(self._work.name)

    @contextmanager
    def step(self, key: str, what: str) -> Iterator[None]:
        """Log ``what`` and, when it succeeds, record its seconds as ``timings[key]``."""
        with Step(what) as s:
            yield
        self.timings[key] = s.seconds

    def write(self, card: dict[str, Any], files: Mapping[str, Path | bytes],
              goldens: Mapping[str, GoldenCases]) -> ExportResult:
        """Write the package (write_package) and return it as written, with the steps' timings."""
        with self.step("write", f"writing package {self.out}"):
            digest = write_package(self.out, card, files, goldens)
        log(f"package {card['name']} written to {self.out} (digest {digest[:16]}...)")
        return ExportResult(path=self.out, digest=digest, card=read_package(self.out).card.raw,
                            timings=dict(self.timings))
