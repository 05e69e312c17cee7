"""No import circle anywhere in edge_runtime/, converters/ and bench/, counting the imports made inside
functions (which close a circle at run time as surely as module-level ones, only later); and bench's
harness imports none of the comparisons that run on it."""

from __future__ import annotations

from tests.support.imports import cycles, import_graph, imports_of, module_files
from tests.support.server_harness import ROOT

PACKAGES = ("edge_runtime", "converters", "bench")


def test_no_import_circle_in_our_packages() -> None:
    modules = module_files(ROOT, PACKAGES)
    assert "bench.harness.load" in modules and "converters.decision3.vision" in modules  # the walk saw them
    assert cycles(import_graph(modules)) == []


def test_a_circle_closed_inside_a_function_is_found() -> None:
    """The shape both circles this test was written against had: one side imports at module level, the
    other inside a function."""
    known = {"pkg.a", "pkg.b", "pkg.c"}
    graph = {"pkg.a": imports_of("pkg.a", "from pkg import b\n", known),
             "pkg.b": imports_of("pkg.b", "def f():\n    from .a import x\n    return x\n", known),
             "pkg.c": imports_of("pkg.c", "import pkg.a\n", known)}
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_bench_harness_imports_no_comparison() -> None:
    graph = import_graph(module_files(ROOT, ["bench"]))
    leaks = {m: sorted(t for t in targets if not t.startswith("bench.harness"))
             for m, targets in graph.items() if m.startswith("bench.harness.")}
    assert {m: t for m, t in leaks.items() if t} == {}
