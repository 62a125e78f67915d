"""Views torch defines by strides (as_strided, diagonal, Tensor.unfold) and the sizes a graph reads from arrays.

A view's strides are those of the tensor it views; the translation computes on values, so
as_strided reads a contiguous tensor's elements by their flat position (a tensor that is not
contiguous in torch there is refused: its elements sit elsewhere in memory).
"""
from __future__ import annotations

from flaxport.translate import marks
from flaxport.translate.ops.table import ATOM, Expr, Unsupported, call, op


def _contiguous(c, name="self"):
    """Refuse an as_strided of a tensor torch holds other than row-major (sizes may be symbolic)."""
    import sympy

    val = c.val(name)
    expected = sympy.Integer(1)
    for size, stride in reversed(list(zip(val.shape, val.stride()))):
        if c.static(size) != 1 and sympy.simplify(_expr(stride) - expected) != 0:
            raise Unsupported("as_strided of a tensor that is not contiguous in torch (its elements are elsewhere)")
        expected = expected * _expr(size)


def _expr(size):
    import sympy

    return size.node.expr if hasattr(size, "node") else sympy.Integer(size)


@op("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(c, node):
    _contiguous(c)
    offset = c.raw("storage_offset") if c.has("storage_offset") else 0
    return call(c.helper("as_strided"), c.x("self"), c.size("size"), c.ints(c.raw("stride"), "stride"),
                storage_offset=c.lit(offset, "storage_offset") if offset else None)


@op("aten.as_strided_scatter.default")
def as_strided_scatter(c, node):
    _contiguous(c)
    offset = c.raw("storage_offset") if c.has("storage_offset") else 0
    return call(c.helper("as_strided_scatter"), c.x("self"), c.x("src"), c.size("size"),
                c.ints(c.raw("stride"), "stride"), storage_offset=c.lit(offset, "storage_offset") if offset else None)


@op("aten.diagonal.default", "aten.diagonal_copy.default", "aten.linalg_diagonal.default")
def diagonal(c, node):
    name = "A" if c.has("A") else "self"  # linalg.diagonal(A, offset, dim1=-2, dim2=-1)
    ndim = c.val(name).ndim
    offset = c.raw("offset") if c.has("offset") else 0
    a, b = c.dim("dim1", ndim), c.dim("dim2", ndim)
    default = name == "self" and (a, b) == (0, 1)
    return call("jnp.diagonal", c.x(name), offset=c.lit(offset, "offset") if offset else None,
                axis1=None if default else a, axis2=None if default else b)


@op("aten.diagonal_scatter.default")
def diagonal_scatter(c, node):
    """x with its diagonal (offset, dim1, dim2) set to src, which holds the diagonal last (as torch.diagonal
    gives it)."""
    ndim = c.val("self").ndim
    offset = c.raw("offset") if c.has("offset") else 0
    a, b = c.dim("dim1", ndim), c.dim("dim2", ndim)
    n = c.lit(c.val("src").shape[-1], "length").text  # read from an array where export kept it symbolic
    parts = [":"] * ndim
    parts[a] = f"jnp.arange({n})" + (f" + {-offset}" if offset < 0 else "")
    parts[b] = f"jnp.arange({n})" + (f" + {offset}" if offset > 0 else "")
    # NumPy puts the axis two index arrays make where they stand when they are neighbours, else first
    where = min(a, b) if abs(a - b) == 1 else 0
    src = c.x("src") if where == ndim - 2 else call("jnp.moveaxis", c.x("src"), -1, where)
    return Expr(f"{c.x('self').at(ATOM)}.at[{', '.join(parts)}].set({src})")


@op("aten.unfold.default", "aten.unfold_copy.default")
def unfold(c, node):
    """Tensor.unfold(dim, size, step): windows of `size` every `step` along dim, as a new last axis."""
    ndim = c.val("self").ndim
    dim = c.dim("dimension", ndim) if ndim else 0
    size, step = c.raw("size"), c.raw("step")
    if not ndim:  # a 0-d tensor unfolds into its one element
        return Expr(f"{c.x('self').at(ATOM)}.reshape(1)")
    count = c.lit(c.out.shape[dim], "count").text  # (length - size) // step + 1, symbolic or not
    x = c.x("self")
    starts = f"jnp.arange({count})" if step == 1 else f"(jnp.arange({count}) * {step})"
    taken = call("jnp.take", x, Expr(f"{starts}[:, None] + jnp.arange({size})"), axis=dim)
    return taken if dim == max(ndim, 1) - 1 else call("jnp.moveaxis", taken, dim + 1, -1)


@op("aten.alias.default", "aten.alias_copy.default", "aten.clone.default", "aten.lift_fresh_copy.default",
    "aten.positive.default", "aten.resolve_conj.default", "aten.resolve_neg.default", "aten.contiguous.default",
    marks.ARGUMENT, marks.RESULT)  # the capture's tags: identities here, so decomposition leaves them alone
def alias(c, node):
    return c.x("self")


# --------------------------------------------------------------------------- sizes read from arrays
@op("aten.sym_size.int", "aten.size.int")
def sym_size(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.shape[{c.dim('dim')}]")


@op("aten.sym_numel.default")
def sym_numel(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.size")


@op("aten.sym_stride.int")
def sym_stride(c, node):
    """A contiguous tensor's stride: the product of the sizes after dim."""
    x, ndim = c.x("self"), c.val("self").ndim
    dim = c.dim("dim", ndim)
    if dim == ndim - 1:
        return Expr("1")
    return call("math.prod", Expr(f"{x.at(ATOM)}.shape[{dim + 1}:]"))


@op("aten.sym_is_contiguous.default")
def sym_is_contiguous(c, node):
    """A JAX array is always laid out as a contiguous tensor (sym_stride reads those strides)."""
    return Expr("True")


@op("aten.sym_storage_offset.default")
def sym_storage_offset(c, node):
    return Expr("0")


@op("aten._local_scalar_dense.default", "aten.item.default")
def item(c, node):
    """Tensor.item(): the one element, as a 0-d array (inside jit a Python number cannot be read)."""
    return Expr(f"{c.x('self').at(ATOM)}.reshape(())")



@op("aten.resize.default")
def resize(c, node):
    """Tensor.resize_ to as many elements or fewer: the first ones, in row-major order."""
    x = c.x("self")
    old = c.static(c.val("self").numel())
    new = c.static(c.out.numel())
    if old is None or new is None or new > old:
        raise Unsupported("resize_ growing a tensor (torch leaves the new elements uninitialised) or of sizes "
                          "that are not fixed")
    return Expr(f"{x.at(ATOM)}.reshape(-1)[:{new}].reshape({c.size('size').text})")
