"""A second version of each default package: the same model under another digest, written by the unmodified
converters, for replacing one version with another while serving (bench/swap.py, docs/updating-models.md).

- minilm-embedding: the default MiniLM converted again without its int8 variant (fp32 only): another
  digest, the fp32 numbers.
- sparrow-nano: the sparrow converter run on a re-packed copy of the wheel's
  ``sparrow-nano-general-v1.1.sparrow`` (the same three members, the zip timestamps set to REPACK_DATE):
  its card's release date and revision (the source's sha256) differ, so its digest does; the weights,
  and therefore the answers, are the same.
"""

from __future__ import annotations

import dataclasses
import tempfile
import zipfile
from pathlib import Path

from converters.default import MINILM_NAME, SPARROW_NAME
from edge_runtime.families.registry import read_package
from edge_runtime.packages import PackageError

REPACK_DATE = (2026, 12, 5, 0, 0, 0)


def version_paths(versions: Path) -> dict[str, Path]:
    """Where build_versions writes each default model's second version, by model name."""
    return {MINILM_NAME: versions / f"{MINILM_NAME}-fp32", SPARROW_NAME: versions / "sparrow-repacked" / SPARROW_NAME}


def repack_sparrow_source(out: Path) -> Path:
    """A copy of the wheel's sparrow-nano source with the same members, its zip timestamps REPACK_DATE."""
    from converters.sparrow.source import SOURCE_MODEL, source_file

    if out.name != f"{SOURCE_MODEL}.sparrow":
        raise ValueError(f"the re-packed source must keep its name, {SOURCE_MODEL}.sparrow")
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source_file()) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(zipfile.ZipInfo(info.filename, REPACK_DATE), zin.read(info.filename))
    return out


def sparrow_repacked(out_dir: Path) -> Path:
    """The sparrow converter run on the re-packed source: ``out_dir/sparrow-nano``."""
    from converters.sparrow.export import build_sparrow_package
    from converters.sparrow.source import SOURCE_MODEL

    with tempfile.TemporaryDirectory(prefix="sparrow-repack-") as tmp:
        return build_sparrow_package(out_dir, repack_sparrow_source(Path(tmp) / f"{SOURCE_MODEL}.sparrow"))


def minilm_fp32(out: Path) -> Path:
    """The default MiniLM converted again without the int8 variant (fp32 only)."""
    from converters.default import minilm_options, minilm_source
    from converters.encoder.export import export_model

    source = minilm_source()
    export_model(source, out, dataclasses.replace(minilm_options(source), quantize=None, int8_min_cosine=None))
    return out


def _verifies(package: Path) -> bool:
    try:
        read_package(package)
        return True
    except (PackageError, OSError):
        return False


def build_versions(versions: Path) -> dict[str, Path]:
    """Write each default model's second version under ``versions`` unless it is there and verifies; returns
    version_paths(versions)."""
    paths = version_paths(versions)
    if not _verifies(paths[MINILM_NAME]):
        minilm_fp32(paths[MINILM_NAME])
    if not _verifies(paths[SPARROW_NAME]):
        sparrow_repacked(paths[SPARROW_NAME].parent)
    return paths


__all__ = ["REPACK_DATE", "build_versions", "minilm_fp32", "repack_sparrow_source", "sparrow_repacked",
           "version_paths"]
