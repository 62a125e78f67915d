"""The package's parts import one another in one direction: no circle of imports between them.

Read from the source (every `import` / `from ... import`, also those inside functions), at the
level of flaxport's packages and top modules (flaxport.cli, flaxport.port, flaxport.machine, ...).
"""
import ast
from pathlib import Path

import flaxport

ROOT = Path(flaxport.__file__).parent

# A circle still there, with what undoes it: port's check_step falls back on translate to carry a
# torch loss across, and translate builds on port's comparison machinery (the split into a lower
# package both build on is what undoes it).
KNOWN = {frozenset({"flaxport.port", "flaxport.translate"})}


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports_between_parts() -> dict:
    """{part: {the parts it imports}} over every module of the package."""
    edges: dict = {}
    for path in ROOT.rglob("*.py"):
        module = ".".join(("flaxport", *path.relative_to(ROOT).with_suffix("").parts))
        here = _part(module)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] if node.module != "flaxport" else [f"flaxport.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("flaxport.") and _part(name) != here:
                    edges.setdefault(here, set()).add(_part(name))
    return edges


def circles(edges: dict) -> list:
    """The strongly connected groups of more than one part (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_finder_sees_a_circle_of_three():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def test_no_circle_of_imports_between_the_packages_parts():
    found = set(circles(imports_between_parts()))
    assert found <= KNOWN, f"a new import circle: {[sorted(c) for c in found - KNOWN]}"
    assert found == KNOWN, f"undone, remove it from KNOWN: {[sorted(c) for c in KNOWN - found]}"
