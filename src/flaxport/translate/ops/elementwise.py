"""Elementwise arithmetic, comparisons, logic and math functions (torch's promotion and division rules)."""
from __future__ import annotations

from flaxport.translate.ops.table import ADD, ATOM, COMPARE, MUL, POWER, UNARY, Expr, binary, call, op


def unary(c, fn: str, *args, **kwargs) -> Expr:
    """fn(self, *args, **kwargs) for an elementwise function fn; on a feature map in torch's layout
    `apply_channels_last(fn, x, ...)`: what fn's gradient keeps is then in the convolutions' layout."""
    x = c.x("self")
    if c.torch_layout_image(c.args["self"]):
        return call(c.helper("apply_channels_last"), fn, x, *args, **kwargs)
    return call(fn, x, *args, **kwargs)


def _alpha(c, other: Expr) -> Expr:
    alpha = c.raw("alpha") if c.has("alpha") else 1
    return other if alpha == 1 else binary(c, other, "*", c.lit(alpha, "alpha"), MUL)


@op("aten.add.Tensor", "aten.add.Scalar")
def add(c, node):
    if _is_zero(c.raw("other")) and not c.is_float("self"):
        return c.x("self")  # `+ 0` on integers (offsets such as past_key_values_length)
    return binary(c, c.x("self"), "+", _alpha(c, c.x("other")), ADD)


@op("aten.sub.Tensor", "aten.sub.Scalar")
def sub(c, node):
    if _is_zero(c.raw("other")) and not c.is_float("self"):
        return c.x("self")
    return binary(c, c.x("self"), "-", _alpha(c, c.x("other")), ADD)


