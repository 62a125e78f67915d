"""A LambdaLR's lr_lambda (a lambda, a def, a functools.partial of one: HuggingFace's
get_linear/cosine_schedule_with_warmup) translated from its Python source into a JAX function
of the step count, read with `ast`.

What translates is arithmetic on the step and on numbers bound to the function (partial's
keywords, closure cells, module globals): + - * / // % **, comparisons, and/or/not,
`a if c else b`, min, max, abs, float, int, math's functions and constants, local names, and
`if ...: return ...` chains, which become jnp.where. Anything else is one line saying what.
A text's lambda (--scheduler "LambdaLR(lr_lambda=lambda step: ...)") is never run: torch's
side of the proof evaluates the same syntax tree here, node by node.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import operator
import textwrap

from flaxport.port.schedules import UnsupportedSchedulerError

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_MATH = {"cos", "sin", "tan", "exp", "log", "log2", "log10", "sqrt", "floor", "ceil", "tanh", "pi", "e", "inf"}
_PY_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_PY_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
               ast.Eq: operator.eq, ast.NotEq: operator.ne}


@dataclasses.dataclass
class Translated:
    fn: object  # the Python function it came from (None for a text's lambda)
    name: str
    source: str  # `def name(step): ...` in JAX
    jax: object  # that function

    def __repr__(self):
        return self.name


def _refuse(what: str):
    raise UnsupportedSchedulerError(f"LambdaLR's lr_lambda is not translated: {what} (arithmetic on the step count, "
                                    "min/max/abs, math functions and if/return translate)")


# --------------------------------------------------------------------------- reading the function
def _function_node(fn):
    """(ast node of fn's lambda or def, its parameter names)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        _refuse(f"the source of {getattr(fn, '__name__', fn)!r} cannot be read")
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a lambda in the middle of a longer statement
        tree = ast.parse(source.strip().rstrip(",").split("=", 1)[-1].strip())
    params = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
    if fn.__name__ == "<lambda>":
        found = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and [a.arg for a in n.args.args] == params]
    else:
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == fn.__name__]
    if len(found) != 1:
        _refuse(f"its source is ambiguous ({len(found)} candidates on its lines)")
    return found[0], params


def _bound_numbers(fn, names) -> dict:
    """The numbers `fn` reads by name from its closure and module (not its own locals)."""
    out = {}
    free = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in (fn.__closure__ or ()))))
    for name in names:
        for scope in (free, fn.__globals__):
            if name in scope and isinstance(scope[name], (int, float)) and not isinstance(scope[name], bool):
                out[name] = scope[name]
                break
    return out


