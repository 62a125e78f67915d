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

import dataclasses

OPS: dict = {}

# Operator precedence of an expression's outermost operator (Python's table), for parentheses.
ATOM, POWER, UNARY, MUL, ADD, SHIFT, BAND, BXOR, BOR, COMPARE, NOT, AND, OR, TERNARY, LAMBDA = \
    100, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3


@dataclasses.dataclass(frozen=True)
class Expr:
    text: str
    prec: int = ATOM

    def __str__(self):
        return self.text

    def at(self, prec: int) -> str:
        """The text, parenthesised unless it binds at least as tightly as `prec`."""
        return self.text if self.prec >= prec else f"({self.text})"


class Outputs(tuple):
    """A multi-output op computed as separate expressions, one per output (None, or an Unsupported
    saying why: not computable, e.g. max-pool indices): `getitem(node, i)` becomes the i-th
    expression itself, and reading one that is not computable is refused."""


class Unsupported(Exception):
    """A handler cannot translate this particular call (e.g. an argument it does not support)."""


def op(*names):
    def register(fn):
        for name in names:
            OPS[name] = fn
        return fn

    return register


def lookup(node):
    """The handler for an fx call_function node, or None."""
    _load()
    name = str(node.target)
    if name in OPS:
        return OPS[name]
    packet = name.rsplit(".", 1)[0] if name.startswith("aten.") else name
    return OPS.get(packet)


_LOADED = []


def _load():
    if not _LOADED:
        from flaxport.translate.ops import (activation, attention, binning, conv, create, elementwise, linalg,  # noqa
                                            losses, matrix, norm, random, recurrent, reduce, scatter, shape, special,
                                            spectral, strided)
        _LOADED.append(True)


def binary(c, a: Expr, symbol: str, b: Expr, prec: int) -> Expr:
    """a <symbol> b with Python's precedence (left-associative)."""
    return Expr(f"{a.at(prec)} {symbol} {b.at(prec + 1)}", prec)


def call(name: str, *args, **kwargs) -> Expr:
    """name(arg, ..., key=value) from Exprs / strings; None keyword values are left out."""
    parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items() if v is not None]
    return Expr(f"{name}({', '.join(parts)})")


def method(obj: Expr, name: str, *args, **kwargs) -> Expr:
    return Expr(f"{obj.at(ATOM)}.{call(name, *args, **kwargs).text}")