def _is_zero(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v == 0


@op("aten.rsub.Tensor", "aten.rsub.Scalar")
def rsub(c, node):
    return binary(c, c.x("other"), "-", _alpha(c, c.x("self")), ADD)


@op("aten.mul.Tensor", "aten.mul.Scalar")
def mul(c, node):
    scaled = _channel_scaling(c)
    if scaled is not None:  # a squeeze-and-excitation gate, a layer scale: channels-last inside
        image, factor = scaled
        return call(c.helper("multiply_channels"), c.x(image), c.x(factor))
    return binary(c, c.x("self"), "*", c.x("other"), MUL)


def _channel_scaling(c):
    """(image, factor) argument names where a feature map in torch's layout (N, C, H, W) is
    multiplied by a per-channel factor (N or 1, C, 1, 1); else None."""
    if c.out.ndim != 4 or not all(hasattr(c.args.get(k), "meta") for k in ("self", "other")):
        return None
    for image, factor in (("self", "other"), ("other", "self")):
        x, f = c.val(image).shape, c.val(factor).shape
        if (len(f) == 4 and c.torch_layout_image(c.args[image]) and list(x) == list(c.out.shape)
                and [c.static(s) for s in f[2:]] == [1, 1] and c.static(f[1]) == c.static(x[1]) is not None
                and [c.static(s) for s in x[2:]] != [1, 1]):
            return image, factor
    return None


@op("aten.div.Tensor", "aten.div.Scalar", "aten.true_divide.Tensor", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div(c, node):
    mode = c.raw("rounding_mode") if c.has("rounding_mode") else None
    a, b = c.x("self"), c.x("other")
    if mode is None:
        return binary(c, a, "/", b, MUL)
    if mode == "floor":
        if c.is_float("self") or c.is_float("other"):
            return call("jnp.floor", binary(c, a, "/", b, MUL))
        return binary(c, a, "//", b, MUL)  # Python's and torch's integer floor division agree
    if c.is_float("self") or c.is_float("other"):
        return call("jnp.trunc", binary(c, a, "/", b, MUL))
    return call("lax.div", a, b)  # C's truncating integer division, as torch's 'trunc'


@op("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(c, node):
    return binary(c, c.x("self"), "//", c.x("other"), MUL)


@op("aten.remainder.Tensor", "aten.remainder.Scalar")
def remainder(c, node):
    return binary(c, c.x("self"), "%", c.x("other"), MUL)  # sign of the divisor, as torch.remainder


@op("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(c, node):
    return call("jnp.fmod", c.x("self"), c.x("other"))


@op("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor")
def pow_(c, node):
    exponent = c.raw("exponent")
    if exponent == 2:
        return call("jnp.square", c.x("self"))
    if exponent == 0.5:
        return call("jnp.sqrt", c.x("self"))
    return binary(c, c.x("self"), "**", c.x("exponent"), POWER + 1)


@op("aten.pow.Scalar")
def pow_scalar(c, node):
    return Expr(f"{c.x('self').at(POWER + 1)} ** {c.x('exponent').at(UNARY)}", POWER)


@op("aten.neg.default")
def neg(c, node):
    return Expr(f"-{c.x('self').at(UNARY)}", UNARY)


@op("aten.square.default")
def square(c, node):
    return call("jnp.square", c.x("self"))


_UNARY = {"abs": "jnp.abs", "exp": "jnp.exp", "exp2": "jnp.exp2", "expm1": "jnp.expm1", "log": "jnp.log",
          "log1p": "jnp.log1p", "log2": "jnp.log2", "log10": "jnp.log10", "sqrt": "jnp.sqrt", "rsqrt": "lax.rsqrt",
          "reciprocal": "jnp.reciprocal", "sin": "jnp.sin", "cos": "jnp.cos", "tan": "jnp.tan", "asin": "jnp.arcsin",
          "acos": "jnp.arccos", "atan": "jnp.arctan", "sinh": "jnp.sinh", "cosh": "jnp.cosh", "asinh": "jnp.arcsinh",
          "acosh": "jnp.arccosh", "atanh": "jnp.arctanh", "erf": "jax.scipy.special.erf",
          "erfc": "jax.scipy.special.erfc", "erfinv": "jax.scipy.special.erfinv", "floor": "jnp.floor",
          "ceil": "jnp.ceil", "trunc": "jnp.trunc", "sign": "jnp.sign", "sgn": "jnp.sign", "isnan": "jnp.isnan",
          "isinf": "jnp.isinf", "isfinite": "jnp.isfinite", "logical_not": "jnp.logical_not",
          "bitwise_not": "jnp.invert", "digamma": "jax.scipy.special.digamma", "lgamma": "jax.scipy.special.gammaln",
          "sigmoid": "jax.nn.sigmoid", "tanh": "jnp.tanh", "frac": None}


def _unary(name, fn):
    @op(f"aten.{name}.default", f"aten.{name}")
    def handler(c, node):
        if name == "frac":
            x = c.x("self")
            return binary(c, x, "-", call("jnp.trunc", x), ADD)
        return unary(c, fn)

    return handler


for _name, _fn in _UNARY.items():
    _unary(_name, _fn)


@op("aten.round.default", "aten.round.decimals")
def round_(c, node):
    decimals = c.raw("decimals") if c.has("decimals") else 0
    return call("jnp.round", c.x("self"), decimals=c.lit(decimals, "decimals") if decimals else None)


@op("aten.atan2.default")
def atan2(c, node):
    return call("jnp.arctan2", c.x("self"), c.x("other"))


@op("aten.clamp.default", "aten.clamp.Tensor", "aten.clip.default", "aten.clip.Tensor")
def clamp(c, node):
    lo = c.x("min") if c.has("min") else None
    hi = c.x("max") if c.has("max") else None
    return call("jnp.clip", c.x("self"), lo if lo is not None else "None", hi) if hi is not None else \
        call("jnp.clip", c.x("self"), lo)


@op("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(c, node):
    return call("jnp.maximum", c.x("self"), c.x("min"))


@op("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(c, node):
    return call("jnp.minimum", c.x("self"), c.x("max"))


@op("aten.maximum.default", "aten.fmax.default")
def maximum(c, node):
    return call("jnp.maximum" if "maximum" in str(node.target) else "jnp.fmax", c.x("self"), c.x("other"))


@op("aten.minimum.default", "aten.fmin.default")
def minimum(c, node):
    return call("jnp.minimum" if "minimum" in str(node.target) else "jnp.fmin", c.x("self"), c.x("other"))


@op("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def where(c, node):
    return call("jnp.where", c.x("condition"), c.x("self"), c.x("other"))


@op("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(c, node):
    return call("jnp.where", c.x("mask"), c.x("value"), c.x("self"))


_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def _compare(name, symbol):
    @op(f"aten.{name}.Tensor", f"aten.{name}.Scalar")
    def handler(c, node):
        return Expr(f"{c.x('self').at(COMPARE + 1)} {symbol} {c.x('other').at(COMPARE + 1)}", COMPARE)

    return handler


for _name, _symbol in _COMPARE.items():
    _compare(_name, _symbol)


@op("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default")
def logical(c, node):
    name = str(node.target).split(".")[1]
    return call(f"jnp.{name}", c.x("self"), c.x("other"))


@op("aten.__and__.Tensor", "aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar")
def bitwise_and(c, node):
    return Expr(f"{c.x('self').at(ATOM - 1)} & {c.x('other').at(ATOM - 1)}", 11)


@op("aten.__or__.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar")
def bitwise_or(c, node):
    return Expr(f"{c.x('self').at(ATOM - 1)} | {c.x('other').at(ATOM - 1)}", 9)


@op("aten.__xor__.Tensor", "aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar")
def bitwise_xor(c, node):
    return Expr(f"{c.x('self').at(ATOM - 1)} ^ {c.x('other').at(ATOM - 1)}", 10)


@op("aten.lerp.Scalar", "aten.lerp.Tensor")
def lerp(c, node):
    a, b = c.x("self"), c.x("end")
    step = binary(c, c.x("weight"), "*", binary(c, b, "-", a, ADD), MUL)
    return binary(c, a, "+", step, ADD)


@op("aten.addcmul.default")
def addcmul(c, node):
    prod = binary(c, c.x("tensor1"), "*", c.x("tensor2"), MUL)
    value = c.raw("value")
    prod = prod if value == 1 else binary(c, c.lit(value, "value"), "*", prod, MUL)
    return binary(c, c.x("self"), "+", prod, ADD)


@op("aten.addcdiv.default")
def addcdiv(c, node):
    quot = binary(c, c.x("tensor1"), "/", c.x("tensor2"), MUL)
    value = c.raw("value")
    quot = quot if value == 1 else binary(c, c.lit(value, "value"), "*", quot, MUL)
    return binary(c, c.x("self"), "+", quot, ADD)


@op("aten.logaddexp.default")
def logaddexp(c, node):
    return call("jnp.logaddexp", c.x("self"), c.x("other"))


@op("aten.nan_to_num.default")
def nan_to_num(c, node):
    kw = {k: c.x(k) for k in ("nan", "posinf", "neginf") if c.has(k)}
    return call("jnp.nan_to_num", c.x("self"), **kw)


@op("aten.fill.Scalar", "aten.fill.Tensor")
def fill(c, node):
    return call("jnp.full_like", c.x("self"), c.x("value"))


@op("aten.zero.default")
def zero(c, node):
    return call("jnp.zeros_like", c.x("self"))


@op("aten.copy.default")
def copy(c, node):
    """copy(self, src): src broadcast to self's shape and cast to its dtype (a functional copy_)."""
    src = c.x("src")
    if c.val("src").dtype != c.val("self").dtype:
        src = Expr(f"{src.at(ATOM)}.astype({c.dtype(c.val('self').dtype)})")
    if tuple(c.val("src").shape) != tuple(c.val("self").shape):
        src = call("jnp.broadcast_to", src, Expr(f"{c.x('self').at(ATOM)}.shape"))
    return src


