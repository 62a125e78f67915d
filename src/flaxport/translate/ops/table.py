"""The op table's registry (`@op`, `OPS`) and the expression type its handlers return, with the
helpers that write Python expressions at the right precedence. Handler modules import from here;
the package imports every handler module, so the table is complete once `ops` is imported."""
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


def binary(c, a: Expr, symbol: str, b: Expr, prec: int) -> Expr:
    """a <symbol> b with Python's precedence (left-associative)."""
    return Expr(f"{a.at(prec)} {symbol} {b.at(prec + 1)}", prec)


def call(name: str, *args, **kwargs) -> Expr:
    """name(arg, ..., key=value) from Exprs / strings; None keyword values are left out."""
    parts = [str(a) for a in args] + [f"{k}={v}" for k, v in kwargs.items() if v is not None]
    return Expr(f"{name}({', '.join(parts)})")


def method(obj: Expr, name: str, *args, **kwargs) -> Expr:
    return Expr(f"{obj.at(ATOM)}.{call(name, *args, **kwargs).text}")


def schema_arguments(node) -> dict:
    """Schema argument name -> value (positional and keyword), defaults filled."""
    target = node.target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return {f"arg{i}": a for i, a in enumerate(node.args)}
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out
