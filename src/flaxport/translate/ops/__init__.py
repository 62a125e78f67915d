"""The op table: ATen op -> a JAX expression, one small module per op family.

A handler gets the emitting context `c` and the fx node and returns an `Expr` (the code
of the result). `c` renders arguments (`c.x('self')` a tensor, `c.lit(v, 'hint')` a
number, `c.size(...)` a shape with symbolic sizes read from `x.shape`), marks the
runtime helpers it calls (`c.helper('max_pool')`) and knows each argument's example
value (`c.val('self')`: shape, dtype). Handlers see arguments by their schema names
(`self`, `other`, `dim`, ...), defaults filled in.

Register with `@op('aten.relu.default', 'aten.relu')`: an exact overload, or every
overload of the op (`aten.relu`). `lookup(node)` finds the handler.
"""
from __future__ import annotations

from flaxport.translate.ops.table import (ADD, AND, ATOM, BAND, BOR, BXOR, COMPARE, LAMBDA, MUL, NOT, OPS, OR,  # noqa: F401
                                          POWER, SHIFT, TERNARY, UNARY, Expr, Outputs, Unsupported, binary, call,
                                          method, op)
# Importing a family registers its handlers.
from flaxport.translate.ops import (activation, attention, binning, conv, create, elementwise, linalg,  # noqa: F401,E402
                                    losses, matrix, norm, random, recurrent, reduce, scatter, shape, special, spectral,
                                    strided)


def lookup(node):
    """The handler for an fx call_function node, or None."""
    name = str(node.target)
    if name in OPS:
        return OPS[name]
    packet = name.rsplit(".", 1)[0] if name.startswith("aten.") else name
    return OPS.get(packet)
