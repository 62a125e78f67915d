"""Writes at computed indices: scatter (one-hot, scatter_add's message passing, scatter_reduce) and index_add/copy/fill."""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, Expr, Unsupported, call, op

_REDUCE = {"add": "sum", "multiply": "prod", "sum": "sum", "prod": "prod", "mean": "mean", "amax": "amax",
           "amin": "amin"}


def _scatter(c, value_name, reduce=None, include_self=True):
    ndim = c.val("self").ndim
    kwargs = {}
    if reduce is not None:
        if reduce not in _REDUCE:
            raise Unsupported(f"scatter reduce={reduce!r}")
        kwargs["reduce"] = repr(_REDUCE[reduce])
        if not include_self:
            kwargs["include_self"] = "False"
    return call(c.helper("scatter"), c.x("self"), c.dim("dim", ndim), c.x("index"), c.x(value_name), **kwargs)


@op("aten.scatter.src", "aten.scatter.value")
def scatter(c, node):
    return _scatter(c, "src" if c.has("src") else "value")


@op("aten.scatter.reduce", "aten.scatter.value_reduce")
def scatter_reduce_legacy(c, node):
    return _scatter(c, "src" if c.has("src") else "value", c.raw("reduce"))


@op("aten.scatter_add.default")
def scatter_add(c, node):
    return _scatter(c, "src", "sum")


@op("aten.scatter_reduce.two")
def scatter_reduce(c, node):
    return _scatter(c, "src", c.raw("reduce"), c.raw("include_self") is not False)


def _at_index(c) -> str:
    """`.at[:, index]` for dim 1: the index along dim, the other axes whole."""
    ndim = c.val("self").ndim
    return c.index_expr(Expr("X"), ndim, {c.dim("dim", ndim): c.x("index").text}).text[1:]


@op("aten.index_add.default")
def index_add(c, node):
    source = c.x("source")
    alpha = c.raw("alpha") if c.has("alpha") else 1
    if alpha != 1:
        source = Expr(f"{c.lit(alpha, 'alpha').at(ATOM)} * {source.at(ATOM)}")
    return Expr(f"{c.x('self').at(ATOM)}.at{_at_index(c)}.add({source.text})")


@op("aten.index_copy.default")
def index_copy(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.at{_at_index(c)}.set({c.x('source').text})")


@op("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def index_fill(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.at{_at_index(c)}.set({c.x('value').text})")


@op("aten.index_reduce.default")
def index_reduce(c, node):
    """index_reduce(self, dim, index, source, reduce): source's slices along dim combined ('prod', 'mean',
    'amax', 'amin') into self's slices at index; a scatter_reduce with the index spread over source."""
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim)
    shape = (1,) * dim + (-1,) + (1,) * (ndim - dim - 1)
    index = Expr(f"jnp.broadcast_to({c.x('index').at(ATOM)}.reshape({shape!r}), {c.x('source').at(ATOM)}.shape)")
    include = c.raw("include_self") is not False
    return call(c.helper("scatter"), c.x("self"), dim, index, c.x("source"), reduce=repr(_REDUCE[c.raw("reduce")]),
                include_self=None if include else "False")


@op("aten.put.default")
def put(c, node):
    """put(self, index, source, accumulate): source into self's elements counted in flat (row-major) order."""
    x = c.x("self")
    fn = "add" if c.has("accumulate") and c.raw("accumulate") else "set"
    flat = f"{x.at(ATOM)}.reshape(-1).at[{c.x('index').at(ATOM)}.reshape(-1)].{fn}({c.x('source').at(ATOM)}.reshape(-1))"
    return Expr(f"{flat}.reshape({x.at(ATOM)}.shape)")


@op("aten.take.default")
def take(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.reshape(-1)[{c.x('index')}]")


@op("aten.masked_scatter.default")
def masked_scatter(c, node):
    """self with the places where mask is true filled, in row-major order, by source's first elements."""
    return call(c.helper("masked_scatter"), c.x("self"), c.x("mask"), c.x("source"))


def _clamped(c) -> dict:
    """The index arrays of `indices`, each clamped into its axis (they may be out of range where the mask is false)."""
    x = c.x("self")
    return {i: (f"jnp.clip({c.x_item('indices', i)}, 0, {x.at(ATOM)}.shape[{i}] - 1)" if ix is not None else ":")
            for i, ix in enumerate(c.raw("indices"))}


@op("aten._unsafe_masked_index.default")
def unsafe_masked_index(c, node):
    """self[indices] where mask, fill elsewhere."""
    return call("jnp.where", c.x("mask"), c.index_expr(c.x("self"), c.val("self").ndim, _clamped(c)), c.x("fill"))


@op("aten._unsafe_masked_index_put_accumulate.default")
def unsafe_masked_index_put_accumulate(c, node):
    """self with values added at indices where mask."""
    where = c.index_expr(Expr("X"), c.val("self").ndim, _clamped(c)).text[1:]
    return Expr(f"{c.x('self').at(ATOM)}.at{where}.add(jnp.where({c.x('mask')}, {c.x('values')}, 0))")
