"""No converter family leans on a sibling: a folder of converters/ that converts one family (its own kinds,
fixture and verification) imports no other family's folder, at module level or inside a function. What two
families share lives in a named shared module at the top of converters/ (causal_lm.py, qwen_vision.py,
package_writer.py, ...), which imports no family."""

from __future__ import annotations

from tests.support.imports import import_graph, imports_of, module_files
from tests.support.server_harness import ROOT

#: The modules at the top of converters/ that are tables of the families (they name every kind, detect the kinds,
#: or build the defaults from two of them), and may import a family's folder.
TABLES = {"converters.__main__", "converters.default", "converters.versions", "converters.detect"}


def _family(module: str) -> str | None:
    """The family folder a converters module belongs to, or None for a shared module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else None


def family_leans(graph: dict[str, set[str]]) -> list[str]:
    """Every import of one family folder by another, or of a family by a shared module that is not a table."""
    found = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            mine, theirs = _family(module), _family(target)
            if theirs is None or mine == theirs or (mine is None and module in TABLES):
                continue
            found.append(f"{module} imports {target}")
    return found


def test_the_family_folders() -> None:
    folders = {p.parent.name for p in (ROOT / "converters").glob("*/__init__.py")}
    assert folders == {"encoder", "sparrow", "decision_codes", "decision2", "vela2", "decision_vision",
                       "multimodal", "decision3", "task_heads"}


def test_no_converter_family_imports_a_sibling() -> None:
    assert family_leans(import_graph(module_files(ROOT, ["converters"]))) == []


def test_a_sibling_import_is_caught_even_inside_a_function() -> None:
    known = {"converters.decision3.vision", "converters.decision_vision.export", "converters.qwen_vision",
             "converters.package_writer"}
    source = ("from converters.qwen_vision import verify_image\n"
              "def f():\n    from converters.decision_vision.export import g\n")
    graph = {"converters.decision3.vision": imports_of("converters.decision3.vision", source, known),
             "converters.package_writer": imports_of("converters.package_writer",
                                                     "from converters.decision_vision import export\n", known)}
    assert family_leans(graph) == [
        "converters.decision3.vision imports converters.decision_vision.export",
        "converters.package_writer imports converters.decision_vision.export"]
