"""Normalisation ops in functional form (the layers BatchNorm2d, LayerNorm, ... are runtime classes)."""
from __future__ import annotations

from flaxport.translate.ops.table import ADD, ATOM, MUL, Expr, Outputs, Unsupported, binary, call, op


@op("aten.layer_norm.default")
def layer_norm(c, node):
    return call(c.helper("layer_norm"), c.x("input"), c.ints(tuple(c.raw("normalized_shape")), "normalized_shape"),
                c.x("weight") if c.has("weight") else "None", c.x("bias") if c.has("bias") else "None",
                c.lit(c.raw("eps"), "eps"))


@op("aten.native_layer_norm.default")
def native_layer_norm(c, node):
    """(out, mean, rstd), the statistics over the normalised dims kept as size 1."""
    n = len(c.raw("normalized_shape"))
    ndim = c.val("input").ndim
    mean, rstd = _statistics(c, c.x("input"), tuple(range(ndim - n, ndim)))
    return Outputs((layer_norm(c, node), mean, rstd))


def _statistics(c, x, axes):
    """(mean, 1 / sqrt(biased variance + eps)) over axes, kept as size 1."""
    axis = repr(axes if len(axes) > 1 else axes[0])
    mean = call("jnp.mean", x, axis=axis, keepdims="True")
    var = call("jnp.var", x, axis=axis, keepdims="True")
    return mean, call("lax.rsqrt", binary(c, var, "+", c.lit(c.raw("eps"), "eps"), ADD))


@op("aten.native_group_norm.default")
def native_group_norm(c, node):
    """(out, mean, rstd) with the statistics (N, group)."""
    groups = c.lit(c.raw("group"), "num_groups")
    x = c.x("input")
    grouped = Expr(f"{x.at(ATOM)}.reshape({x.at(ATOM)}.shape[0], {groups}, -1)")
    mean, rstd = _statistics(c, grouped, (2,))
    out = call(c.helper("group_norm"), x, groups, c.x("weight") if c.has("weight") else "None",
               c.x("bias") if c.has("bias") else "None", c.lit(c.raw("eps"), "eps"))
    return Outputs((out, Expr(f"{mean.at(ATOM)}[..., 0]"), Expr(f"{rstd.at(ATOM)}[..., 0]")))


@op("aten.group_norm.default")
def group_norm(c, node):
    return call(c.helper("group_norm"), c.x("input"), c.lit(c.raw("num_groups"), "num_groups"),
                c.x("weight") if c.has("weight") else "None", c.x("bias") if c.has("bias") else "None",
                c.lit(c.raw("eps"), "eps"), channels_last="True" if c.channels_last else None)


@op("aten.instance_norm.default")
def instance_norm(c, node):
    if not c.raw("use_input_stats"):  # normalised by the running statistics, as eval-mode batch_norm is
        return batch_norm(c, node)
    channels = c.val("input").shape[1]  # a size export may keep symbolic: read from the input then
    return call(c.helper("group_norm"), c.x("input"), c.lit(channels, "num_groups"),
                c.x("weight") if c.has("weight") else "None", c.x("bias") if c.has("bias") else "None",
                c.lit(c.raw("eps"), "eps"))


@op("aten.rms_norm.default")
def rms_norm(c, node):
    x = c.x("input")
    n = len(c.raw("normalized_shape"))
    axes = tuple(range(c.val("input").ndim - n, c.val("input").ndim))
    eps = c.raw("eps") if c.has("eps") and c.raw("eps") is not None else None
    eps = c.lit(eps, "eps") if eps is not None else Expr(f"jnp.finfo({x.at(100)}.dtype).eps")
    mean_sq = call("jnp.mean", call("jnp.square", x), axis=repr(axes if n > 1 else axes[0]), keepdims="True")
    y = binary(c, x, "*", call("lax.rsqrt", binary(c, mean_sq, "+", eps, ADD)), MUL)
    return binary(c, y, "*", c.x("weight"), MUL) if c.has("weight") else y


@op("aten._weight_norm.default")
def weight_norm(c, node):
    """torch._weight_norm(v, g, dim) (weight_norm's parametrization): v * g / ||v||, the norm over
    every axis but `dim` (over all of them for dim=-1)."""
    v = c.x("v")
    ndim = c.val("v").ndim
    dim = c.raw("dim") if c.has("dim") else 0
    axes = tuple(range(ndim)) if dim == -1 else tuple(a for a in range(ndim) if a != dim % ndim)
    norm = call("jnp.linalg.vector_norm", v, axis=repr(axes), keepdims="True")
    return binary(c, v, "*", binary(c, c.x("g"), "/", norm, MUL), MUL)


@op("aten.batch_norm.default", "aten._native_batch_norm_legit_no_training.default",
    "aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats", "aten.native_batch_norm.default")
def batch_norm(c, node):
    """F.batch_norm in a module's own forward: eval statistics, or batch statistics without buffers. The
    native forms also return the batch's mean and 1 / std (train) or nothing (eval: empty arrays)."""
    training = c.raw("training") if c.has("training") else False
    x = c.x("input")
    ndim = c.val("input").ndim
    native = not str(node.target).startswith("aten.batch_norm")
    if training:  # batch statistics (capture.running_statistics writes a module's running ones)
        axes = tuple(range(ndim - 1)) if c.channels_last else (0,) + tuple(range(2, ndim))
        saved = (call("jnp.mean", x, axis=repr(axes)),
                 call("lax.rsqrt", binary(c, call("jnp.var", x, axis=repr(axes)), "+", c.lit(c.raw("eps"), "eps"), ADD)))
    else:
        saved = tuple(call("jnp.zeros", "(0,)", f"{x.at(ATOM)}.dtype") for _ in range(2))
    optional = {name: c.x(name) if c.has(name) else "None" for name in ("running_mean", "running_var", "weight", "bias")}
    y = call(c.helper("batch_norm"), x, optional["running_mean"], optional["running_var"], optional["weight"],
             optional["bias"], training=repr(bool(training)), eps=c.lit(c.raw("eps"), "eps"),
             channels_last="True" if c.channels_last else None)
    return Outputs((y,) + saved) if native else y
