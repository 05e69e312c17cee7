"""The server runs without torch, transformers or optimum, and the layers keep their import rules:
api -> service/runtime/loading -> requests -> families -> questions, vision_lm -> engine, heads, text,
packages, media; the bottom layers import none of one another, the leaves (errors, config, timing, work, heap,
metrics) import none of our modules, and no family imports another family (what two share lives
outside the family folders)."""

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
LEAVES = {"errors", "config", "timing", "work", "metrics", "heap", "__init__"}
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
    "families": {"requests", "questions", "vision_lm"} | BOTTOM,
    "questions": {"heads"},
    # what the families reading images through a Qwen-VL tower share: its processor, grid and files
    "vision_lm": {"media", "packages"},
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


FAMILIES = PACKAGE / "families"
#: The one module that names every family: the card family -> class table.
REGISTRY = FAMILIES / "registry.py"


def _module_name(path: Path) -> str:
    """The dotted name of a module file (a package's ``__init__`` keeps its name, as its relative imports
    resolve against the package itself)."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imported(source: str, module: str) -> set[str]:
    """Every module a source imports, at any depth (inside functions too), relative imports resolved
    against ``module`` (its dotted name); ``from a import b`` counts ``a`` and ``a.b``."""
    package = module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _families() -> set[str]:
    """The family folders: every package directly under edge_runtime/families."""
    return {p.parent.name for p in FAMILIES.glob("*/__init__.py")}


def _families_imported(source: str, module: str, families: set[str]) -> set[str]:
    """The family folders a module imports, its own excepted."""
    own = module.split(".")[2] if module.startswith("edge_runtime.families.") else None
    named = {m.split(".")[2] for m in _imported(source, module)
             if m.startswith("edge_runtime.families.") and len(m.split(".")) > 2}
    return (named & families) - {own}


def test_no_family_imports_another() -> None:
    """A family is changed or removed without reading its neighbours: what two families share lives
    beside them (families/*.py, edge_runtime/vision_lm, the engine), and only the registry names them."""
    families = _families()
    wrong = []
    for path in sorted(FAMILIES.rglob("*.py")):
        if path == REGISTRY:
            continue
        siblings = _families_imported(path.read_text(encoding="utf-8"), _module_name(path), families)
        wrong += [f"{path.relative_to(ROOT)} imports the {name} family" for name in sorted(siblings)]
    assert not wrong, "\n".join(wrong)


def test_the_family_check_sees_sibling_imports_at_any_depth() -> None:
    families = {"decision3", "decision_vision", "decision_codes", "vela2"}
    source = (
        "from edge_runtime.families.decision3.prompt import D3Prompt\n"  # its own: allowed
        "from edge_runtime.families import decision_plan\n"  # shared, not a family
        "def graphs():\n"
        "    from edge_runtime.families.decision_vision.family import vision_golden\n"
        "    import edge_runtime.families.decision_codes.family\n"
        "    return vision_golden\n"
        "class F:\n"
        "    def plan(self):\n"
        "        from ..vela2 import layout\n"
        "        from . import video\n"
    )
    assert _families_imported(source, "edge_runtime.families.decision3.family", families) == {
        "decision_vision", "decision_codes", "vela2"}
    assert _families_imported("from edge_runtime.families import vela2\n", "edge_runtime.families.items",
                              families) == {"vela2"}
    assert _imported("from .. import base\n", "edge_runtime.families.vela2.family") == {
        "edge_runtime.families", "edge_runtime.families.base"}


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
