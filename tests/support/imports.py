"""The import graph of our packages as their source says it: every ``import`` and ``from ... import``, at
module level and inside functions alike (an import moved into a function still ties two modules), with
relative imports resolved and each edge to the module imported (``from a.b import c`` names a.b.c when c
is a module, else a.b)."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from pathlib import Path


def module_files(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root`` (a package is its
    __init__.py)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, source: str, known: Collection[str], is_package: bool = False) -> set[str]:
    """The modules among ``known`` that ``source`` (the text of ``module``) imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {name for name in found if name in known and name != module}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules among ``modules`` it imports."""
    return {name: imports_of(name, path.read_text(encoding="utf-8"), modules, path.name == "__init__.py")
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each an import circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm (recursion depth: the longest import chain)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)
