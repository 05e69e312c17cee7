"""How every exported package is named, dated, credited and licensed: the identity options of every
converter, the card members they fill, and the source's license files."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LICENSE_FILES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "NOTICE", "NOTICE.txt", "NOTICE.md")


@dataclass(kw_only=True)
class PackageIdentity:
    """How any exported package is named, dated and credited; None means "read it from the source".

    Keyword-only, so that a kind's options keep their own positional fields first.
    """

    name: str | None = None
    description: str | None = None
    version: str = "1.0.0"
    release_date: str | None = None
    revision: str | None = None
    license: str | None = None
    source_name: str | None = None
    #: more files for the package (license notices, ...), by package path
    extra_files: dict[str, Path | bytes] = field(default_factory=dict)


def sanitize_name(name: str) -> str:
    """A package name: lowercase ``[a-z0-9._-]``, other runs as one ``-``, at most 128 characters."""
    clean = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")
    return clean[:128] or "model"


def _readme_license(src: Path) -> str | None:
    """The license: field of a model card's YAML front matter, if any."""
    readme = src / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---\s*\n", text, re.S)
    if not m:
        return None
    import yaml

    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return None
    lic = meta.get("license") if isinstance(meta, dict) else None
    return str(lic) if isinstance(lic, (str, int, float)) else None


def identity_card(opts: PackageIdentity, src_dir: Path, *, source_name: str, architecture: str, stamp: str,
                  description: str) -> dict[str, Any]:
    """The card's description, version, release_date, revision and source, defaults filled in.

    ``description`` is the kind's default text; the revision defaults to the source stamp's first
    12 characters, the release date to today (UTC), the license to the README's front matter.
    """
    return {
        "description": opts.description or description,
        "version": opts.version,
        "release_date": opts.release_date or dt.datetime.now(dt.UTC).date().isoformat(),
        "revision": opts.revision or stamp[:12],
        "source": {"name": source_name, "architecture": architecture,
                   "license": opts.license or _readme_license(src_dir) or "unknown"},
    }


def notice_files(src_dir: Path, opts: PackageIdentity) -> dict[str, Path | bytes]:
    """The source's license and notice files under ``LICENSES/``, then the options' extra files."""
    files: dict[str, Path | bytes] = {f"LICENSES/{name}": src_dir / name
                                      for name in _LICENSE_FILES if (src_dir / name).is_file()}
    files.update(opts.extra_files)
    return files


__all__ = ["PackageIdentity", "identity_card", "notice_files", "sanitize_name"]
