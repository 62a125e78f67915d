"""Binning: searchsorted, bucketize, histc, histogram (fixed bin counts: sizes known before the model runs)."""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, Expr, Outputs, call, op


def _side(c) -> str | None:
    side = c.raw("side") if c.has("side") else None
    right = side == "right" or (side is None and c.has("right") and c.raw("right"))
    return "'right'" if right else None


def _int_type(c) -> str:
    return "jnp.int32" if c.has("out_int32") and c.raw("out_int32") else "int"


@op("aten.searchsorted.Tensor", "aten.searchsorted.Scalar")
def searchsorted(c, node):
    """Where each value would go in sorted_sequence (1-D, or one row per leading index of the values)."""
    found = call(c.helper("searchsorted"), c.x("sorted_sequence"), c.x("self"), side=_side(c),
                 sorter=c.x("sorter") if c.has("sorter") else None)
    return Expr(f"{found.at(ATOM)}.astype({_int_type(c)})")


@op("aten.bucketize.Tensor", "aten.bucketize.Scalar")
def bucketize(c, node):
    """The bucket of each value among 1-D boundaries (right=False: boundaries[i-1] < x <= boundaries[i])."""
    found = call("jnp.searchsorted", c.x("boundaries"), c.x("self"), side="'right'" if c.raw("right") else None)
    return Expr(f"{found.at(ATOM)}.astype({_int_type(c)})")


@op("aten.histc.default")
def histc(c, node):
    """`bins` equal bins over [min, max] (the data's own range when both are 0); values outside are not counted."""
    low, high = c.raw("min"), c.raw("max")
    x = c.x("self")
    bounds = Expr(f"({c.lit(low, 'min')}, {c.lit(high, 'max')})") if (low, high) != (0, 0) else \
        Expr(f"(jnp.min({x}), jnp.max({x}))")
    counts = call("jnp.histogram", x, c.lit(c.raw("bins"), "bins"), range=bounds)
    return Expr(f"{counts.at(ATOM)}[0].astype({x.at(ATOM)}.dtype)")


@op("aten.histogram.bin_ct")
def histogram(c, node):
    """(counts, bin edges) of `bins` equal bins, weighted and as a density where asked."""
    x = c.x("self")
    bounds = c.raw("range") if c.has("range") else None
    result = call("jnp.histogram", x, c.lit(c.raw("bins"), "bins"),
                  range=Expr(repr(tuple(bounds))) if bounds else None,
                  weights=c.x("weight") if c.has("weight") else None,
                  density="True" if c.has("density") and c.raw("density") else None)
    return Outputs((Expr(f"{result.at(ATOM)}[0].astype({x.at(ATOM)}.dtype)"),
                    Expr(f"{result.at(ATOM)}[1].astype({x.at(ATOM)}.dtype)")))


@op("aten.histogram.bins_tensor")
def histogram_edges(c, node):
    """(counts, the bin edges given): numpy's bins, the last closed on the right."""
    x = c.x("self")
    result = call("jnp.histogram", x, c.x("bins"), weights=c.x("weight") if c.has("weight") else None,
                  density="True" if c.has("density") and c.raw("density") else None)
    return Outputs((Expr(f"{result.at(ATOM)}[0].astype({x.at(ATOM)}.dtype)"), c.x("bins")))


@op("aten.histogramdd.default", "aten.histogramdd.TensorList_bins")
def histogramdd(c, node):
    """(counts over the grid of `bins` (a count, or the edges, per dimension), [the edges of each
    dimension]) of points (..., D)."""
    bounds = c.raw("range") if c.has("range") else None
    if "TensorList" in str(node.target):
        bins = Expr("[" + ", ".join(c.x_item("bins", i).text for i in range(len(c.raw("bins")))) + "]")
    else:
        bins = c.ints(tuple(c.raw("bins")), "bins")
    return call(c.helper("histogramdd"), c.x("self"), bins,
                bounds=c.ints(tuple(bounds), "range") if bounds else None,
                weight=c.x("weight") if c.has("weight") else None,
                density="True" if c.has("density") and c.raw("density") else None)
