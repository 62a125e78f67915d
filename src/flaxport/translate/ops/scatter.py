"""Writes at computed indices: scatter (one-hot, scatter_add's message passing, scatter_reduce) and index_add/copy/fill."""
from __future__ import annotations

from flaxport.translate.ops import ATOM, Expr, Unsupported, call, op

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
