"""Tensor creation (arange, zeros, full, *_like), embedding lookups, and dropout in a module's own forward."""
from __future__ import annotations

from flaxport.translate.ops.table import Outputs, Unsupported, call, op


def _dtype_kw(c, default_float=True):
    """dtype= text for the node's output dtype, or None where jnp's default gives the same."""
    dtype = c.out.dtype
    return c.dtype(dtype, follow=c.node)


@op("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def arange(c, node):
    args = [c.x(k) for k in ("start", "end", "step") if c.has(k)]
    if len(args) == 2 and args[0].text == "0":
        args = args[1:]
    return call("jnp.arange", *args, dtype=_dtype_kw(c))


@op("aten.zeros.default", "aten.ones.default", "aten.empty.memory_format", "aten.empty.default")
def zeros(c, node):
    name = "jnp.ones" if ".ones." in str(node.target) else "jnp.zeros"
    return call(name, c.size("size"), _dtype_kw(c))


@op("aten.full.default")
def full(c, node):
    return call("jnp.full", c.size("size"), c.x("fill_value"), _dtype_kw(c))


@op("aten.zeros_like.default", "aten.ones_like.default", "aten.empty_like.default")
def zeros_like(c, node):
    name = "jnp.ones_like" if "ones" in str(node.target) else "jnp.zeros_like"
    same = c.out.dtype == c.val("self").dtype
    return call(name, c.x("self"), dtype=None if same else _dtype_kw(c))


@op("aten.full_like.default")
def full_like(c, node):
    same = c.out.dtype == c.val("self").dtype
    return call("jnp.full_like", c.x("self"), c.x("fill_value"), dtype=None if same else _dtype_kw(c))


@op("aten.new_zeros.default", "aten.new_ones.default", "aten.new_empty.default")
def new_zeros(c, node):
    name = "jnp.ones" if "ones" in str(node.target) else "jnp.zeros"
    return call(name, c.size("size"), _dtype_kw(c))


@op("aten.new_full.default")
def new_full(c, node):
    return call("jnp.full", c.size("size"), c.x("fill_value"), _dtype_kw(c))


@op("aten.scalar_tensor.default")
def scalar_tensor(c, node):
    return call("jnp.asarray", c.x("s"), _dtype_kw(c))


@op("aten.linspace.default")
def linspace(c, node):
    return call("jnp.linspace", c.x("start"), c.x("end"), c.x("steps"), dtype=_dtype_kw(c))


@op("aten.eye.default", "aten.eye.m")
def eye(c, node):
    return call("jnp.eye", c.x("n"), c.x("m") if c.has("m") else None, dtype=_dtype_kw(c))


@op("aten.embedding.default")
def embedding(c, node):
    return call("jnp.take", c.x("weight"), c.x("indices"), axis="0")


@op("aten.dropout.default", "aten.feature_dropout.default")
def dropout(c, node):
    p = c.raw("p")
    p_other = c.twin_raw("p")
    train, train_other = c.raw("train"), c.twin_raw("train")
    live = (p and train) or (p_other and train_other)
    if not live:
        return c.x("input")
    rate = p if p and train else p_other
    ndim = c.val("input").ndim
    broadcast = f", broadcast_dims={tuple(range(2, ndim))!r}" if "feature" in str(node.target) and ndim > 2 else ""
    module = c.submodule("dropout", f"nnx.Dropout({rate!r}{broadcast}, rngs=rngs)")
    if p and train and p_other and train_other:  # F.dropout(x, p, training=True): on in eval mode too, as in torch
        return call(module.text, c.x("input"), deterministic="False")
    return call(module.text, c.x("input"))


@op("aten.alpha_dropout.default", "aten.feature_alpha_dropout.default")
def alpha_dropout(c, node):
    if c.raw("train") or c.twin_raw("train"):
        raise Unsupported("alpha dropout in train mode")
    return c.x("input")



@op("aten.empty_strided.default", "aten.empty_permuted.default")
def empty_strided(c, node):
    """Uninitialised in torch (the proof compares it on shape): zeros here."""
    return call("jnp.zeros", c.size("size"), _dtype_kw(c))


@op("aten.new_empty_strided.default")
def new_empty_strided(c, node):
    return call("jnp.zeros", c.size("size"), _dtype_kw(c))


@op("aten.logspace.default", "aten.logspace.Tensor_Tensor", "aten.logspace.Tensor_Scalar", "aten.logspace.Scalar_Tensor")
def logspace(c, node):
    base = c.raw("base") if c.has("base") else 10.0
    return call("jnp.logspace", c.x("start"), c.x("end"), c.x("steps"), base=c.lit(base, "base") if base != 10.0
                else None, dtype=_dtype_kw(c))


@op("aten.nonzero_static.default")
def nonzero_static(c, node):
    """The first `size` indices (rows of coordinates) of the non-zero elements, fill_value rows after them."""
    fill = c.raw("fill_value") if c.has("fill_value") else -1
    return call("jnp.argwhere", c.x("self"), size=c.lit(c.raw("size"), "size"), fill_value=c.lit(fill, "fill_value"))


@op("aten.nonzero.default", "aten.nonzero_numpy.default", "aten.argwhere.default", "aten.masked_select.default",
    "aten._unique2.default", "aten.unique_consecutive.default", "aten.unique_dim.default")
def data_dependent(c, node):
    raise Unsupported("its result's size depends on tensor values, which a jitted JAX function cannot have "
                      "(torch.nonzero_static(x, size=...) has a fixed size)")


# aten's embedding_bag `mode`
_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


@op("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default", "aten.embedding_bag.default",
    "aten.embedding_bag.padding_idx")
def embedding_bag(c, node):
    """(bags, and torch's three bookkeeping outputs, which only its backward reads: not computed)."""
    padding = c.raw("padding_idx") if c.has("padding_idx") else None
    mode = _BAG_MODES[c.raw("mode") if c.has("mode") else 0]
    bags = call(c.helper("embedding_bag"), c.x("weight"), c.x("indices"), c.x("offsets"),
                mode=repr(mode) if mode != "mean" else None,
                per_sample_weights=c.x("per_sample_weights") if c.has("per_sample_weights") else None,
                include_last_offset="True" if c.has("include_last_offset") and c.raw("include_last_offset") else None,
                padding_idx=c.lit(padding, "padding_idx") if padding is not None and padding >= 0 else None)
    bookkeeping = Unsupported("embedding_bag's offset2bag / bag_size / max_indices outputs")
    return Outputs((bags, bookkeeping, bookkeeping, bookkeeping))


@op("aten.native_dropout.default")
def native_dropout(c, node):
    """(output, keep mask): off (train=False) the input and all-true."""
    if c.raw("train") or c.twin_raw("train"):
        raise Unsupported("native_dropout drawing a mask (functional dropout in train mode)")
    return Outputs((c.x("input"), call("jnp.ones_like", c.x("input"), dtype="bool")))
