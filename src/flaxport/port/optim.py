"""torch.optim optimizers (and their LR schedulers) as optax transformations that take the same steps.

The pitfalls (docs/porting.md, entries 13-15) each translation handles:

* SGD: weight_decay is an L2 term added to the gradient *before* momentum; torch's
  momentum buffer starts at the first gradient and nesterov adds momentum * buffer,
  which is `optax.trace(momentum, nesterov)`. dampening != 0 is not translated.
* Adam: weight_decay is L2 added to the gradient *before* the moments, i.e.
  chain(add_decayed_weights, scale_by_adam, scale_by_learning_rate), not optax.adamw.
* AdamW: decoupled, p -= lr * wd * p next to the Adam step, both from the old p:
  chain(scale_by_adam, add_decayed_weights, scale_by_learning_rate), optax.adamw's
  update. torch's default weight_decay is 0.01; optax's is 1e-4.
* RMSprop: alpha (optax `decay`, default 0.9 there, 0.99 in torch), eps added outside
  the square root (`eps_in_sqrt=False`), centered; torch's momentum buffer accumulates
  the *unscaled* step and lr multiplies it afterwards, so the trace comes before the
  learning rate (optax.rmsprop puts it after, which differs once lr changes).
* Adagrad: eps outside the square root (optax.adagrad: inside, 1e-7), the accumulator
  starts at torch's initial_accumulator_value (0; optax 0.1), lr / (1 + (t - 1) lr_decay).

A scheduler (StepLR, ExponentialLR, LinearLR, CosineAnnealingLR, OneCycleLR; schedules.py)
becomes the learning-rate schedule, and OneCycleLR's cycled momentum / beta1 a schedule
of the momentum through `optax.inject_hyperparams`. `optax_state_from_torch` carries a
torch optimizer's state (moments, step counts, the scheduler's count) into the optax
state, and `torch_moments` reads the moments back under torch's state names.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
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
    "adagrad": dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                    maximize=False),
}
# The optax optimizer closest to a torch one flaxport does not translate.
CLOSEST = {"nadam": "optax.nadam", "radam": "optax.radam", "adamax": "optax.adamax", "adadelta": "optax.adadelta",
           "rprop": "optax.rprop", "lbfgs": "optax.lbfgs", "asgd": "optax.sgd with an averaged copy of the params",
           "sparseadam": "optax.adam", "muon": "optax.contrib.muon", "adafactor": "optax.adafactor"}
# torch's state names of each optimizer's per-parameter tensors -> the optax state field holding them.
MOMENTS = {"sgd": {"momentum_buffer": "trace"}, "adam": {"exp_avg": "mu", "exp_avg_sq": "nu"},
           "adamw": {"exp_avg": "mu", "exp_avg_sq": "nu"},
           "rmsprop": {"square_avg": "nu", "grad_avg": "mu", "momentum_buffer": "trace"},
           "adagrad": {"sum": "sum"}}
# Group entries that choose an implementation, not the arithmetic, and those LR schedulers add.
_IGNORED = {"params", "foreach", "fused", "capturable", "differentiable", "name", "initial_lr", "max_lr", "min_lr",
            "max_momentum", "base_momentum"}


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


class ScaleByTorchAdagradState(NamedTuple):
    count: jax.Array  # steps taken, torch's state['step']
    sum: optax.Updates  # torch's state['sum']


def scale_by_torch_adagrad(eps: float = 1e-10, initial_accumulator_value: float = 0.0,
                           lr_decay: float = 0.0) -> optax.GradientTransformation:
    """torch.optim.Adagrad's step before the learning rate: g / (sqrt(sum) + eps) / (1 + t lr_decay)."""

    def init(params):
        return ScaleByTorchAdagradState(jnp.zeros([], jnp.int32),
                                        jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator_value), params))

    def update(updates, state, params=None):
        del params
        total = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        decay = 1.0 / (1.0 + state.count * lr_decay)
        updates = jax.tree.map(lambda s, g: g / (jnp.sqrt(s) + eps) * decay, total, updates)
        return updates, ScaleByTorchAdagradState(optax.safe_increment(state.count), total)

    return optax.GradientTransformation(init, update)


