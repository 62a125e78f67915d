"""torch.optim optimizers as optax transformations that take the same steps.

The pitfalls (docs: porting pitfalls §7) each translation handles:

* SGD: weight_decay is an L2 term added to the gradient *before* momentum; torch's
  momentum buffer starts at the first gradient and nesterov adds momentum * buffer,
  which is `optax.trace(momentum, nesterov)`. dampening != 0 is not translated.
* Adam: weight_decay is L2 added to the gradient *before* the moments, i.e.
  chain(add_decayed_weights, scale_by_adam, scale(-lr)), not optax.adamw.
* AdamW: decoupled, p -= lr * wd * p next to the Adam step, both from the old p;
  `optax.adamw(..., weight_decay=wd)` (mask: all) is the same update. torch's default
  weight_decay is 0.01; optax's is 1e-4.
* RMSprop: alpha (optax `decay`, default 0.9 there, 0.99 in torch), eps added outside
  the square root (optax `eps_in_sqrt=False`), centered, momentum.

Only the hyperparameters are translated: the optimizer state (moments, step count)
starts fresh, and an attached LR scheduler is not (the current lr is used).
"""
from __future__ import annotations

from collections.abc import Mapping

import optax

from flaxport.errors import UserError


class UnsupportedOptimizerError(UserError):
    """A torch optimizer or option with no faithful optax translation here."""


TORCH_DEFAULTS = {
    "sgd": dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
    "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
                 decoupled_weight_decay=False),
    "adamw": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, maximize=False,
                  decoupled_weight_decay=True),
    "rmsprop": dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False),
}
# Group entries that choose an implementation, not the arithmetic (initial_lr: set by LR schedulers).
_IGNORED = {"params", "foreach", "fused", "capturable", "differentiable", "initial_lr", "name"}


def spec_from_torch(torch_optimizer) -> dict:
    """A torch optimizer -> {'name': 'adam', 'lr': ..., ...} (its one set of hyperparameters).

    Raises UnsupportedOptimizerError for several param groups with different settings.
    """
    name = type(torch_optimizer).__name__.lower()
    groups = torch_optimizer.param_groups
    hyper = {k: v for k, v in groups[0].items() if k not in _IGNORED}
    for i, g in enumerate(groups[1:], start=1):
        other = {k: v for k, v in g.items() if k not in _IGNORED}
        if other != hyper:
            diff = sorted(k for k in set(hyper) | set(other) if hyper.get(k) != other.get(k))
            raise UnsupportedOptimizerError(
                f"{type(torch_optimizer).__name__} param group {i} differs from group 0 in {diff}: translate each "
                "group with optax_from_torch({...spec...}) and combine them with optax.multi_transform")
    return {"name": name, **hyper}


def _float(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def optax_from_torch(optimizer_or_spec) -> optax.GradientTransformation:
    """torch.optim.{SGD, Adam, AdamW, RMSprop} (an instance, or a spec such as
    {'name': 'adamw', 'lr': 1e-3}, torch's defaults filling the rest) -> optax transformation.

    Raises UnsupportedOptimizerError for other optimizers and for options not translated
    (amsgrad, maximize, SGD dampening, differing param groups, unknown spec keys).
    """
    if isinstance(optimizer_or_spec, Mapping):
        spec = dict(optimizer_or_spec)
        name = str(spec.pop("name", spec.pop("type", ""))).lower()
    elif hasattr(optimizer_or_spec, "param_groups"):
        spec = spec_from_torch(optimizer_or_spec)
        name = spec.pop("name")
    else:
        raise UnsupportedOptimizerError(f"expected a torch optimizer or a spec dict, got {type(optimizer_or_spec)}")
    if name not in TORCH_DEFAULTS:
        raise UnsupportedOptimizerError(f"optimizer {name!r} is not translated; supported: {sorted(TORCH_DEFAULTS)}")
    if unknown := sorted(set(spec) - set(TORCH_DEFAULTS[name]) - _IGNORED):
        raise UnsupportedOptimizerError(f"{name} option {unknown[0]!r} is not translated")
    h = {**TORCH_DEFAULTS[name], **{k: v for k, v in spec.items() if k not in _IGNORED}}
    if h["maximize"]:
        raise UnsupportedOptimizerError(f"{name}(maximize=True) is not translated: negate the loss instead")
    lr, wd = _float(h["lr"]), _float(h["weight_decay"])
    l2 = [optax.add_decayed_weights(wd)] if wd else []  # torch: grad = grad + wd * p, first

    if name == "sgd":
        momentum = _float(h["momentum"])
        if _float(h["dampening"]):
            raise UnsupportedOptimizerError("SGD dampening != 0 is not translated (torch's first step skips it)")
        if h["nesterov"] and momentum <= 0:
            raise UnsupportedOptimizerError("SGD nesterov needs momentum > 0 (torch refuses it too)")
        trace = [optax.trace(decay=momentum, nesterov=bool(h["nesterov"]))] if momentum else []
        return optax.chain(*l2, *trace, optax.scale(-lr))

    if name == "rmsprop":
        momentum = _float(h["momentum"])
        return optax.chain(*l2, optax.rmsprop(lr, decay=_float(h["alpha"]), eps=_float(h["eps"]), initial_scale=0.0,
                                              eps_in_sqrt=False, centered=bool(h["centered"]),
                                              momentum=momentum or None))

    # adam / adamw
    if h["amsgrad"]:
        raise UnsupportedOptimizerError(f"{name}(amsgrad=True) is not translated")
    b1, b2 = (_float(b) for b in h["betas"])
    eps = _float(h["eps"])
    if h["decoupled_weight_decay"]:  # AdamW, or Adam(decoupled_weight_decay=True)
        return optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd)
    return optax.chain(*l2, optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=0.0), optax.scale(-lr))