# --------------------------------------------------------------------------- the translation
class _Writer:
    def __init__(self, step: str, constants: dict):
        self.step, self.constants, self.locals = step, constants, set()

    def expr(self, node) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return repr(node.value)
        if isinstance(node, ast.Name):
            if node.id in (self.step, *self.constants, *self.locals):
                return node.id
            _refuse(f"it reads {node.id!r}, which is not a number bound to it")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math" \
                and node.attr in _MATH:
            return f"math.{node.attr}" if node.attr in ("pi", "e", "inf") else f"jnp.{node.attr}"
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return f"({self.expr(node.left)} {_BINARY[type(node.op)]} {self.expr(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return f"({'-' if isinstance(node.op, ast.USub) else '+'}{self.expr(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return f"jnp.logical_not({self.expr(node.operand)})"
        if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
            parts, left = [], node.left
            for op, right in zip(node.ops, node.comparators):
                parts.append(f"({self.expr(left)} {_COMPARE[type(op)]} {self.expr(right)})")
                left = right
            return parts[0] if len(parts) == 1 else "jnp.logical_and(" + ", ".join(parts) + ")"
        if isinstance(node, ast.BoolOp):
            fn = "jnp.logical_and" if isinstance(node.op, ast.And) else "jnp.logical_or"
            return functools.reduce(lambda a, b: f"{fn}({a}, {b})", [self.expr(v) for v in node.values])
        if isinstance(node, ast.IfExp):
            return f"jnp.where({self.expr(node.test)}, {self.expr(node.body)}, {self.expr(node.orelse)})"
        if isinstance(node, ast.Call) and not node.keywords:
            return self.call(node)
        _refuse(f"`{ast.unparse(node)}` is not arithmetic on the step")

    def call(self, node) -> str:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        is_math = isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and \
            node.func.value.id == "math" and node.func.attr in _MATH - {"pi", "e", "inf"}
        if name not in ("min", "max", "float", "int", "abs") and not is_math:
            _refuse(f"it calls `{ast.unparse(node.func)}`")
        args = [self.expr(a) for a in node.args]
        if name in ("min", "max") and len(args) >= 2:
            fn = "jnp.minimum" if name == "min" else "jnp.maximum"
            return functools.reduce(lambda a, b: f"{fn}({a}, {b})", args)
        if name == "float" and len(args) == 1:
            return args[0]
        if name == "int" and len(args) == 1:
            return f"jnp.trunc({args[0]})"
        if name == "abs" and len(args) == 1:
            return f"jnp.abs({args[0]})"
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and \
                node.func.value.id == "math" and node.func.attr in _MATH - {"pi", "e", "inf"}:
            return f"jnp.{node.func.attr}({', '.join(args)})"
        _refuse(f"it calls `{ast.unparse(node.func)}`")

    def block(self, statements, lines) -> str:
        """Statements ending in a return -> the returned expression (assignments become lines)."""
        pending = []  # (condition, value) of earlier `if ...: return ...`
        for i, st in enumerate(statements):
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                lines.append(f"{st.targets[0].id} = {self.expr(st.value)}")
                self.locals.add(st.targets[0].id)
            elif isinstance(st, ast.Return) and st.value is not None:
                value = self.expr(st.value)
                for cond, early in reversed(pending):
                    value = f"jnp.where({cond}, {early}, {value})"
                return value
            elif isinstance(st, ast.If):
                taken = self.block(st.body, lines)
                if st.orelse:
                    rest = self.block(list(st.orelse) + list(statements[i + 1:]), lines)
                    value = f"jnp.where({self.expr(st.test)}, {taken}, {rest})"
                    for cond, early in reversed(pending):
                        value = f"jnp.where({cond}, {early}, {value})"
                    return value
                pending.append((self.expr(st.test), taken))
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                continue  # a docstring
            else:
                _refuse(f"`{ast.unparse(st).splitlines()[0]}` is not an assignment, if or return")
        _refuse("a path through it returns nothing")


def _write(name: str, node, step: str, constants: dict, doc: str) -> str:
    writer = _Writer(step, constants)
    lines = [f"{k} = {v!r}" for k, v in constants.items()]
    body = node.body if isinstance(node, ast.FunctionDef) else [ast.Return(node.body)]
    value = writer.block(body, lines)
    code = [f"def {name}({step}):", f'    """{doc}"""'] + [f"    {line}" for line in lines]
    return "\n".join(code + [f"    return {value}"]) + "\n"


def translate_lambda(fn, name: str = "lr_lambda") -> Translated:
    """A Python lr_lambda (lambda, def or functools.partial of a def) -> Translated."""
    bound = {}
    target = fn
    if isinstance(fn, functools.partial):
        if fn.args:
            _refuse("a functools.partial with positional arguments")
        bound, target = dict(fn.keywords), fn.func
    if not inspect.isfunction(target):
        _refuse(f"{type(target).__name__} is not a Python function")
    node, params = _function_node(target)
    if not params:
        _refuse("it takes no step argument")
    step = params[0]
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - {step, "math"}
    defaults = dict(target.__kwdefaults__ or {})
    defaults.update(zip(params[len(params) - len(target.__defaults__ or ()):], target.__defaults__ or ()))
    constants = {**_bound_numbers(target, used), **{k: v for k, v in {**defaults, **bound}.items() if k in used}}
    if bad := sorted(k for k, v in constants.items() if isinstance(v, bool) or not isinstance(v, (int, float))):
        _refuse(f"{bad[0]} is not a number")
    where = f"{target.__module__}.{target.__qualname__}"
    doc = f"{where}{'(' + ', '.join(f'{k}={v!r}' for k, v in bound.items()) + ')' if bound else ''}, in JAX."
    source = _write(name, node, step, constants, doc)
    return Translated(fn, name, source, _compile(source, name))


class TextLambda:
    """A --scheduler text's `lambda step: ...` as torch's LambdaLR calls it: its syntax tree
    evaluated node by node (never run)."""

    def __init__(self, node: ast.Lambda):
        self.node = node
        self.step = node.args.args[0].arg

    def __call__(self, step):
        return evaluate(self.node.body, self.step, step)

    def translate(self, name: str) -> Translated:
        source = _write(name, self.node, self.step, {}, f"lambda {self.step}: {ast.unparse(self.node.body)}, in JAX.")
        return Translated(self, name, source, _compile(source, name))


def translate_text_lambda(node: ast.Lambda, name: str = "lr_lambda") -> Translated:
    """A --scheduler text's `lambda step: ...` -> Translated (fn: a TextLambda, for torch's LambdaLR
    in the proof)."""
    if len(node.args.args) != 1 or node.args.vararg or node.args.kwonlyargs:
        _refuse("a text's lambda takes the step count alone")
    return TextLambda(node).translate(name)


def _compile(source: str, name: str):
    import jax.numpy as jnp

    namespace = {"jnp": jnp, "math": math}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - written above from checked syntax
    return namespace[name]


def evaluate(node, step_name: str, step):
    """The value of expression `node` (checked syntax: what _Writer translates) at `step`, in Python."""
    def ev(n):
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, ast.Name):
            if n.id == step_name:
                return step
            _refuse(f"it reads {n.id!r}")
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "math" and n.attr in _MATH:
            return getattr(math, n.attr)
        if isinstance(n, ast.BinOp) and type(n.op) in _PY_BINARY:
            return _PY_BINARY[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp):
            value = ev(n.operand)
            return -value if isinstance(n.op, ast.USub) else (not value if isinstance(n.op, ast.Not) else value)
        if isinstance(n, ast.Compare):
            left, ok = ev(n.left), True
            for op, right in zip(n.ops, n.comparators):
                right = ev(right)
                ok, left = ok and _PY_COMPARE[type(op)](left, right), right
            return ok
        if isinstance(n, ast.BoolOp):
            values = [ev(v) for v in n.values]
            return all(values) if isinstance(n.op, ast.And) else any(values)
        if isinstance(n, ast.IfExp):
            return ev(n.body) if ev(n.test) else ev(n.orelse)
        if isinstance(n, ast.Call):
            args = [ev(a) for a in n.args]
            if isinstance(n.func, ast.Name) and n.func.id in ("min", "max", "float", "int", "abs"):
                return {"min": min, "max": max, "float": float, "int": int, "abs": abs}[n.func.id](*args)
            if isinstance(n.func, ast.Attribute) and n.func.value.id == "math":
                return getattr(math, n.func.attr)(*args)
        _refuse(f"`{ast.unparse(n)}`")

    return ev(node)
