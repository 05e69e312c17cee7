"""The server runs without torch, transformers or optimum, and the layers keep their import rules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.server_harness import ROOT

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
                 "families": {"sanic"}, "engine": {"sanic"}, "packages": {"onnxruntime", "sanic"},
                 "text": {"onnxruntime", "sanic"}}
    for layer, banned in forbidden.items():
        for path in (PACKAGE / layer).rglob("*.py"):
            roots = {name.split(".")[0] for name in _imports(path)}
            assert not roots & banned, f"{path.relative_to(ROOT)} imports {sorted(roots & banned)}"