def _hyper(optimizer_or_spec) -> tuple[str, dict]:
    if isinstance(optimizer_or_spec, Mapping):
        spec = dict(optimizer_or_spec)
        name = str(spec.pop("name", spec.pop("type", ""))).lower()
    elif hasattr(optimizer_or_spec, "param_groups"):
        spec = spec_from_torch(optimizer_or_spec)
        name = spec.pop("name")
    else:
        raise UnsupportedOptimizerError(f"expected a torch optimizer or a spec dict, got {type(optimizer_or_spec)}")
    if name not in TORCH_DEFAULTS:
        closest = f"; the closest optax optimizer is {CLOSEST[name]}" if name in CLOSEST else ""
        raise UnsupportedOptimizerError(f"optimizer {name!r} is not translated (translated: "
                                        f"{', '.join(sorted(TORCH_DEFAULTS))}){closest}")
    if unknown := sorted(set(spec) - set(TORCH_DEFAULTS[name]) - _IGNORED):
        raise UnsupportedOptimizerError(f"{name} option {unknown[0]!r} is not translated")
    h = {**TORCH_DEFAULTS[name], **{k: v for k, v in spec.items() if k not in _IGNORED}}
    if h["maximize"]:
        raise UnsupportedOptimizerError(f"{name}(maximize=True) is not translated: negate the loss instead")
    return name, h


def _momentum_transform(factory, momentum_schedule, **kwargs):
    """factory(**kwargs), or with its momentum argument following `momentum_schedule`."""
    if momentum_schedule is None:
        return factory(**kwargs)
    return optax.inject_hyperparams(factory, static_args=("nesterov",))(**kwargs)


def optax_from_torch(optimizer_or_spec, scheduler=None) -> optax.GradientTransformation:
    """torch.optim.{SGD, Adam, AdamW, RMSprop, Adagrad} (an instance, or a spec such as
    {'name': 'adamw', 'lr': 1e-3}, torch's defaults filling the rest) -> optax transformation.

    scheduler: a torch LR scheduler attached to the optimizer (StepLR, ExponentialLR,
    LinearLR, CosineAnnealingLR, OneCycleLR): its learning rate (and OneCycleLR's
    momentum) as optax schedules; without one the optimizer's current lr is used.
    Raises UnsupportedOptimizerError for other optimizers (naming the closest optax one) and
    for options not translated (amsgrad, maximize, SGD dampening, differing param groups,
    unknown spec keys); UnsupportedSchedulerError for other schedulers.
    """
    from flaxport.port.schedules import schedules_from_torch

    name, h = _hyper(optimizer_or_spec)
    lr, mom_schedule = _float(h["lr"]), None
    if scheduler is not None:
        lr, mom_schedule, _ = schedules_from_torch(scheduler)
    wd = _float(h["weight_decay"])
    l2 = [optax.add_decayed_weights(wd)] if wd else []  # torch: grad = grad + wd * p, first
    scale_lr = optax.scale_by_learning_rate(lr)

    if name == "sgd":
        momentum = _float(h["momentum"])
        if _float(h["dampening"]):
            raise UnsupportedOptimizerError("SGD dampening != 0 is not translated (torch's first step skips it)")
        if h["nesterov"] and momentum <= 0:
            raise UnsupportedOptimizerError("SGD nesterov needs momentum > 0 (torch refuses it too)")
        trace = []
        if momentum or mom_schedule is not None:
            trace = [_momentum_transform(optax.trace, mom_schedule, decay=mom_schedule or momentum,
                                         nesterov=bool(h["nesterov"]))]
        return optax.chain(*l2, *trace, scale_lr)

    if name == "rmsprop":
        momentum = _float(h["momentum"])
        kw = dict(decay=_float(h["alpha"]), eps=_float(h["eps"]), initial_scale=0.0, eps_in_sqrt=False)
        scale = optax.scale_by_stddev(**kw) if h["centered"] else optax.scale_by_rms(**kw)
        trace = []
        if momentum or mom_schedule is not None:
            trace = [_momentum_transform(optax.trace, mom_schedule, decay=mom_schedule or momentum, nesterov=False)]
        return optax.chain(*l2, scale, *trace, scale_lr)

    if name == "adagrad":
        return optax.chain(*l2, scale_by_torch_adagrad(_float(h["eps"]), _float(h["initial_accumulator_value"]),
                                                       _float(h["lr_decay"])), scale_lr)

    # adam / adamw
    if h["amsgrad"]:
        raise UnsupportedOptimizerError(f"{name}(amsgrad=True) is not translated; the closest optax optimizer is "
                                        "optax.amsgrad (check its eps placement against torch's)")
    b1, b2 = (_float(b) for b in h["betas"])
    adam = _momentum_transform(optax.scale_by_adam, mom_schedule, b1=mom_schedule or b1, b2=b2, eps=_float(h["eps"]),
                               eps_root=0.0)
    if h["decoupled_weight_decay"]:  # AdamW, or Adam(decoupled_weight_decay=True): optax.adamw's chain
        return optax.chain(adam, *([optax.add_decayed_weights(wd)] if wd else []), scale_lr)
    return optax.chain(*l2, adam, scale_lr)


