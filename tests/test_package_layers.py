"""The package's parts, and the modules within them, import one another in one direction: no
circle of imports.

Read from the source (every `import` / `from ... import`, also those inside functions), at the
level of flaxport's packages and top modules (flaxport.cli, flaxport.port, flaxport.machine, ...)
and of single modules.
"""
from flaxport.bench.layers import circles, imports_between_modules, imports_between_parts, levels


def test_the_finder_sees_a_circle_of_three():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]


def test_a_part_sits_one_above_the_highest_it_imports():
    assert levels({"cli": {"port", "errors"}, "port": {"errors"}, "errors": set()}) == {
        "cli": 2, "port": 1, "errors": 0}


def test_the_picture_is_drawn_from_the_source(tmp_path):
    from flaxport.bench.layers import draw

    path = draw(tmp_path / "layers.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_circle_of_imports_between_the_packages_parts():
    found = circles(imports_between_parts())
    assert not found, f"an import circle: {[sorted(c) for c in found]}"


def test_no_circle_of_imports_between_modules():
    found = circles(imports_between_modules())
    assert not found, f"an import circle: {[sorted(c) for c in found]}"


def test_module_arrows_resolve_submodules_relative_imports_and_names(tmp_path):
    """`from pkg import sub` points at the submodule, `from pkg import name` at the package, and
    a relative import at its absolute module: a package whose __init__ imports a child that imports
    the package back is a circle."""
    for name, text in {"__init__.py": "",
                       "a/__init__.py": "from flaxport.a import b\n",
                       "a/b.py": "from . import TABLE\nfrom .c import f\n",
                       "a/c.py": "def f():\n    from flaxport.a.b import g\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = imports_between_modules(tmp_path)
    assert edges == {"flaxport": set(), "flaxport.a": {"flaxport.a.b"}, "flaxport.a.b": {"flaxport.a", "flaxport.a.c"},
                     "flaxport.a.c": {"flaxport.a.b"}}
    assert circles(edges) == [frozenset({"flaxport.a", "flaxport.a.b", "flaxport.a.c"})]


def test_port_builds_on_nothing_above_it():
    """port is the comparison and mapping machinery translate and the workloads build on: it
    imports neither (a workload declares its twin parts in its registry record)."""
    above = imports_between_parts()["flaxport.port"] & {"flaxport.translate", "flaxport.workloads", "flaxport.cli",
                                                         "flaxport.bench"}
    assert not above, f"flaxport.port imports {sorted(above)}"


def test_no_part_imports_another_parts_private_names():
    """`from flaxport.port.parity import _Thing` in translate is a reach past port's interface."""
    import ast

    from flaxport.bench.layers import ROOT, module_name, part

    reached = []
    for path in sorted(ROOT.rglob("*.py")):
        here = part(module_name(path))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("flaxport."):
                if part(node.module) != here:
                    reached += [f"{module_name(path)}: {node.module}.{a.name}" for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
    assert not reached, reached
