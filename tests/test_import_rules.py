"""The server runs without torch, transformers or optimum, and the layers keep their import rules:
api -> service/runtime/loading -> requests -> families -> questions -> engine, heads, text, packages,
media; the bottom layers import none of one another, and the leaves (errors, config, timing, work,
metrics) import none of our modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support.server_harness import ROOT

PACKAGE = ROOT / "edge_runtime"


def test_server_imports_no_training_stack() -> None:
    code = (
        "import sys, pkgutil, importlib, edge_runtime\n"
        "for m in pkgutil.walk_packages(edge_runtime.__path__, 'edge_runtime.'):\n"
        "    if m.name != 'edge_runtime.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'transformers', 'optimum'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_layer_rules() -> None:
    """api/ never touches onnxruntime; requests/ and heads/ import neither sanic nor onnxruntime."""
    forbidden = {"api": {"onnxruntime"}, "requests": {"onnxruntime", "sanic"}, "heads": {"onnxruntime", "sanic"},
                 "families": {"sanic"}, "engine": {"sanic"},
                 "questions": {"onnxruntime", "sanic"}, "packages": {"onnxruntime", "sanic"},
                 "text": {"onnxruntime", "sanic"}}
    for layer, banned in forbidden.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            roots = {name.split(".")[0] for name in _imports(path)}
            assert not roots & banned, f"{path.relative_to(ROOT)} imports {sorted(roots & banned)}"


BOTTOM = {"engine", "heads", "text", "packages", "media"}
LEAVES = {"errors", "config", "timing", "work", "metrics", "__init__"}
ENTRY_POINTS = {"cli", "__main__", "examples"}  # may import anything

#: What each layer may import besides itself and the leaves.
ALLOWED: dict[str, set[str]] = {
    "service": {"runtime", "loading", "requests", "families", "engine"},
    # replacing served versions: loads through loading, switches through runtime, reads packages;
    # the agreement report reads outputs as the heads do and replays recent requests through service
    "updates": {"runtime", "loading", "packages", "service", "heads", "models_file"},
    "runtime": {"loading", "families", "engine"},
    "loading": {"families", "engine", "packages", "artifacts"},
    # reading a models file: our entries and the Router's artifacts, located on disk
    "models_file": {"artifacts"},
    # where an artifact's package is, and converting a source once (in a subprocess)
    "artifacts": {"packages"},
    "requests": {"questions", "media"},  # media: the contract's asset and data-URL limits
    "families": {"requests", "questions"} | BOTTOM,
    "questions": {"heads"},
    # HTTP only: it reaches the models through service and runtime, and the engine for its error types
    "api": {"service", "runtime", "loading", "requests", "engine", "updates"},
    # the bottom layers are generic and stand alone: none imports another (nor a family)
    **{layer: set() for layer in BOTTOM},
    **{leaf: set() for leaf in LEAVES},
}


def _layer(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _our_layers(path: Path) -> set[str]:
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
        wrong += [f"{path.relative_to(PACKAGE)} imports {target}" for target in _our_layers(path) - allowed]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from edge_runtime.api.statuses import status_of\nfrom edge_runtime import API_VERSION\n")
    assert _our_layers(module) == {"api", "__init__"}


def test_no_test_module_imports_another_and_none_imports_a_star() -> None:
    """What tests share lives in tests/support/ (pytest plugins and helpers), never in a test module."""
    wrong = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                last = node.module.split(".")[-1]
                if node.module.startswith("tests.") and last.startswith("test_"):
                    wrong.append(f"{path.relative_to(ROOT)} imports {node.module}")
                if any(alias.name == "*" for alias in node.names):
                    wrong.append(f"{path.relative_to(ROOT)} imports * from {node.module}")
    assert not wrong, "\n".join(wrong)
