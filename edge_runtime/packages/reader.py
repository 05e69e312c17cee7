"""Read and verify a package directory before anything loads it.

Order of checks: MANIFEST.json (well-formed, no odd paths), the directory matches it exactly (no
missing, extra or linked file), every size and sha256, the digest, then card.json (schema and
consistency), the files the card names, and the numpy files (readable without pickle). Nothing
in a package is imported, executed or unpickled; this module needs neither onnxruntime nor torch.

One kind of link is followed: a package that is a snapshot in a Hugging Face cache
(``models--ORG--NAME/snapshots/REV``) is made of links into that repository's ``blobs/``, each
blob named by its content; a link that leads anywhere else is refused as any link is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge_runtime.packages.card import (
    CARD_FILE,
    DECISION_CONFIG_FILE,
    TOKENIZER_FILE,
    Card,
    CardRules,
    parse_card,
)
from edge_runtime.packages.errors import PackageError
from edge_runtime.packages.golden import GoldenCase, read_golden
from edge_runtime.packages.manifest import (
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    compute_digest,
    file_sha256,
    list_package_files,
)

HEAD_FILE = "head.npz"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Package:
    """A verified package. Paths it hands out are inside ``path`` and listed in the manifest."""

    path: Path
    card: Card
    digest: str
    files: dict[str, str]

    def file(self, rel: str) -> Path:
        """The path of a file the manifest lists; PackageError for any other name."""
        if rel not in self.files:
            raise PackageError(rel, "not in the package")
        return self.path / rel

    def graph(self, variant: str) -> Path:
        """The ONNX graph of a variant (``fp32``, ``int8``, ...)."""
        return self.file(self._variant(variant).file)

    def golden(self, variant: str) -> list[GoldenCase]:
        """The golden cases recorded for a variant."""
        rel = self._variant(variant).golden
        try:
            return read_golden(self.file(rel))
        except (ValueError, OSError, KeyError) as e:
            raise PackageError(rel, f"unreadable golden file: {e}") from None

    def head_weights(self) -> dict[str, np.ndarray]:
        """head.npz arrays (empty when the package has none), loaded with allow_pickle=False."""
        if HEAD_FILE not in self.files:
            return {}
        return _load_npz(self.path / HEAD_FILE, HEAD_FILE)

    def decision_config(self) -> dict[str, Any] | None:
        """decision_config.json as an object, or None when the package has none."""
        if DECISION_CONFIG_FILE not in self.files:
            return None
        return _load_json_object(self.path / DECISION_CONFIG_FILE, DECISION_CONFIG_FILE)

    def require_decision_config(self) -> dict[str, Any]:
        """decision_config.json as an object; PackageError when the package has none (a decision
        family cannot plan without it)."""
        config = self.decision_config()
        if config is None:
            raise PackageError(DECISION_CONFIG_FILE, f"package {self.card.name} has no {DECISION_CONFIG_FILE}")
        return config

    def _variant(self, variant: str):
        try:
            return self.card.variants[variant]
        except KeyError:
            known = ", ".join(sorted(self.card.variants))
            raise PackageError(CARD_FILE, f"no variant {variant!r} (variants: {known})") from None


def _load_json_object(path: Path, rel: str) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackageError(rel, f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise PackageError(rel, "must hold a JSON object")
    return obj


def _load_npz(path: Path, rel: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except ValueError as e:
        # numpy raises ValueError for object arrays when pickles are not allowed
        raise PackageError(rel, f"refused: {e}") from None
    except Exception as e:  # noqa: BLE001 - a corrupt zip raises many types; all mean "unreadable"
        raise PackageError(rel, f"unreadable npz file: {e}") from None


def _blobs(root: Path) -> Path | None:
    """The ``blobs/`` folder a Hugging Face cache snapshot's links may lead into, or None."""
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent / "blobs"
    return None


def _linked_elsewhere(path: Path, blobs: Path | None) -> bool:
    """Whether ``path`` is a link that does not lead to a regular file in ``blobs``."""
    if not path.is_symlink():
        return False
    target = path.resolve()
    return blobs is None or target.parent != blobs.resolve() or not target.is_file()


