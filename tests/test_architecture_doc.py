"""docs/architecture.md's module tree names every module of edge_runtime, and only modules that exist."""

from __future__ import annotations

import re

from tests.support.server_harness import ROOT

PACKAGE = ROOT / "edge_runtime"
_SECTION = re.compile(r"^( {2}| {4})([a-z_0-9]+/)")
_MODULE = re.compile(r"\b([a-z_0-9]+\.py)\b")


def _documented() -> dict[str, set[str]]:
    """Folder (relative to edge_runtime, "" for the top) -> the .py names its lines mention."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("```\nedge_runtime/\n", 1)[1].split("```", 1)[0]
    folders: dict[str, set[str]] = {"": set()}
    current, parent = "", ""
    for line in block.splitlines():
        if line.startswith(("converters/", "bench/")):
            break
        section = _SECTION.match(line)
        if section:
            indent, name = section.groups()
            if len(indent) == 2:
                parent = current = name.rstrip("/")
            else:
                current = f"{parent}/{name.rstrip('/')}"
            folders.setdefault(current, set())
            line = line[section.end():]
        elif re.match(r"^ {2}[a-z_]+\.py", line):
            current = ""
        folders[current] |= set(_MODULE.findall(line))
    return folders


def _actual() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        folder = path.parent.relative_to(PACKAGE).as_posix()
        found.setdefault("" if folder == "." else folder, set())
        if path.name != "__init__.py" or folder == ".":
            found["" if folder == "." else folder].add(path.name)
    return found


def test_the_tree_names_every_module_and_no_other() -> None:
    documented, actual = _documented(), _actual()
    assert set(documented) == set(actual), sorted(set(documented) ^ set(actual))
    for folder, modules in actual.items():
        assert modules == documented[folder], (folder or "edge_runtime", sorted(modules ^ documented[folder]))


def test_the_parser_reads_family_folders_and_top_modules() -> None:
    documented = _documented()
    assert "family.py" in documented["families/vela2"] and "encoder.py" in documented["engine"]
    assert {"cli.py", "__main__.py", "work.py"} <= documented[""] and "family.py" not in documented["families"]


def _documented_converters() -> dict[str, set[str]]:
    """converters/ folder -> the .py names its line (and the lines under it) mention."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("\nconverters/ ", 1)[1].split("\nbench/", 1)[0]
    folders: dict[str, set[str]] = {"": set()}
    current = ""
    for line in block.splitlines():
        section = re.match(r"^ {2}([a-z_0-9]+)/", line)
        if section:
            current = section.group(1)
            folders[current] = set()
            line = line[section.end():]
        folders[current] |= set(_MODULE.findall(line))
    return folders


def test_the_tree_names_every_converter_folder_and_module() -> None:
    documented = _documented_converters()
    converters = ROOT / "converters"
    actual = {p.parent.name: {m.name for m in p.parent.glob("*.py") if m.name != "__init__.py"}
              for p in converters.glob("*/__init__.py")}
    actual[""] = {m.name for m in converters.glob("*.py") if m.name != "__init__.py"}
    assert set(documented) == set(actual), sorted(set(documented) ^ set(actual))
    for folder, modules in actual.items():
        assert modules == documented[folder], (folder or "converters", sorted(modules ^ documented[folder]))


_PATH = re.compile(r"(?<![\w/.])((?:[a-z_0-9.-]+/)+[a-z_0-9.-]+\.(?:py|md|yaml|json|sh|txt))\b")


def test_every_path_the_document_names_exists() -> None:
    """A path with a folder in it (tests/test_import_rules.py, api/openapi.yaml, bench/harness/load.py)
    names a file of the checkout, of edge_runtime, or of converters."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(_PATH.findall(text))
    assert len(named) > 10  # the parser reads the document's paths
    missing = sorted(p for p in named if not any((base / p).exists() for base in (ROOT, PACKAGE, ROOT / "converters")))
    assert not missing, missing
