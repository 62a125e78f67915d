"""Names in a generated file: what a name must never be, and a torch name made an identifier."""
from __future__ import annotations

import re

from flaxport import runtime

RESERVED = {"self", "jnp", "jax", "nnx", "lax", "np", "math", "None", "True", "False", "lambda", "return", "def",
            "class", "in", "is", "not", "and", "or", "if", "else", "for", "while", "import", "from", "as", "with",
            "global", "pass", "yield", "del", "try", "except", "finally", "raise", "assert", "break", "continue",
            "input", "type", "len", "max", "min", "sum", "abs", "int", "float", "bool", "list", "tuple", "dict",
            "range", "print", "id", "hash", "iter", "next", "map", "filter", "zip", "round", "pow", "all", "any"}
RESERVED |= {n for n in dir(__import__("builtins")) if not n.startswith("_")}
# What the file defines and imports besides the model's classes: the runtime pieces, the modules,
# the loader (`load`).
RESERVED |= runtime.names() | set(runtime.STANDARD) | set(runtime.IMPORTS) | {"load", "flaxport_conv"}


def free_name(base: str, taken) -> str:
    """base, else base2, base3, ...: the first not in `taken`."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    return name


class AddedAttributes:
    """Names of what a translated class holds that its torch module does not: the nnx.Dropout of
    a functional dropout, a module's `noise` stream. One name per (op, kind) of a module, the same
    in each of its calls and in both modes, never one of the module's own attributes.
    own(path) -> the names the torch module at path already uses."""

    def __init__(self, own):
        self._own = own
        self._by_path: dict = {}

    def name(self, frame, node, base: str) -> str:
        """The attribute for `base` made by `node` (None: one for the module) in frame's module."""
        per_path = self._by_path.setdefault(frame.path, {})
        key = (node.name if node is not None else None, base)
        if key not in per_path:
            per_path[key] = free_name(base, set(per_path.values()) | self._own(frame.path))
        return per_path[key]


def safe_name(name: str) -> str:
    """A torch name (`layers.0`, `0`) as a Python identifier (`layers_0`, `h0`)."""
    name = re.sub(r"\W", "_", name).strip("_") or "h"
    return name if not name[0].isdigit() else "h" + name

# What an NNX module already holds: an attribute of a generated class must not shadow it.
NNX_RESERVED = {"train", "eval", "set_attributes", "sow", "perturb", "iter_modules", "iter_children", "training",
                "deterministic", "use_running_average", "rngs"}
