"""Loss functions (for `translate_function`): torch's reductions, ignore_index, label smoothing, stable BCE."""
from __future__ import annotations

from flaxport.translate.ops.table import ADD, Expr, Outputs, binary, call, op

_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


def _reduce(c, loss: Expr) -> Expr:
    reduction = _REDUCTION.get(c.raw("reduction"), c.raw("reduction")) if c.has("reduction") else "mean"
    if reduction == "none":
        return loss
    return call("jnp.mean" if reduction == "mean" else "jnp.sum", loss)


def _reduction_kw(c):
    reduction = _REDUCTION.get(c.raw("reduction"), c.raw("reduction")) if c.has("reduction") else "mean"
    return None if reduction == "mean" else repr(reduction)


@op("aten.cross_entropy_loss.default")
def cross_entropy(c, node):
    ignore = c.raw("ignore_index") if c.has("ignore_index") else -100
    smoothing = c.raw("label_smoothing") if c.has("label_smoothing") else 0.0
    return call(c.helper("cross_entropy"), c.x("self"), c.x("target"),
                weight=c.x("weight") if c.has("weight") else None, reduction=_reduction_kw(c),
                ignore_index=c.lit(ignore, "ignore_index") if ignore != -100 else None,
                label_smoothing=c.lit(smoothing, "label_smoothing") if smoothing else None)


@op("aten.nll_loss_nd.default", "aten.nll_loss.default", "aten.nll_loss2d.default")
def nll_loss(c, node):
    ignore = c.raw("ignore_index") if c.has("ignore_index") else -100
    return call(c.helper("nll_loss"), c.x("self"), c.x("target"), weight=c.x("weight") if c.has("weight") else None,
                reduction=_reduction_kw(c), ignore_index=c.lit(ignore, "ignore_index") if ignore != -100 else None)


@op("aten.mse_loss.default")
def mse_loss(c, node):
    return _reduce(c, call("jnp.square", binary(c, c.x("self"), "-", c.x("target"), ADD)))


@op("aten.l1_loss.default")
def l1_loss(c, node):
    return _reduce(c, call("jnp.abs", binary(c, c.x("self"), "-", c.x("target"), ADD)))


@op("aten.smooth_l1_loss.default", "aten.huber_loss.default")
def smooth_l1(c, node):
    diff = call("jnp.abs", binary(c, c.x("self"), "-", c.x("target"), ADD))
    if "huber" in str(node.target):
        delta = c.raw("delta") if c.has("delta") else 1.0
        loss = call("jnp.where", Expr(f"{diff} < {delta!r}", 8), Expr(f"0.5 * {diff} ** 2"),
                    Expr(f"{delta!r} * ({diff} - {0.5 * delta!r})"))
    else:
        beta = c.raw("beta") if c.has("beta") else 1.0
        loss = call("jnp.where", Expr(f"{diff} < {beta!r}", 8), Expr(f"0.5 * {diff} ** 2 / {beta!r}"),
                    Expr(f"{diff} - {0.5 * beta!r}")) if beta else diff
    return _reduce(c, loss)


@op("aten.binary_cross_entropy_with_logits.default")
def bce_with_logits(c, node):
    return call(c.helper("binary_cross_entropy_with_logits"), c.x("self"), c.x("target"),
                weight=c.x("weight") if c.has("weight") else None,
                pos_weight=c.x("pos_weight") if c.has("pos_weight") else None, reduction=_reduction_kw(c))


@op("aten.binary_cross_entropy.default")
def bce(c, node):
    return call(c.helper("binary_cross_entropy"), c.x("self"), c.x("target"),
                weight=c.x("weight") if c.has("weight") else None, reduction=_reduction_kw(c))


@op("aten.kl_div.default")
def kl_div(c, node):
    x, y = c.x("self"), c.x("target")
    if c.has("log_target") and c.raw("log_target"):
        loss = Expr(f"jnp.exp({y}) * ({y} - {x})")
    else:
        loss = Expr(f"jax.scipy.special.xlogy({y}, {y}) - {y} * {x}")
    return _reduce(c, loss)


@op("aten.multilabel_margin_loss_forward.default")
def multilabel_margin_loss_forward(c, node):
    # (loss, is_target): is_target is only what torch's backward reads
    return Outputs((multilabel_margin_loss(c, node), None))


@op("aten.multilabel_margin_loss.default")
def multilabel_margin_loss(c, node):
    # a handler of its own: torch's Python decomposition of the forward op miscounts targets after
    # a -1 and repeated targets (its kernel does not)
    return call(c.helper("multilabel_margin_loss"), c.x("self"), c.x("target"), reduction=_reduction_kw(c))
