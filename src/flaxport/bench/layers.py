"""The package's parts and the imports between them, read from the source, and their picture.

A part is a package or top module of flaxport (flaxport.port, flaxport.machine, ...). Every
`import` / `from ... import` counts, also those inside functions (the lazy imports that keep
`import flaxport` light are arrows all the same). The parts, and the modules within them,
import one another in one direction: tests/test_package_layers.py fails on a circle.

    python -m flaxport.bench.layers docs/images/layers.png
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import flaxport

ROOT = Path(flaxport.__file__).parent


def part(module: str) -> str:
    """The part a module belongs to: 'flaxport.port.step' -> 'flaxport.port'."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path, root: Path = ROOT) -> str:
    """'.../flaxport/port/step.py' -> 'flaxport.port.step' (a package's __init__.py: the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(("flaxport", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imports_between_modules(root: Path = ROOT) -> dict:
    """{module: {the flaxport modules it imports}} over every module of the package.

    `from flaxport.data import cifar10` is an arrow to the module flaxport.data.cifar10, `from
    flaxport.data import Dataset` one to the package flaxport.data (its __init__); relative
    imports count as their absolute names."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    edges: dict = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges[module] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in paths:  # flaxport.x.y.f -> flaxport.x.y
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges[module].add(name)
    return edges


def imports_between_parts(root: Path = ROOT) -> dict:
    """{part: {the parts it imports}}: the arrows between modules, between their parts. The
    package itself (its version) and `python -m flaxport` (the CLI's) are no part."""
    edges: dict = {}
    for module, targets in imports_between_modules(root).items():
        if module in ("flaxport", "flaxport.__main__"):
            continue
        here = part(module)
        edges.setdefault(here, set()).update(part(t) for t in targets if t != "flaxport" and part(t) != here)
    return edges


def circles(edges: dict) -> list:
    """The strongly connected groups of more than one part (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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


def levels(edges: dict) -> dict:
    """{part: its height}: 0 for a part that imports no other, else one more than the highest
    part it imports (a circle has no heights: check `circles` first)."""
    height: dict = {}

    def go(v):
        if v not in height:
            height[v] = 1 + max((go(w) for w in edges.get(v, ())), default=-1)
        return height[v]

    for v in edges:
        go(v)
    return height


def draw(path, edges: dict | None = None) -> Path:
    """The parts as boxes, each row one height (those that import nothing at the bottom), an arrow
    from each part to every part it imports. -> the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = imports_between_parts() if edges is None else edges
    if found := circles(edges):
        raise ValueError(f"import circles have no layers: {[sorted(c) for c in found]}")
    height = levels(edges)
    rows: dict = {}
    for v in sorted(edges, key=lambda v: (height[v], v)):
        rows.setdefault(height[v], []).append(v)
    width = max(len(r) for r in rows.values())
    where = {}
    for h, row in rows.items():
        for i, v in enumerate(row):
            where[v] = ((i + 0.5) * width / len(row), h * 1.6)
    fig, ax = plt.subplots(figsize=(2.3 * width + 1, 1.25 * len(rows) + 1))
    for v, targets in edges.items():
        for w in targets:
            (x0, y0), (x1, y1) = where[v], where[w]
            ax.annotate("", xy=(x1, y1 + 0.3), xytext=(x0, y0 - 0.3),
                        arrowprops=dict(arrowstyle="-|>", color="#7f8c8d", lw=0.8, shrinkA=2, shrinkB=2,
                                        connectionstyle="arc3,rad=0.06"))
    for v, (x, y) in where.items():
        ax.text(x, y, v.removeprefix("flaxport."), ha="center", va="center", fontsize=10,
                bbox=dict(boxstyle="round,pad=0.4", fc="#eaf2f8", ec="#1f5fa8"))
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(-0.8, (len(rows) - 1) * 1.6 + 0.8)
    ax.axis("off")
    ax.set_title("flaxport's parts: each arrow points to a part it imports (read from the source)", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    print(draw(sys.argv[1] if len(sys.argv) > 1 else "layers.png"))
