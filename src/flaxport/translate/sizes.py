"""Symbolic sizes as Python: torch.export's sympy expressions over the input sizes, written out as
the generated code computes them (`x.shape[0] // 2`, `math.ceil(...)`)."""
from __future__ import annotations

import itertools

from flaxport.translate.ops.table import ADD, ATOM, MUL, POWER, UNARY, Expr, Unsupported


def print_size(expr, resolve, held=lambda e: None) -> Expr:
    """A sympy size expression as Python (floor division, products, sums of shape entries);
    resolve(symbol) -> text, held(expression) -> `v.shape[d]` of an array holding it, or None."""
    import sympy

    def go(e):
        if isinstance(e, sympy.Symbol):
            return Expr(resolve(e))
        shape = None if e.is_number else held(e)
        if shape is not None:
            return Expr(shape)
        if isinstance(e, sympy.Integer) or e.is_Integer:
            v = int(e)
            return Expr(str(v), ATOM if v >= 0 else UNARY)
        if e.is_Float or e.is_Rational:  # a scale factor in a size (interpolate's scale_factor=1.7)
            v = float(e)
            return Expr(repr(v), ATOM if v >= 0 else UNARY)
        if isinstance(e, sympy.Add):
            terms = sorted(e.args, key=lambda t: (t.is_number, str(t)))
            text = go(terms[0]).at(ADD)
            for t in terms[1:]:
                if t.is_number and t < 0:
                    text += f" - {go(-t).at(ADD + 1)}"
                else:
                    text += f" + {go(t).at(ADD + 1)}"
            return Expr(text, ADD)
        if isinstance(e, sympy.Mul):
            factors = sorted(e.args, key=lambda t: (not t.is_number, str(t)))
            if factors[0] == -1:
                rest = sympy.Mul(*factors[1:])
                return Expr(f"-{go(rest).at(UNARY)}", UNARY)
            return Expr(" * ".join(go(f).at(MUL + 1) for f in factors), MUL)
        name = type(e).__name__
        if name in ("FloorDiv",):
            a, b = e.args
            return Expr(f"{go(a).at(MUL)} // {go(b).at(MUL + 1)}", MUL)
        if name in ("CeilDiv",):
            a, b = e.args
            return Expr(f"-(-{go(a).at(UNARY)} // {go(b).at(MUL + 1)})", UNARY)
        if name in ("Mod", "PythonMod"):
            a, b = e.args
            return Expr(f"{go(a).at(MUL)} % {go(b).at(MUL + 1)}", MUL)
        if name in ("Max", "Min"):
            return Expr(f"{name.lower()}({', '.join(go(a).text for a in e.args)})")
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return Expr(f"{go(e.base).at(POWER + 1)} ** {int(e.exp)}", POWER)
        if name in ("FloatTrueDiv", "IntTrueDiv"):  # true division of sizes (float results)
            a, b = e.args
            return Expr(f"{go(a).at(MUL)} / {go(b).at(MUL + 1)}", MUL)
        if name == "ToFloat":
            return Expr(f"float({go(e.args[0]).text})")
        rounding = {"TruncToInt": "int", "FloorToInt": "math.floor", "floor": "math.floor", "CeilToInt": "math.ceil",
                    "ceiling": "math.ceil", "RoundToInt": "round"}
        if name in rounding:
            return Expr(f"{rounding[name]}({go(e.args[0]).text})")
        raise Unsupported(f"a size expression {e}")

    return go(expr)


class SizesAsked:
    """The sizes each module call asks its caller for: a size its code needs that none of the
    arrays it is given holds (timm's MaxPool2dSame pads by amounts computed from the image size),
    asked whole (`H`, not the image size it comes from) so the caller passes what its own arrays
    hold. Found as the bodies are rendered, children first, so a caller's body knows what to pass."""

    def __init__(self):
        self._by_frame: dict = {}  # id(frame) -> [size text], in parameter order
        self._exprs: dict = {}  # size text -> sympy expression

    def ask(self, frame, expr, taken) -> str:
        """The parameter frame's call takes size `expr` (a sympy expression) in, added if new;
        taken: the names its forward's own parameters have."""
        asked = self._by_frame.setdefault(id(frame), [])
        text = str(expr)
        self._exprs.setdefault(text, expr)
        if text not in asked:
            asked.append(text)
        return parameter_name(asked.index(text), taken)

    def of(self, frame) -> list:
        """The texts of the sizes frame's call asks for, in parameter order."""
        return list(self._by_frame.get(id(frame), []))

    def parameters(self, frame, taken) -> list:
        """The parameter names of those sizes."""
        return [parameter_name(i, taken) for i in range(len(self.of(frame)))]

    def expr(self, text: str):
        """The sympy expression of an asked size, by its text."""
        import sympy

        return self._exprs.get(text) or sympy.Symbol(text)


def parameter_name(i: int, taken=()) -> str:
    """The parameter carrying a call's i-th asked size (fixed as soon as it is written: size,
    size1, ..., skipping the names the forward's own parameters have: timm Twins' `size`)."""
    names = (f"size{k}" if k else "size" for k in itertools.count())
    return next(itertools.islice((n for n in names if n not in taken), i, None))
