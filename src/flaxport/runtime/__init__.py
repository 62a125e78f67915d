"""torch's numerics in JAX, one copy: the functions and NNX layers a translated model file carries,
and what flaxport.nn's Linen layers run.

Real, tested modules; the emitter copies the source of the pieces a model uses into the
generated file, which imports only jax, flax, numpy and the standard library. native.py
holds what the default `--conv native` puts in place of functions.py's convolution; loader.py
the weights reader of the file's `load()`.
"""
from __future__ import annotations

import ast
import functools
import inspect

from flax import nnx

from flaxport.runtime import arrays, functions, layers, loader, native

MODULES = (functions, arrays, layers, loader)  # a file's pieces come in this order
# What a generated file may import: the standard library's modules, and the others by the names
# the pieces use for them.
STANDARD = ("functools", "itertools", "json", "math", "os")
IMPORTS = {"jax": "import jax", "jnp": "import jax.numpy as jnp", "np": "import numpy as np",
           "nnx": "from flax import nnx", "lax": "from jax import lax"}


@functools.cache
def definitions(conv: str = "xla") -> dict:
    """name -> (order, source, names it refers to) for every top-level def in the runtime
    (with conv="native", runtime/native.py's definitions in place of those of the same name)."""
    out = {}
    order = 0
    for mod in MODULES + ((native,) if conv == "native" else ()):
        text = inspect.getsource(mod)
        tree = ast.parse(text)
        lines = text.splitlines()
        for node in tree.body:
            refs = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            refs |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                start = node.lineno - 1 - len(node.decorator_list)
                at = out[node.name][0] if node.name in out else order  # a replacement keeps its place
                out[node.name] = (at, "\n".join(lines[start:node.end_lineno]), refs)
                order += 1
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                    isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name) and \
                    node.value.func.value.id in out:  # `f.defvjp(fwd, bwd)`: part of f's definition
                name = node.value.func.value.id
                o, source, own = out[name]
                out[name] = (o, source + "\n\n\n" + "\n".join(lines[node.lineno - 1:node.end_lineno]), own | refs)
    return out


@functools.cache
def names() -> frozenset:
    """Every name a runtime piece defines (with native.py's): what a generated name must not be."""
    return frozenset(definitions("native"))


def takes_rngs(layer: str) -> bool:
    """Is the layer built with `rngs`? A runtime layer asks for it when it initialises parameters
    (`rngs` without a default; the others accept it for a uniform call); flax's `nnx.X` when its
    constructor takes it (it draws: nnx.Dropout)."""
    if layer.startswith("nnx."):
        return "rngs" in inspect.signature(getattr(nnx, layer.removeprefix("nnx.")).__init__).parameters
    rngs = inspect.signature(getattr(layers, layer).__init__).parameters.get("rngs")
    return rngs is not None and rngs.default is inspect.Parameter.empty
