"""What a models.yaml entry is, and what changed between two readings of the file.

An entry's identity is its package's digest (from MANIFEST.json), its variant and its settings
(every key but the name, the package path, the aliases and the update rules): the same digest at
another path is the same version; new settings on the same package are a new version (a new
session is built); new aliases or update rules are taken without a swap.
A package is acted on only once every file its manifest lists is in place at its listed size and
nothing else is there: a package still being copied is waited for, never loaded in part.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_runtime.config import ModelConfig
from edge_runtime.packages.manifest import MANIFEST_FILE as MANIFEST
from edge_runtime.packages.manifest import list_package_files


@dataclass(frozen=True)
class Identity:
    """The digest, variant and settings that make a served version what it is."""

    digest: str | None
    variant: str
    settings: tuple[tuple[str, Any], ...]

    @property
    def version_id(self) -> str | None:
        return None if self.digest is None else self.digest[:8]


def settings_of(entry: ModelConfig) -> tuple[tuple[str, Any], ...]:
    """Every setting of an entry that a loaded version depends on (not the name, path or aliases)."""
    skip = {"name", "package", "aliases", "variant", "update"}
    return tuple((f.name, getattr(entry, f.name)) for f in dataclasses.fields(entry) if f.name not in skip)


def identity(entry: ModelConfig, digest: str | None = None) -> Identity:
    """An entry's identity; the digest is read from its manifest unless given (None if unreadable)."""
    return Identity(digest if digest is not None else manifest_digest(entry.package), entry.variant,
                    settings_of(entry))


def manifest_digest(package: Path) -> str | None:
    """MANIFEST.json's digest as written (verified only when the package is read)."""
    try:
        digest = json.loads((package / MANIFEST).read_text(encoding="utf-8")).get("digest")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def incomplete(package: Path) -> str | None:
    """Why a package is not yet all in place (still being copied), or None when it is.

    Cheap (stat only): the manifest must parse, list every file present, and each listed file must
    have its listed size. Hashes are checked by the load itself (a file of the right size with the
    wrong bytes is corrupt, and fails the load, rather than incomplete).
    """
    try:
        manifest = json.loads((package / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{package}: {MANIFEST} is not there yet"
    except OSError as exc:
        return f"{package}: {MANIFEST} cannot be read ({exc.strerror})"
    except ValueError:
        return f"{package}: {MANIFEST} is not complete JSON yet"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return f"{package}: {MANIFEST} lists no files"
    for rel, entry in files.items():
        path = package / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{package}: {rel} is not there yet"
        want = entry.get("size") if isinstance(entry, dict) else None
        if size != want:
            return f"{package}: {rel} has {size} of {want} bytes"
    for rel in list_package_files(package):
        if rel not in files and (package / rel).is_file():
            return f"{package}: {rel} is not in {MANIFEST} (a copy in progress?)"
    return None


@dataclass(frozen=True)
class Change:
    """One entry's fate in a reload: unchanged, aliases (aliases or update rules, taken without a
    swap), changed (a swap), added (a load), removed (drain and unload), wait (its package is not
    complete yet) or retry (its last load failed and it is asked again)."""

    name: str
    action: str
    entry: ModelConfig | None
    from_version: str | None = None
    to_version: str | None = None
    reason: str | None = None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.name, "action": self.action}
        for key in ("from_version", "to_version", "reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.entry is not None:
            out["package"] = str(self.entry.package)
            out["variant"] = self.entry.variant
        return out


def plan(applied: dict[str, tuple[ModelConfig, Identity]], wanted: tuple[ModelConfig, ...],
         failed: dict[str, Identity], retry_failed: bool) -> list[Change]:
    """The changes that take the process from the entries last applied to ``wanted``.

    ``failed`` holds, per name, the identity whose last load failed: a poll leaves it alone until
    the entry changes again; a SIGHUP or an admin reload (``retry_failed``) tries it once more.
    """
    changes: list[Change] = []
    for entry in wanted:
        new = identity(entry)
        old = applied.get(entry.name)
        waiting = incomplete(entry.package)
        if old is None:
            if waiting:
                changes.append(Change(entry.name, "wait", entry, None, new.version_id, waiting))
            elif failed.get(entry.name) == new and not retry_failed:
                changes.append(Change(entry.name, "unchanged", entry, None, new.version_id, "its last load failed"))
            else:
                changes.append(Change(entry.name, "added", entry, None, new.version_id))
            continue
        old_entry, old_identity = old
        if old_identity == new:
            taken = old_entry.aliases != entry.aliases or old_entry.update != entry.update
            action = "aliases" if taken else "unchanged"
            changes.append(Change(entry.name, action, entry, old_identity.version_id, new.version_id))
        elif waiting:
            changes.append(Change(entry.name, "wait", entry, old_identity.version_id, new.version_id, waiting))
        elif failed.get(entry.name) == new and not retry_failed:
            changes.append(Change(entry.name, "unchanged", entry, old_identity.version_id, new.version_id,
                                  "its last load failed; a SIGHUP or an admin reload tries it again"))
        else:
            changes.append(Change(entry.name, "changed", entry, old_identity.version_id, new.version_id))
    names = {e.name for e in wanted}
    for name, (_, old_identity) in applied.items():
        if name not in names:
            changes.append(Change(name, "removed", None, old_identity.version_id))
    return changes
