"""The server's layers import downward only: api -> service/runtime -> requests -> families ->
questions -> engine, heads, text, packages; the leaves (errors, config, timing, work, metrics)
import none of our modules."""

from __future__ import annotations

import ast
from pathlib import Path

import edge_runtime

PACKAGE = Path(edge_runtime.__file__).parent
BOTTOM = {"engine", "heads", "text", "packages", "media"}
LEAVES = {"errors", "config", "timing", "work", "metrics", "__init__"}
ENTRY_POINTS = {"api", "cli", "__main__", "examples"}  # may import anything

#: What each layer may import besides itself and the leaves.
ALLOWED: dict[str, set[str]] = {
    "service": {"runtime", "loading", "requests", "families"},
    "runtime": {"loading", "families", "engine"},
    "loading": {"families", "engine", "packages"},
    "requests": {"questions"},
    "families": {"requests", "questions"} | BOTTOM,
    "questions": {"heads"},
    **{layer: set(BOTTOM) for layer in BOTTOM},
    **{leaf: set() for leaf in LEAVES},
}


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """The edge_runtime layers a module imports (``from edge_runtime import X`` names X)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "edge_runtime":
            names = [node.module] if node.module != "edge_runtime" else [f"edge_runtime.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "edge_runtime"]
        for name in names:
            target = name.split(".")[1]
            found.add(target if (PACKAGE / target).exists() or (PACKAGE / f"{target}.py").exists() else "__init__")
    return found


def test_every_layer_is_known() -> None:
    layers = {_layer(p) for p in PACKAGE.rglob("*.py")}
    assert layers <= set(ALLOWED) | ENTRY_POINTS, layers - set(ALLOWED) - ENTRY_POINTS


def test_imports_go_downward() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = _layer(path)
        if layer in ENTRY_POINTS:
            continue
        allowed = ALLOWED[layer] | LEAVES | {layer}
        if layer in LEAVES:
            allowed = {layer}
        wrong += [f"{path.relative_to(PACKAGE)} imports {target}" for target in _imports(path) - allowed]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from edge_runtime.api.statuses import status_of\nfrom edge_runtime import API_VERSION\n")
    assert _imports(module) == {"api", "__init__"}
