"""Random draws in a module's own forward (randn, rand, randint, bernoulli, normal_, uniform_, ...).

Each becomes a jax.random call on a key from the module's `noise` stream
(`self.noise = rngs.noise.fork()`), which advances on every draw. The proof replays torch's
draws into these calls (flaxport.port.draws); the jax.random function each one calls
is listed there (JAX_FUNCTION) and must stay in step with this file.
"""
from __future__ import annotations

from flaxport.translate.ops.table import ADD, MUL, Expr, Unsupported, binary, call, op


_LIKE = ("aten.empty_like.default", "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default")


def _like(c, name) -> Expr:
    """The array whose shape (and dtype) a draw takes: for `torch.empty_like(y).uniform_()` that
    is y itself (the empty array is never made)."""
    from flaxport.translate import layout as lay

    v = c.raw(name)
    src = v
    while hasattr(src, "op") and str(src.target) in _LIKE and src.kwargs.get("dtype") is None:
        src = src.args[0]
    if src is v:
        return c.x(name)
    return c.body.value_as(src, lay.TORCH)


def _dtype(c, like=None):
    """dtype= text for the draw: `like`'s own dtype where it has the draw's and reads as a name."""
    if like is not None and c.out.dtype == c.val(like).dtype:
        text = _like(c, like).text
        if text.replace(".", "").replace("_", "").isalnum():
            return f"{text}.dtype"
    return c.dtype(c.out.dtype, follow=c.node)


_NEW = ("aten.empty.memory_format", "aten.empty.default", "aten.zeros.default", "aten.ones.default")
_NEW_LIKE = ("aten.new_empty.default", "aten.new_zeros.default", "aten.new_ones.default")


def _shape_of(c, name) -> str:
    """The draw's shape: `y.shape`, or the size torch.empty(size).exponential_() was made with."""
    v = c.raw(name)
    if hasattr(v, "op") and str(v.target) in _NEW:
        return c.size(v.args[0]).text
    if hasattr(v, "op") and str(v.target) in _NEW_LIKE:  # x.new_empty(size)
        return c.size(v.args[1]).text
    return f"{_like(c, name).at(100)}.shape"


@op("aten.randn.default", "aten.rand.default", "aten.randn.generator", "aten.rand.generator")
def randn(c, node):  # a torch.Generator argument: the draw comes from the module's stream all the same
    sampler = "jax.random.normal" if "randn" in str(node.target) else "jax.random.uniform"
    return call(sampler, c.random_key(), c.size("size"), dtype=_dtype(c))


