"""Artifacts of the Router's models file: where each one's package is, and converting a source once.

An artifact (an entry's ``model``, or a ``serve MODEL`` argument) is, in this order:

- a directory holding a package (``card.json`` and ``MANIFEST.json``): served as it is;
- any other directory: a source that a converter reads (``python -m converters export``), converted
  once into the cache directory and reused while its files are unchanged (by their digest) and the
  converters here are the version that made it (a newer converter's package is made again);
- a repo id ``ORG/NAME`` found offline in the Hugging Face cache layout of the cache directory,
  ``models--ORG--NAME/snapshots/REV`` (``refs/<revision>`` names REV for a branch or a tag, and
  ``refs/main`` when no revision is given), then read as a directory, as above.

Nothing is downloaded, ever: an artifact that is not there fails its model alone, with a reason that
says where it was looked for and how to put it there.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.packages.manifest import MANIFEST_FILE

log = logging.getLogger("edge_runtime.artifacts")

#: Conversions live here, under the cache directory, one package directory each.
CONVERTED_DIR = "edge-runtime-packages"
#: What a conversion needs that the server does not: the converters' extra.
CONVERTER_MODULES = ("torch", "transformers", "optimum")
#: The converters' command line, run in a process of its own: the server never imports torch.
CONVERTER = (sys.executable, "-m", "converters")
CONVERT_COMMAND = "python -m converters export SRC --out DIR"
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: How long asking the converters for their version may take (they import their own modules first).
VERSION_TIMEOUT_S = 60
#: The last lines of a failed conversion's output that its reason quotes.
_REASON_LINES = 3


class ArtifactError(Exception):
    """An artifact that cannot become a package here: not found, or not convertible. Never retried."""


@dataclass(frozen=True)
class Location:
    """Where an artifact's package is (for a source: where its conversion goes), the source to
    convert, or why the artifact was not found."""

    package: Path
    source: Path | None = None
    missing: str | None = None


def locate(artifact: str, revision: str | None, base: Path, cache_dir: Path) -> Location:
    """Find ``artifact`` on disk (see the module): a path relative to ``base`` first, then a repo id
    in ``cache_dir``. Only looks: nothing is read beyond directory entries, nothing is converted."""
    path = Path(artifact).expanduser()
    directory = path if path.is_absolute() else base / path
    if directory.is_dir():
        return _directory(directory, artifact, cache_dir)
    if artifact.startswith((".", "/", "~")) or not _REPO_ID.match(artifact):
        return Location(directory, missing=f"artifact {artifact!r}: there is no directory {directory}")
    snapshot = hub_snapshot(cache_dir, artifact, revision)
    if isinstance(snapshot, str):
        return Location(directory, missing=snapshot)
    return _directory(snapshot, artifact, cache_dir)


def hub_snapshot(cache_dir: Path, repo: str, revision: str | None) -> Path | str:
    """The snapshot directory of ``repo`` at ``revision`` in a Hugging Face cache, or why there is none."""
    folder = cache_dir / ("models--" + repo.replace("/", "--"))
    wanted = f"{repo}@{revision}" if revision else repo
    fix = (f"nothing is downloaded: copy its snapshot there (on a connected machine: huggingface-cli download "
           f"{repo}{f' --revision {revision}' if revision else ''} --cache-dir {cache_dir}), or name a package "
           "directory")
    if not folder.is_dir():
        return f"{wanted} is not in the Hugging Face cache {cache_dir} (no {folder.name}); {fix}"
    ref = revision or "main"
    commit = ref
    if not _COMMIT.match(ref):
        try:
            commit = (folder / "refs" / ref).read_text(encoding="utf-8").strip()
        except OSError:
            return f"{wanted}: the cache {cache_dir} has no ref {ref!r} for it (refs/{ref}); {fix}"
    snapshot = folder / "snapshots" / commit
    if not snapshot.is_dir():
        return f"{wanted}: snapshot {commit} is not in the cache {cache_dir}; {fix}"
    return snapshot


def _directory(directory: Path, artifact: str, cache_dir: Path) -> Location:
    if is_package(directory):
        return Location(directory)
    # one conversion per source directory: its path names the place, its files' digest the content
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:12]
    slug = _UNSAFE.sub("_", artifact.strip("/")).strip("_")[-60:] or "artifact"
    return Location(cache_dir / CONVERTED_DIR / f"{slug}-{key}", source=directory)


def is_package(directory: Path) -> bool:
    """Whether ``directory`` holds a package (its card and manifest; verified when it loads)."""
    return (directory / "card.json").is_file() and (directory / MANIFEST_FILE).is_file()


# -- converting a source once --------------------------------------------------------------------


def convert_once(source: Path, package: Path, name: str, stop: threading.Event | None = None,
                 converter: Sequence[str] = CONVERTER) -> str:
    """Make ``package`` from ``source`` with ``converter export SRC --out DIR --name NAME`` unless a
    conversion of the same files by the same converter version is already there; returns what was
    done (for the log and the model's load record). Processes that start together convert once: the
    others wait on a lock beside the package. ``stop`` ends a running conversion (the server is
    stopping). Raises ArtifactError when the source cannot be converted here."""
    record = package.with_name(package.name + ".source.json")
    package.parent.mkdir(parents=True, exist_ok=True)
    with _locked(package.with_name(package.name + ".lock"), stop):
        fingerprint = files_fingerprint(source)
        kept = _read_record(record)
        digest, why = None, ""
        if is_package(package) and kept is not None:
            made_by, here = built_by(package), converter_version(converter)
            if here is not None and made_by != here:
                why = f" (the package there was made by converter {made_by}; the converters here are {here})"
            elif kept.get("fingerprint") == fingerprint:
                return f"reused {package} (converted from {source}; its files are unchanged)"
            else:
                digest = files_digest(source)
                if kept.get("digest") == digest:
                    _write_record(record, source, fingerprint, digest)
                    return f"reused {package} (converted from {source}; same content)"
        digest = digest or files_digest(source)
        started = time.monotonic()
        _convert(source, package, name, stop, converter)
        _write_record(record, source, fingerprint, digest)
        return f"converted {source} into {package} in {time.monotonic() - started:.1f} s{why}"


def built_by(package: Path) -> str | None:
    """The converter version a package's card records (``build.converter_version``)."""
    try:
        build = json.loads((package / "card.json").read_text(encoding="utf-8")).get("build")
    except (OSError, ValueError, AttributeError):
        return None
    return build.get("converter_version") if isinstance(build, dict) else None


def converter_version(converter: Sequence[str] = CONVERTER) -> str | None:
    """The version ``converter --version`` says it writes, or None where the converters cannot run here
    (then a package they made earlier is reused as it is: nothing here could make it again)."""
    if tuple(converter) == CONVERTER and converters_missing():
        return None
    try:
        done = subprocess.run([*converter, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = done.stdout.strip()
    return version if done.returncode == 0 and version else None


def converters_missing() -> list[str]:
    """The converters' modules this environment lacks (the server runs without them)."""
    return [m for m in CONVERTER_MODULES if importlib.util.find_spec(m) is None]


def _convert(source: Path, package: Path, name: str, stop: threading.Event | None,
             converter: Sequence[str]) -> None:
    missing = converters_missing() if tuple(converter) == CONVERTER else []
    if missing:
        raise ArtifactError(
            f"{source} is not a package and converting it needs the converters ({', '.join(missing)} "
            f"missing): install edge-runtime[convert] here, or convert it elsewhere with `{CONVERT_COMMAND}` "
            "and serve DIR")
    work = package.with_name(f"{package.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    output = package.with_name(package.name + ".convert.log")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    command = [*converter, "export", str(source), "--out", str(work), "--name", name]
    log.info("converting %s: %s", source, " ".join(command))
    with open(output, "wb") as sink:
        child = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                try:
                    child.wait(0.25)
                    break
                except subprocess.TimeoutExpired:
                    if stop is not None and stop.is_set():
                        raise ArtifactError(f"the conversion of {source} was stopped: the server is stopping") from None
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(5)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    if child.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        tail = [line for line in output.read_text(errors="replace").splitlines() if line.strip()][-_REASON_LINES:]
        raise ArtifactError(f"{source} could not be converted (exit {child.returncode}; log {output}): "
                            + " | ".join(tail))
    shutil.rmtree(package, ignore_errors=True)
    work.rename(package)


def files_fingerprint(source: Path) -> str:
    """A digest of every file's path, size and modification time: cheap, and changed by any edit."""
    h = hashlib.sha256()
    for rel, path in _files(source):
        stat = path.stat()
        h.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()


def files_digest(source: Path) -> str:
    """The sha256 of every file's path and content (symbolic links followed, as the HF cache uses them)."""
    h = hashlib.sha256()
    for rel, path in _files(source):
        h.update(f"{rel}\0".encode())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()


def _files(source: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(source.rglob("*")):
        if path.is_file() and ".git" not in path.relative_to(source).parts:
            yield path.relative_to(source).as_posix(), path


def _read_record(record: Path) -> dict[str, str] | None:
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_record(record: Path, source: Path, fingerprint: str, digest: str) -> None:
    data = {"source": str(source), "fingerprint": fingerprint, "digest": digest}
    tmp = record.with_name(record.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(record)


@contextmanager
def _locked(path: Path, stop: threading.Event | None) -> Iterator[None]:
    """An exclusive lock on ``path`` (another process converting the same source holds it until done)."""
    with open(path, "a+b") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if stop is not None and stop.is_set():
                    raise ArtifactError(f"stopped while waiting for {path}: the server is stopping") from None
                time.sleep(0.25)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
