"""The torch loss of a train-step check, carried into JAX.

check_step carries torch's common losses (functions and modules, with their reduction and
options) by this table, written with torch's arithmetic:

  F.cross_entropy / nn.CrossEntropyLoss   class axis 1, ignore_index, label_smoothing, weight
  F.nll_loss / nn.NLLLoss                  class axis 1, ignore_index, weight
  F.mse_loss / nn.MSELoss                  mean squared error (not optax.l2_loss, which halves it)
  F.l1_loss / nn.L1Loss
  F.binary_cross_entropy_with_logits / nn.BCEWithLogitsLoss   the stable formula, pos_weight, weight

Anything else (a lambda, a custom module) is given as `flax_loss_fn=`: a JAX function of
(outputs, targets), hand-written or translated from the torch loss by
`flaxport.translate.translate_function(loss_fn, example_outputs, example_targets)`.
"""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np

from flaxport.errors import UserError


class UnsupportedLossError(UserError):
    """A torch loss check_step cannot carry into JAX."""


def _reduce(per, reduction, weights=None):
    if reduction == "none":
        return per
    if reduction == "sum":
        return jnp.sum(per)
    if weights is not None:
        return jnp.sum(per) / jnp.sum(weights)
    return jnp.mean(per)


def _class_last(x):
    return jnp.moveaxis(x, 1, -1) if x.ndim > 2 else x


def _nll(logp, target, reduction, weight, ignore_index, smoothing=0.0):
    """torch's nll / cross-entropy on log-probabilities with the class on axis 1."""
    logp = _class_last(logp)
    n_classes = logp.shape[-1]
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    w = jnp.ones((n_classes,), logp.dtype) if weight is None else jnp.asarray(weight, logp.dtype)
    wt = jnp.where(valid, w[safe], 0.0)
    per = picked * wt
    if smoothing:
        smooth = -jnp.sum(logp * w, axis=-1) * valid
        if reduction == "mean":
            return (1 - smoothing) * jnp.sum(per) / jnp.sum(wt) + smoothing / n_classes * jnp.sum(smooth) / jnp.sum(wt)
        per = (1 - smoothing) * per + smoothing / n_classes * smooth
    return _reduce(per, reduction, wt if reduction == "mean" else None)


def _options(loss_fn, func) -> dict:
    """A loss module's options (reduction, weight, ...) or a function's defaults."""
    if inspect.isfunction(loss_fn) or inspect.isbuiltin(loss_fn):
        return {}
    opts = {k: getattr(loss_fn, k) for k in ("reduction", "ignore_index", "label_smoothing") if hasattr(loss_fn, k)}
    for k in ("weight", "pos_weight"):
        v = getattr(loss_fn, k, None)
        if v is not None:
            opts[k] = v.detach().cpu().numpy()
    return opts


def table_loss(loss_fn):
    """(jax loss(outputs, targets), its torch name) for a loss in the table, else None."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    def key(fn):
        for f, m, name in ((F.cross_entropy, nn.CrossEntropyLoss, "cross_entropy"),
                           (F.nll_loss, nn.NLLLoss, "nll_loss"), (F.mse_loss, nn.MSELoss, "mse_loss"),
                           (F.l1_loss, nn.L1Loss, "l1_loss"),
                           (F.binary_cross_entropy_with_logits, nn.BCEWithLogitsLoss,
                            "binary_cross_entropy_with_logits")):
            if fn is f or type(fn) is m:
                return name
        return None

    name = key(loss_fn)
    if name is None:
        return None
    o = {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0, "weight": None, "pos_weight": None,
         **_options(loss_fn, name)}
    if isinstance(loss_fn, torch.nn.Module):
        label = f"nn.{type(loss_fn).__name__}"
    else:
        label = f"F.{name}"

    def loss(outputs, targets):
        out = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        if name == "cross_entropy":
            return _nll(jax.nn.log_softmax(out, axis=1), targets, o["reduction"], o["weight"], o["ignore_index"],
                        o["label_smoothing"])
        if name == "nll_loss":
            return _nll(out, targets, o["reduction"], o["weight"], o["ignore_index"])
        t = jnp.asarray(targets, out.dtype)
        if name == "mse_loss":
            return _reduce(jnp.square(out - t), o["reduction"])
        if name == "l1_loss":
            return _reduce(jnp.abs(out - t), o["reduction"])
        # torch: (1 - t) x + (1 + (pw - 1) t) (log1p(exp(-|x|)) + max(-x, 0))
        log_weight = 1.0 if o["pos_weight"] is None else 1 + (jnp.asarray(o["pos_weight"], out.dtype) - 1) * t
        per = (1 - t) * out + log_weight * (jnp.log1p(jnp.exp(-jnp.abs(out))) + jnp.maximum(-out, 0))
        if o["weight"] is not None:
            per = per * jnp.asarray(o["weight"], out.dtype)
        return _reduce(per, o["reduction"])

    return loss, label


def loss_name(loss_fn) -> str:
    return getattr(loss_fn, "__qualname__", None) or type(loss_fn).__name__


def jax_loss(loss_fn) -> tuple:
    """(jax loss(outputs, targets) in torch layout, how it was obtained) for a torch loss of the table."""
    found = table_loss(loss_fn)
    if found is None:
        raise UnsupportedLossError(
            f"the loss {loss_name(loss_fn)} is not one of the torch losses check_step carries (cross_entropy, "
            "nll_loss, mse_loss, l1_loss, binary_cross_entropy_with_logits): pass flax_loss_fn=(a JAX function of "
            "outputs, targets), e.g. flaxport.translate.translate_function(loss_fn, example_outputs, "
            "example_targets)")
    fn, label = found
    return fn, f"{label} from flaxport's loss table"


def as_jax_targets(targets):
    """Targets (tensor/array, or a tuple of them) as JAX-ready NumPy: int64 -> int32 without jax x64."""
    if isinstance(targets, (tuple, list)):
        return type(targets)(as_jax_targets(t) for t in targets)
    a = targets.detach().cpu().numpy() if hasattr(targets, "detach") else np.asarray(targets)
    if np.issubdtype(a.dtype, np.integer) and not jax.config.jax_enable_x64:
        a = a.astype(np.int32)
    return a