# --------------------------------------------------------------------------- optimizer state
def _map_states(state, fn):
    """Rebuild an optax state tree, replacing every NamedTuple node n by fn(n) (inner nodes first)."""
    if isinstance(state, tuple) and hasattr(state, "_fields"):
        new = type(state)(*(_map_states(v, fn) for v in state))
        return fn(new)
    if isinstance(state, (tuple, list)):
        return type(state)(_map_states(v, fn) for v in state)
    if isinstance(state, dict):
        return {k: _map_states(v, fn) for k, v in state.items()}
    return state


def _schedule_counted(node) -> bool:
    """A state whose count follows the LR scheduler (not the optimizer's own step)."""
    return type(node).__name__ in ("ScaleByScheduleState", "InjectStatefulHyperparamsState", "InjectHyperparamsState",
                                   "WrappedScheduleState")


def optax_state_from_torch(tx, torch_optimizer, torch_module, params, to_flax, scheduler=None):
    """The optax state of `tx` (optax_from_torch's) holding what `torch_optimizer` holds now.

    torch_module: the module whose parameters the optimizer updates (for their names).
    params: the Flax parameter tree the state is for. to_flax: {torch parameter name:
    array} (every parameter of torch_module) -> a tree shaped like `params` (the key map's
    params_to_flax, or a translation's conversion). Moments (exp_avg, momentum_buffer, ...)
    and the step count come from the torch optimizer's state (zeros for a parameter
    without state); the schedules' count from the scheduler's last_epoch. A torch
    optimizer that has not stepped gives tx.init(params) with that count.
    """
    import torch

    name, _ = _hyper(torch_optimizer)
    state = tx.init(params)
    names = {id(p): n for n, p in torch_module.named_parameters()}
    per_param = {names[id(p)]: s for p, s in torch_optimizer.state.items() if id(p) in names and s}
    count = int(scheduler.last_epoch) if scheduler is not None else None
    steps = {int(_float(s["step"])) for s in per_param.values() if "step" in s}
    if len(steps) > 1:
        raise UnsupportedOptimizerError(f"the torch optimizer's parameters have taken different numbers of steps "
                                        f"({sorted(steps)}): its state cannot be carried as one optax state")
    step = steps.pop() if steps else None
    fields = {}
    for torch_key, field in MOMENTS[name].items():
        have = {n: s[torch_key] for n, s in per_param.items() if isinstance(s.get(torch_key), torch.Tensor)}
        if have:
            fields[field] = to_flax({n: _np(have[n]) if n in have else np.zeros(tuple(p.shape), _np(p).dtype)
                                     for n, p in torch_module.named_parameters()})

    def fill(node):
        if _schedule_counted(node):
            return node._replace(count=jnp.asarray(count, node.count.dtype)) if count is not None else node
        updates = {f: jax.tree.map(lambda old, new: jnp.asarray(new, old.dtype), getattr(node, f), v)
                   for f, v in fields.items() if f in node._fields}
        if "count" in node._fields and step is not None:
            updates["count"] = jnp.asarray(step, node.count.dtype)
        return node._replace(**updates) if updates else node

    return _map_states(state, fill)


def optimizer_name(optimizer_or_spec) -> str:
    """'adam', 'sgd', ... of a torch optimizer or spec (the key of MOMENTS); raises for untranslated ones."""
    return _hyper(optimizer_or_spec)[0]


def torch_moments(name: str, opt_state) -> dict:
    """{torch state name ('exp_avg', ...): the optax state's tree of it} for optimizer `name`."""
    found: dict = {}
    fields = {f: k for k, f in MOMENTS[name].items()}

    def visit(node):
        for f, k in fields.items():
            if f in getattr(node, "_fields", ()) and not _schedule_counted(node):
                found.setdefault(k, getattr(node, f))
        return node

    _map_states(opt_state, visit)
    return found


def _np(t):
    return t.detach().cpu().numpy().copy()
