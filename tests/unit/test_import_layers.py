"""The layers as drawn: every import between meshscale's modules (module level, inside functions, under
TYPE_CHECKING, and `importlib.import_module` of a named module) goes down the table below, and no two modules
import each other, however indirectly. An import hidden in a function still runs, so it counts the same."""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The packages each package may import besides itself, lowest layer first. simulate (with scenario.py) and
# execute sit side by side, as do bench and train: neither of a pair imports the other. predict prices runs from
# the models alone, so it imports neither an engine (execute) nor what runs one (bench, train).
ROOT = "root"  # errors, units, validation, safe_io, results, plots: the utilities everything uses
_BASE = (ROOT, "models", "topology", "collectives")
_RUNS = _BASE + ("simulate", "execute", "bench", "train", "predict")
ALLOWED: dict[str, tuple[str, ...]] = {
    ROOT: (),
    "models": (ROOT,),
    "topology": (ROOT, "models"),
    "collectives": (ROOT, "models", "topology"),
    "simulate": _BASE,
    "execute": _BASE,
    "bench": _BASE + ("simulate", "execute"),
    "train": _BASE + ("simulate", "execute"),
    "predict": _BASE + ("simulate",),
    "report": _RUNS,
    "app": _RUNS + ("report",),
    "cli": _RUNS + ("report", "app", "top"),
    "top": _RUNS + ("report", "app", "cli"),  # the `meshscale` package (its notebook API) and __main__
}
_PACKAGE_OF = {"errors": ROOT, "units": ROOT, "validation": ROOT, "safe_io": ROOT, "results": ROOT,
               "plots": ROOT, "options": ROOT, "scenario": "simulate", "__main__": "top"}

# Edges that break the table or close a cycle today, in files other sessions are changing; each goes when its
# owner's change lands (the test fails while an entry names an edge that no longer exists, so this only shrinks).
KNOWN_UNTIL_FIXED: set[tuple[str, str]] = set()


@cache
def modules() -> dict[str, Path]:
    """Every module under src/meshscale by dotted name (a package by its own name, for its __init__)."""
    found = {}
    for path in sorted(SRC.joinpath("meshscale").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(tree: ast.Module, package: str) -> list[str]:
    """The dotted names every import in ``tree`` asks for: ``from M import a`` asks for M (its __init__ runs)
    and M.a; relative imports resolve against ``package``."""
    names = []
    # a module that calls import_module may name its targets anywhere (a table of homes): any string counts
    dynamic = any(isinstance(n, ast.Attribute) and n.attr == "import_module" or
                  isinstance(n, ast.Name) and n.id == "import_module" for n in ast.walk(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif dynamic and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)
    return names


@cache
def edges() -> frozenset[tuple[str, str]]:
    found = set()
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _imported_names(ast.parse(path.read_text(), str(path)), package):
            if target in modules() and target != name:
                found.add((name, target))
    return frozenset(found)


def package_of(module: str) -> str:
    parts = module.split(".")
    return "top" if len(parts) == 1 else _PACKAGE_OF.get(parts[1], parts[1])


def _cycles(graph: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    out: dict[str, list[str]] = {}
    for a, b in sorted(graph):
        out.setdefault(a, []).append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted({m for edge in graph for m in edge}):
        if root in index:
            continue
        work = [(root, iter(out.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(out.get(child, ()))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_package_of_the_tree_has_a_row():
    assert {package_of(m) for m in modules()} == set(ALLOWED)


def test_no_module_imports_a_package_above_or_beside_its_own():
    wrong = sorted((a, b) for a, b in edges() - KNOWN_UNTIL_FIXED
                   if package_of(a) != package_of(b) and package_of(b) not in ALLOWED[package_of(a)])
    assert not wrong, "\n".join(f"{a} -> {b} ({package_of(a)} may not import {package_of(b)})" for a, b in wrong)


def test_no_import_cycle():
    cycles = _cycles(set(edges()) - KNOWN_UNTIL_FIXED)
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_every_known_violation_still_exists():
    gone = sorted(KNOWN_UNTIL_FIXED - edges())
    assert not gone, f"fixed: delete these from KNOWN_UNTIL_FIXED: {gone}"


def test_the_graph_sees_imports_inside_functions_and_relative_ones():
    """The mechanism: a function-level import, one under TYPE_CHECKING and a relative one are edges like any
    other; ``from meshscale import plots`` asks for the meshscale package too."""
    tree = ast.parse("def f():\n    from meshscale.report import html\nif TYPE_CHECKING:\n    import meshscale.app\n"
                     "from .. import units\nfrom .sim import x\n")
    assert set(_imported_names(tree, "meshscale.simulate")) == {
        "meshscale.report", "meshscale.report.html", "meshscale.app", "meshscale", "meshscale.units",
        "meshscale.simulate.sim", "meshscale.simulate.sim.x"}


def test_a_module_named_for_import_module_is_an_edge():
    tree = ast.parse('import importlib\nHOME = {"meshscale.topology.catalog": ("load_system",)}\n'
                     "def get(name):\n    return importlib.import_module(HOME[name])\n")
    assert "meshscale.topology.catalog" in _imported_names(tree, "meshscale.topology")
    assert ("meshscale.topology", "meshscale.topology.catalog") in edges()  # the package's lazy names


def test_a_cycle_through_three_modules_is_found_and_a_chain_is_not():
    assert _cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    assert _cycles({("a", "b"), ("b", "c"), ("a", "c")}) == []