@op("aten.randn_like.default", "aten.rand_like.default")
def randn_like(c, node):
    sampler = "jax.random.normal" if "randn" in str(node.target) else "jax.random.uniform"
    return call(sampler, c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"))


@op("aten.uniform.default")
def uniform(c, node):
    low, high = c.raw("from"), c.raw("to")
    bounds = {} if (low, high) == (0.0, 1.0) else {"minval": c.lit(low, "low"), "maxval": c.lit(high, "high")}
    return call("jax.random.uniform", c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"), **bounds)


def _scaled(c, standard: Expr, mean: Expr | None, std: Expr | None) -> Expr:
    """mean + std * standard, leaving out a mean of 0 and a std of 1."""
    out = standard if std is None else binary(c, std, "*", standard, MUL)
    return out if mean is None else binary(c, mean, "+", out, ADD)


def _arg(c, name, neutral):
    """The argument's code, or None where it is the literal `neutral` (0 for a mean, 1 for a std)."""
    v = c.raw(name)
    return None if isinstance(v, (int, float)) and v == neutral else c.x(name)


@op("aten.normal_functional.default")
def normal_functional(c, node):
    standard = call("jax.random.normal", c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"))
    return _scaled(c, standard, _arg(c, "mean", 0), _arg(c, "std", 1))


@op("aten.normal.Tensor_float", "aten.normal.float_Tensor", "aten.normal.Tensor_Tensor", "aten.normal.float_float")
def normal(c, node):
    overload = node.target._overloadname
    if overload == "float_float":
        shape = c.size("size")
    elif overload == "Tensor_Tensor":
        shape = f"jnp.broadcast_shapes({_shape_of(c, 'mean')}, {_shape_of(c, 'std')})"
    else:
        shape = _shape_of(c, "mean" if overload == "Tensor_float" else "std")
    standard = call("jax.random.normal", c.random_key(), shape, dtype=_dtype(c))
    return _scaled(c, standard, _arg(c, "mean", 0), _arg(c, "std", 1))


@op("aten.bernoulli.default")
def bernoulli(c, node):
    probs = c.raw("self")
    if hasattr(probs, "op") and str(probs.target) == "aten.full_like.default":  # bernoulli(full_like(y, p))
        p = probs.args[1]
        draw = call("jax.random.bernoulli", c.random_key(), c.lit(p, "p") if not hasattr(p, "op") else c.body.value(p),
                    _shape_of(c, "self"))
        return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")
    draw = call("jax.random.bernoulli", c.random_key(), c.x("self"))
    return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")


@op("aten.bernoulli.p", "aten.bernoulli.Tensor")
def bernoulli_p(c, node):
    draw = call("jax.random.bernoulli", c.random_key(), c.x("p"), _shape_of(c, "self"))
    return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")


@op("aten.randint.default", "aten.randint.low")
def randint(c, node):
    low = c.x("low") if c.has("low") else Expr("0")
    if c.out.dtype.is_floating_point:  # whole numbers in a float tensor: drawn as integers, then cast
        draw = call("jax.random.randint", c.random_key(), c.size("size"), low, c.x("high"))
        return Expr(f"{draw.text}.astype({_dtype(c)})")
    return call("jax.random.randint", c.random_key(), c.size("size"), low, c.x("high"), dtype=_int_dtype(c))


@op("aten.randint_like.default", "aten.randint_like.low_dtype")
def randint_like(c, node):
    low = c.x("low") if c.has("low") else Expr("0")
    if c.out.dtype.is_floating_point:  # whole numbers in a float tensor: drawn as integers, then cast
        draw = call("jax.random.randint", c.random_key(), _shape_of(c, "self"), low, c.x("high"))
        return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")
    dtype = _int_dtype(c) if c.out.dtype != c.val("self").dtype else f"{c.x('self').at(100)}.dtype"
    return call("jax.random.randint", c.random_key(), _shape_of(c, "self"), low, c.x("high"), dtype=dtype)


def _int_dtype(c):
    import torch

    return None if c.out.dtype == torch.int64 else c.dtype(c.out.dtype)


@op("aten.exponential.default")
def exponential(c, node):
    standard = call("jax.random.exponential", c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"))
    rate = _arg(c, "lambd", 1)
    return standard if rate is None else binary(c, standard, "/", rate, MUL)


@op("aten.cauchy.default")
def cauchy(c, node):
    standard = call("jax.random.cauchy", c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"))
    return _scaled(c, standard, _arg(c, "median", 0), _arg(c, "sigma", 1))


@op("aten.log_normal.default")
def log_normal(c, node):
    standard = call("jax.random.normal", c.random_key(), _shape_of(c, "self"), dtype=_dtype(c, "self"))
    return call("jnp.exp", _scaled(c, standard, _arg(c, "mean", 0), _arg(c, "std", 1)))


@op("aten.geometric.default")
def geometric(c, node):
    draw = call("jax.random.geometric", c.random_key(), c.x("p"), _shape_of(c, "self"))
    return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")


@op("aten.poisson.default")
def poisson(c, node):
    draw = call("jax.random.poisson", c.random_key(), c.x("self"))
    return Expr(f"{draw.text}.astype({_dtype(c, 'self')})")


def _refused(name, why):
    @op(f"aten.{name}")
    def handler(c, node):
        raise Unsupported(why)

    return handler


_refused("multinomial", "random numbers (multinomial): draw the samples outside forward and pass them in as an input")
_refused("randperm", "random numbers (randperm): draw the permutation outside forward and pass it in as an input")