def _read_manifest(root: Path) -> tuple[dict[str, dict[str, Any]], str]:
    mpath = root / MANIFEST_FILE
    if not mpath.is_file() or _linked_elsewhere(mpath, _blobs(root)):
        raise PackageError(MANIFEST_FILE, "missing")
    manifest = _load_json_object(mpath, MANIFEST_FILE)
    if manifest.get("format") != MANIFEST_FORMAT:
        raise PackageError(MANIFEST_FILE, f"format must be {MANIFEST_FORMAT!r}")
    files, digest = manifest.get("files"), manifest.get("digest")
    if not isinstance(files, dict) or not files:
        raise PackageError(MANIFEST_FILE, "files must be a non-empty object")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise PackageError(MANIFEST_FILE, "digest must be a sha256 hex string")
    for rel, entry in files.items():
        parts = rel.split("/")
        if rel == MANIFEST_FILE or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in rel:
            raise PackageError(MANIFEST_FILE, f"bad path {rel!r}")
        if (not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str)
                or not _SHA256.match(entry["sha256"]) or not isinstance(entry.get("size"), int)
                or isinstance(entry.get("size"), bool) or entry["size"] < 0):
            raise PackageError(MANIFEST_FILE, f"entry for {rel!r} needs sha256 (hex) and size (int)")
    return files, digest


def _verify_files(root: Path, files: dict[str, dict[str, Any]]) -> None:
    on_disk = list_package_files(root)
    blobs = _blobs(root)
    for rel in on_disk:
        p = root / rel
        if _linked_elsewhere(p, blobs):
            raise PackageError(rel, "symbolic links are not allowed in a package (but into a Hugging Face "
                                    "cache snapshot's own blobs)")
        if rel not in files:
            raise PackageError(rel, "not listed in MANIFEST.json")
        if not p.is_file():
            raise PackageError(rel, "not a regular file")
    present = set(on_disk)
    for rel in sorted(files):
        if rel not in present:
            raise PackageError(rel, "listed in MANIFEST.json but missing")
    for rel, entry in sorted(files.items()):
        p = root / rel
        size = p.stat().st_size
        if size != entry["size"]:
            raise PackageError(rel, f"size {size} differs from MANIFEST.json ({entry['size']}): file altered")
        if file_sha256(p) != entry["sha256"]:
            raise PackageError(rel, "sha256 differs from MANIFEST.json: file altered")


def read_package(path: Path, rules: CardRules) -> Package:
    """Verify the package directory at ``path`` under the served families' card ``rules`` and return
    it; PackageError names what is wrong."""
    root = Path(path)
    if not root.is_dir():
        raise PackageError(str(root), "not a package directory")
    root = root.resolve()
    files, digest = _read_manifest(root)
    _verify_files(root, files)
    sha = {rel: entry["sha256"] for rel, entry in files.items()}
    if compute_digest(sha) != digest:
        raise PackageError(MANIFEST_FILE, "digest does not match its file list")
    if CARD_FILE not in files:
        raise PackageError(CARD_FILE, "missing")
    card = parse_card((root / CARD_FILE).read_bytes(), rules)

    family = rules.families[card.family]
    required = family.files(card.raw)
    for v in card.variants.values():
        required[v.file] = f"the graph of variant {v.name!r}"
        required[v.golden] = f"the golden cases of variant {v.name!r}"
    for rel, what in required.items():
        if rel not in files:
            raise PackageError(rel, f"missing ({what}, named by card.json)")

    pkg = Package(path=root, card=card, digest=digest, files=sha)
    if TOKENIZER_FILE in required:
        _load_json_object(root / TOKENIZER_FILE, TOKENIZER_FILE)
    for v in card.variants.values():
        pkg.golden(v.name)  # readable without pickle, well-formed
    for rel in family.goldens(card.raw):
        try:
            read_golden(root / rel)
        except (ValueError, OSError, KeyError) as e:
            raise PackageError(rel, f"unreadable golden file: {e}") from None
    pkg.head_weights()
    pkg.decision_config()
    return pkg
