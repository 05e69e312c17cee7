"""MANIFEST.json: the sha256 and size of every file of a package, and the model digest.

The digest is the sha256 hex of the canonical JSON of ``{relpath: sha256}``; it identifies the
model (``model_sha256`` on the wire) and changes when any file of the package changes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST_FILE = "MANIFEST.json"
MANIFEST_FORMAT = "edge-runtime-manifest/1"
_CHUNK = 1 << 20


def canonical_json(obj: Any) -> bytes:
    """The canonical UTF-8 JSON encoding used for digests: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def compute_digest(files: dict[str, str]) -> str:
    """The model digest: sha256 hex of the canonical JSON of ``{relpath: sha256}``."""
    return hashlib.sha256(canonical_json(dict(files))).hexdigest()


def list_package_files(root: Path) -> list[str]:
    """Every regular file under ``root`` except MANIFEST.json, as sorted posix relative paths.

    Symbolic links are returned too (the reader refuses them); directories are walked.
    """
    out: list[str] = []
    for p in sorted(root.rglob("*")):
        if p.is_dir() and not p.is_symlink():
            continue
        rel = p.relative_to(root).as_posix()
        if rel != MANIFEST_FILE:
            out.append(rel)
    return out


def build_manifest(root: Path) -> dict[str, Any]:
    """The manifest of the package directory ``root`` as it is on disk now."""
    files: dict[str, dict[str, Any]] = {rel: {"sha256": file_sha256(root / rel), "size": (root / rel).stat().st_size}
             for rel in list_package_files(root)}
    digest = compute_digest({rel: entry["sha256"] for rel, entry in files.items()})
    return {"format": MANIFEST_FORMAT, "files": files, "digest": digest}
