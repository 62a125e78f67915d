"""Reductions (sum, mean, max, var with torch's correction, ...) and scans."""
from __future__ import annotations

import math

from flaxport.translate.ops.table import ADD, ATOM, UNARY, Expr, Outputs, Unsupported, call, op


def _axis(c, name="dim"):
    """axis= text for a dim argument (int, list or absent = all)."""
    if not c.has(name):
        return None
    dims = c.raw(name)
    ndim = max(c.val("self").ndim, 1)
    if isinstance(dims, int):
        return str(c.layout_dim(dims))
    dims = sorted(c.layout_dim(d) for d in dims)
    if not dims:
        return None
    return str(dims[0]) if len(dims) == 1 else repr(tuple(dims))


def _keep(c):
    return "True" if c.has("keepdim") and c.raw("keepdim") else None


def _dtype(c, x):
    if c.has("dtype") and c.raw("dtype") is not None and c.raw("dtype") != c.val("self").dtype:
        return Expr(f"{x.at(ATOM)}.astype({c.dtype(c.raw('dtype'))})")
    return x


def _reduction(fn):
    def handler(c, node):
        return call(fn, _dtype(c, c.x("self")), axis=_axis(c), keepdims=_keep(c))

    return handler


op("aten.sum.dim_IntList", "aten.sum.default")(_reduction("jnp.sum"))
op("aten.mean.dim", "aten.mean.default")(_reduction("jnp.mean"))
op("aten.prod.dim_int", "aten.prod.default")(_reduction("jnp.prod"))
op("aten.amax.default")(_reduction("jnp.max"))
op("aten.amin.default")(_reduction("jnp.min"))
op("aten.all.default", "aten.all.dim", "aten.all.dims")(_reduction("jnp.all"))
op("aten.any.default", "aten.any.dim", "aten.any.dims")(_reduction("jnp.any"))
op("aten.logsumexp.default")(_reduction("jax.nn.logsumexp"))


@op("aten.max.default", "aten.min.default")
def max_all(c, node):
    return call("jnp.max" if ".max." in str(node.target) else "jnp.min", c.x("self"))


@op("aten.max.dim", "aten.min.dim")
def max_dim(c, node):
    """(values, indices) along dim."""
    x, axis, keep = c.x("self"), _axis(c), _keep(c)
    fn, arg = ("jnp.max", "jnp.argmax") if ".max." in str(node.target) else ("jnp.min", "jnp.argmin")
    return Outputs((call(fn, x, axis=axis, keepdims=keep), call(arg, x, axis=axis, keepdims=keep)))


@op("aten.max.other", "aten.min.other")
def max_other(c, node):
    return call("jnp.maximum" if ".max." in str(node.target) else "jnp.minimum", c.x("self"), c.x("other"))


@op("aten.argmax.default", "aten.argmin.default")
def argmax(c, node):
    fn = "jnp.argmax" if "argmax" in str(node.target) else "jnp.argmin"
    return call(fn, c.x("self"), axis=_axis(c), keepdims=_keep(c))


def _correction(c, default=1):
    if c.has("correction") and c.raw("correction") is not None:
        return c.raw("correction")
    if c.has("unbiased") and c.raw("unbiased") is not None:
        return 1 if c.raw("unbiased") else 0
    return default


@op("aten.var.correction", "aten.var.dim", "aten.var.default")
def var(c, node):
    ddof = _correction(c)
    return call("jnp.var", c.x("self"), axis=_axis(c), ddof=str(ddof) if ddof else None, keepdims=_keep(c))


@op("aten.std.correction", "aten.std.dim", "aten.std.default")
def std(c, node):
    ddof = _correction(c)
    return call("jnp.std", c.x("self"), axis=_axis(c), ddof=str(ddof) if ddof else None, keepdims=_keep(c))


@op("aten.var_mean.correction")
def var_mean(c, node):
    ddof = _correction(c)
    x, axis, keep = c.x("self"), _axis(c), _keep(c)
    return Outputs((call("jnp.var", x, axis=axis, ddof=str(ddof) if ddof else None, keepdims=keep),
                    call("jnp.mean", x, axis=axis, keepdims=keep)))


@op("aten.linalg_vector_norm.default")
def vector_norm(c, node):
    order = c.raw("ord") if c.has("ord") else 2
    x = c.x("self")
    return call("jnp.linalg.vector_norm", x, ord=_order(c, order) if order != 2 else None,
                axis=_axis(c), keepdims=_keep(c))


def _order(c, order) -> Expr:
    """A norm's order as written: `jnp.inf` for an infinite one (repr would write a bare `inf`)."""
    return c.lit(order, "ord") if isinstance(order, float) and not math.isfinite(order) else Expr(repr(order))


@op("aten.norm.ScalarOpt_dim")
def norm(c, node):
    order = c.raw("p") if c.has("p") else 2
    return call("jnp.linalg.vector_norm", c.x("self"), ord=_order(c, order) if order != 2 else None,
                axis=_axis(c), keepdims=_keep(c))


@op("aten.cumsum.default", "aten.cumprod.default")
def cumsum(c, node):
    fn = "jnp.cumsum" if "cumsum" in str(node.target) else "jnp.cumprod"
    return call(fn, _dtype(c, c.x("self")), axis=c.dim("dim"))


@op("aten.sort.default", "aten.sort.stable")
def sort(c, node):
    """(values, indices): each its own expression, so an unread one is not written."""
    dim = c.dim("dim") if c.has("dim") else c.val("self").ndim - 1
    descending = "True" if c.has("descending") and c.raw("descending") else None
    x = c.x("self")
    return Outputs((call("jnp.sort", x, axis=dim, stable="True", descending=descending),
                    call("jnp.argsort", x, axis=dim, stable="True", descending=descending)))


