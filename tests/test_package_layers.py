"""The package's parts import one another in one direction: no circle of imports between them.

Read from the source (every `import` / `from ... import`, also those inside functions), at the
level of flaxport's packages and top modules (flaxport.cli, flaxport.port, flaxport.machine, ...).
"""
import ast
from pathlib import Path

import flaxport

ROOT = Path(flaxport.__file__).parent

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
    found = circles(imports_between_parts())
    assert not found, f"an import circle: {[sorted(c) for c in found]}"


def test_port_builds_on_nothing_above_it():
    """port is the comparison and mapping machinery translate and the workloads build on: it
    imports neither (a workload declares its twin parts in its registry record)."""
    above = imports_between_parts()["flaxport.port"] & {"flaxport.translate", "flaxport.workloads", "flaxport.cli",
                                                         "flaxport.bench"}
    assert not above, f"flaxport.port imports {sorted(above)}"
