"""Activations and softmax, with torch's definitions (exact GELU unless approximate='tanh')."""
from __future__ import annotations

from flaxport.translate.ops.elementwise import unary
from flaxport.translate.ops.table import MUL, Expr, Unsupported, binary, call, op


@op("aten.relu.default")
def relu(c, node):
    return unary(c, "jax.nn.relu")


@op("aten.gelu.default")
def gelu(c, node):
    approximate = c.raw("approximate") if c.has("approximate") else "none"
    # torch's default is exact (erf); jax.nn.gelu defaults to the tanh form (docs/porting.md, entry 8)
    return unary(c, "jax.nn.gelu", approximate="True" if approximate == "tanh" else "False")


@op("aten.silu.default")
def silu(c, node):
    return unary(c, "jax.nn.silu")


@op("aten.mish.default")
def mish(c, node):
    x = c.x("self")
    return binary(c, x, "*", call("jnp.tanh", call("jax.nn.softplus", x)), MUL)


@op("aten.hardswish.default")
def hardswish(c, node):
    return unary(c, "jax.nn.hard_swish")  # x * relu6(x + 3) / 6, torch's formula


@op("aten.hardsigmoid.default")
def hardsigmoid(c, node):
    return unary(c, "jax.nn.hard_sigmoid")  # relu6(x + 3) / 6


@op("aten.hardtanh.default")
def hardtanh(c, node):
    lo = c.raw("min_val") if c.has("min_val") else -1.0
    hi = c.raw("max_val") if c.has("max_val") else 1.0
    if lo == 0 and hi == 6:
        return unary(c, "jax.nn.relu6")
    return unary(c, "jnp.clip", c.lit(lo, "min_val"), c.lit(hi, "max_val"))


@op("aten.leaky_relu.default")
def leaky_relu(c, node):
    slope = c.raw("negative_slope") if c.has("negative_slope") else 0.01
    return unary(c, "jax.nn.leaky_relu", negative_slope=c.lit(slope, "negative_slope"))


@op("aten.elu.default")
def elu(c, node):
    alpha, scale, input_scale = (c.raw(k) if c.has(k) else 1.0 for k in ("alpha", "scale", "input_scale"))
    x = c.x("self")
    if input_scale != 1:
        x = binary(c, x, "*", c.lit(input_scale, "input_scale"), MUL)
    y = call("jax.nn.elu", x, alpha=c.lit(alpha, "alpha") if alpha != 1 else None)
    return y if scale == 1 else binary(c, c.lit(scale, "scale"), "*", y, MUL)


@op("aten.selu.default")
def selu(c, node):
    return unary(c, "jax.nn.selu")


@op("aten.celu.default")
def celu(c, node):
    alpha = c.raw("alpha") if c.has("alpha") else 1.0
    return call("jax.nn.celu", c.x("self"), alpha=c.lit(alpha, "alpha") if alpha != 1 else None)


@op("aten.softplus.default")
def softplus(c, node):
    beta = c.raw("beta") if c.has("beta") else 1
    threshold = c.raw("threshold") if c.has("threshold") else 20
    x = c.x("self")
    # torch: x where beta * x > threshold, else log1p(exp(beta x)) / beta
    scaled = x if beta == 1 else binary(c, x, "*", c.lit(beta, "beta"), MUL)
    soft = call("jax.nn.softplus", scaled)
    soft = soft if beta == 1 else binary(c, soft, "/", c.lit(beta, "beta"), MUL)
    return call("jnp.where", Expr(f"{scaled.at(9)} > {c.lit(threshold, 'threshold')}", 8), x, soft)


@op("aten.log_sigmoid.default", "aten.log_sigmoid_forward.default")
def log_sigmoid(c, node):
    return call("jax.nn.log_sigmoid", c.x("self"))


@op("aten.softmax.int", "aten._softmax.default")
def softmax(c, node):
    return call("jax.nn.softmax", _cast(c), axis=c.dim("dim"))


@op("aten.log_softmax.int", "aten._log_softmax.default")
def log_softmax(c, node):
    return call("jax.nn.log_softmax", _cast(c), axis=c.dim("dim"))


def _cast(c):
    x = c.x("self")
    dtype = c.raw("dtype") if c.has("dtype") else None
    return x if dtype is None or dtype == c.val("self").dtype else Expr(f"{x.at(100)}.astype({c.dtype(dtype)})")


@op("aten.prelu.default", "aten._prelu_kernel.default")
def prelu(c, node):
    x, w = c.x("self"), c.x("weight")
    ndim = c.val("self").ndim
    if c.val("weight").numel() > 1 and ndim > 2:
        w = Expr(f"{w.at(100)}.reshape((-1,) + (1,) * {ndim - 2})")
    return call("jnp.where", Expr(f"{x.at(9)} >= 0", 8), x, binary(c, w, "*", x, MUL))


@op("aten.glu.default")
def glu(c, node):
    return call("jax.nn.glu", c.x("self"), axis=c.dim("dim"))


@op("aten.threshold.default")
def threshold(c, node):
    x = c.x("self")
    return call("jnp.where", Expr(f"{x.at(9)} > {c.lit(c.raw('threshold'), 'threshold')}", 8), x,
                c.lit(c.raw("value"), "value"))


@op("aten.rrelu_with_noise.default", "aten.rrelu.default")
def rrelu(c, node):
    """Randomized leaky ReLU; in eval (training=False) the slope is the middle of [lower, upper]."""
    if c.raw("training"):
        raise Unsupported("rrelu in training mode (a random slope per element)")
    lower = c.raw("lower") if c.has("lower") else 1 / 8
    upper = c.raw("upper") if c.has("upper") else 1 / 3
    return call("jax.nn.leaky_relu", c.x("self"), c.lit((lower + upper) / 2, "negative_slope"))