@op("aten.mode.default")
def mode(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", max(ndim, 1)) if c.has("dim") else max(ndim, 1) - 1
    keep = c.has("keepdim") and c.raw("keepdim") and ndim > 0
    return call(c.helper("most_frequent"), c.x("self"), axis=dim if dim != max(ndim, 1) - 1 else None,
                keepdims="True" if keep else None)


@op("aten.segment_reduce.default")
def segment_reduce(c, node):
    if c.has("indices") and c.raw("indices") is not None:
        raise Unsupported("segment_reduce with indices (torch has no kernel for it either)")
    if c.has("lengths") and c.raw("lengths") is not None:
        lengths = c.x("lengths")
        ndim = c.val("lengths").ndim
    else:
        offsets = c.x("offsets")
        lengths = Expr(f"{offsets.at(ATOM)}[1:] - {offsets.at(ATOM)}[:-1]", ADD)
        ndim = c.val("offsets").ndim
    if ndim != 1:  # torch takes lengths of axis + 1 dimensions: 1-D is axis 0
        raise Unsupported("segment_reduce with lengths or offsets of more than one axis")
    initial = c.raw("initial") if c.has("initial") else None
    return call(c.helper("segment_reduce"), c.x("data"), repr(c.raw("reduce")), lengths,
                initial=c.lit(initial, "initial") if initial is not None else None)


@op("aten.hash_tensor.default")
def hash_tensor(c, node):
    raise Unsupported("a 64-bit hash of the values' bits, which JAX holds only with jax_enable_x64")


@op("aten.topk.default")
def topk(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim) if c.has("dim") else ndim - 1
    largest = c.raw("largest") if c.has("largest") else True
    if dim == ndim - 1 and largest:
        return call("lax.top_k", c.x("self"), c.lit(c.raw("k"), "k"))
    # the k smallest are the k largest of -x; another dim is moved last and back
    x = c.x("self") if dim == ndim - 1 else call("jnp.moveaxis", c.x("self"), dim, -1)
    found = call("lax.top_k", x if largest else Expr(f"-{x.at(UNARY)}", UNARY), c.lit(c.raw("k"), "k"))
    values = Expr(f"{found.at(ATOM)}[0]") if largest else Expr(f"-{found.at(ATOM)}[0]", UNARY)
    indices = Expr(f"{found.at(ATOM)}[1]")
    if dim != ndim - 1:
        values, indices = (call("jnp.moveaxis", v, -1, dim) for v in (values, indices))
    return Outputs((values, indices))


@op("aten.kthvalue.default")
def kthvalue(c, node):
    """(the k-th smallest along dim, its index)."""
    ndim = max(c.val("self").ndim, 1)
    dim = c.dim("dim", ndim) if c.has("dim") else ndim - 1
    return _order_statistic(c, c.x("self"), dim, Expr(str(c.raw("k") - 1)), False)


def _order_statistic(c, x, dim, position: Expr, per_slice: bool):
    """(value, index) of the element at `position` (one for every slice, or per slice) of x sorted along dim."""
    order = call("jnp.argsort", x, axis=dim, stable="True")
    if per_slice:
        index = call("jnp.take_along_axis", order, call("jnp.expand_dims", position, dim), axis=dim)
    else:
        index = call("lax.dynamic_slice_in_dim", order, position, 1, axis=dim)
    value = call("jnp.take_along_axis", x, index, axis=dim)
    if c.has("keepdim") and c.raw("keepdim"):
        return Outputs((value, index))
    return Outputs((call("jnp.squeeze", value, dim), call("jnp.squeeze", index, dim)))


@op("aten.median.default", "aten.nanmedian.default")
def median_all(c, node):
    """torch's median is the lower of the two middle values (no average); nanmedian leaves NaNs out."""
    x = Expr(f"{c.x('self').at(ATOM)}.reshape(-1)")
    if "nanmedian" in str(node.target):
        count = call("jnp.sum", call("~jnp.isnan", x))
        return Expr(f"{call('jnp.sort', x).at(ATOM)}[jnp.maximum({count.text} - 1, 0) // 2]")
    return Expr(f"{call('jnp.sort', x).at(ATOM)}[({c.x('self').at(ATOM)}.size - 1) // 2]")


@op("aten.median.dim", "aten.nanmedian.dim")
def median_dim(c, node):
    """(lower median along dim, its index); nanmedian counts only the values that are not NaN."""
    dim = c.dim("dim", max(c.val("self").ndim, 1))
    x = c.x("self")
    if "nanmedian" in str(node.target):
        count = call("jnp.sum", call("~jnp.isnan", x), axis=dim)
        return _order_statistic(c, x, dim, Expr(f"jnp.maximum({count.text} - 1, 0) // 2"), True)
    return _order_statistic(c, x, dim, Expr(f"({x.at(ATOM)}.shape[{dim}] - 1) // 2"), False)


@op("aten.cummax.default", "aten.cummin.default")
def cummax(c, node):
    """(running max / min along dim, the index of its latest occurrence)."""
    largest = "cummax" in str(node.target)
    result = call(c.helper("cumulative_extreme"), c.x("self"), c.dim("dim", c.val("self").ndim),
                  largest=None if largest else "False")
    return Outputs((Expr(f"{result.at(ATOM)}[0]"), Expr(f"{result.at(ATOM)}[1]")))


@op("aten.diff.default")
def diff(c, node):
    n = c.raw("n") if c.has("n") else 1
    return call("jnp.diff", c.x("self"), n=c.lit(n, "n") if n != 1 else None, axis=c.dim("dim"),
                prepend=c.x("prepend") if c.has("prepend") else None, append=c.x("append") if c.has("append") else None)
