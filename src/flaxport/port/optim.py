"""torch.optim optimizers (and their LR schedulers) as optax transformations that take the same steps.

Every torch.optim optimizer but LBFGS and SparseAdam (refused, saying why) has a chain
(optimizers/chains.py; the transformations optax lacks in optimizers/transforms.py). The
pitfalls (docs/porting.md, entries 13-15) those chains handle include:

* SGD: weight_decay is an L2 term added to the gradient *before* momentum; torch's
  momentum buffer starts at the first gradient (undampened) and nesterov adds momentum *
  buffer, which is `optax.trace(momentum, nesterov)` without dampening.
* Adam: weight_decay is L2 added to the gradient *before* the moments, i.e.
  chain(add_decayed_weights, scale_by_adam, scale_by_learning_rate), not optax.adamw;
  amsgrad keeps the largest *raw* second moment (optax's amsgrad, the bias-corrected one).
* AdamW: decoupled, p -= lr * wd * p next to the Adam step, both from the old p:
  chain(scale_by_adam, add_decayed_weights, scale_by_learning_rate), optax.adamw's
  update. torch's default weight_decay is 0.01; optax's is 1e-4.
* RMSprop: alpha (optax `decay`, default 0.9 there, 0.99 in torch), eps added outside
  the square root (`eps_in_sqrt=False`), centered; torch's momentum buffer accumulates
  the *unscaled* step and lr multiplies it afterwards, so the trace comes before the
  learning rate (optax.rmsprop puts it after, which differs once lr changes).
* Adagrad: eps outside the square root (optax.adagrad: inside, 1e-7), the accumulator
  starts at torch's initial_accumulator_value (0; optax 0.1), lr / (1 + (t - 1) lr_decay).
* NAdam, RAdam: torch's momentum schedule and eps placement (optax.nadam / radam differ);
  ASGD, Rprop, Adafactor, Muon compute the learning rate into their update.

A scheduler (schedules.py) becomes the learning-rate schedule, and OneCycleLR's cycled
momentum / beta1 a schedule of the momentum through `optax.inject_hyperparams`.
`optax_state_from_torch` carries a torch optimizer's state (moments, step counts, the
scheduler's count) into the optax state, and `torch_moments` reads the moments back
under torch's state names.
"""
from __future__ import annotations

from collections.abc import Mapping
import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxport.port.optimizers import chains
from flaxport.port.optimizers.chains import IGNORED, MOMENTS, SCALARS, TORCH_DEFAULTS, UnsupportedOptimizerError
from flaxport.port.optimizers.transforms import ScaleByTorchAdagradState, scale_by_torch_adagrad


# The optax optimizer closest to a torch one flaxport does not translate.
CLOSEST = {"lbfgs": "optax.lbfgs", "sparseadam": "optax.adam"}


def spec_from_torch(torch_optimizer) -> dict:
    """A torch optimizer -> {'name': 'adam', 'lr': ..., ...} (its one set of hyperparameters).

    Raises UnsupportedOptimizerError for several param groups with different settings.
    """
    name = type(torch_optimizer).__name__.lower()
    groups = torch_optimizer.param_groups
    hyper = {k: v for k, v in groups[0].items() if k not in IGNORED}
    for i, g in enumerate(groups[1:], start=1):
        other = {k: v for k, v in g.items() if k not in IGNORED}
        if other != hyper:
            diff = sorted(k for k in set(hyper) | set(other) if hyper.get(k) != other.get(k))
            raise UnsupportedOptimizerError(
                f"{type(torch_optimizer).__name__} param group {i} differs from group 0 in {diff}: pass "
                "param_labels (a tree like the parameters holding each one's group index)")
    return {"name": name, **hyper}


def _float(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def _hyper(optimizer_or_spec) -> tuple[str, dict]:
    if isinstance(optimizer_or_spec, Mapping):
        spec = dict(optimizer_or_spec)
        name = str(spec.pop("name", spec.pop("type", ""))).lower()
    elif hasattr(optimizer_or_spec, "param_groups"):
        spec = spec_from_torch(optimizer_or_spec)
        name = spec.pop("name")
    else:
        raise UnsupportedOptimizerError(f"expected a torch optimizer or a spec dict, got {type(optimizer_or_spec)}")
    return name, chains.hyper(name, spec)


def group_hypers(torch_optimizer) -> list:
    """Each param group's hyperparameters (torch's defaults filled in), in group order."""
    name = type(torch_optimizer).__name__.lower()
    return [chains.hyper(name, {k: v for k, v in g.items() if k not in IGNORED})
            for g in torch_optimizer.param_groups]


def optax_from_torch(optimizer_or_spec, scheduler=None, param_labels=None,
                     scheduler_every: int = 1) -> optax.GradientTransformation:
    """A torch.optim optimizer (an instance, or a spec such as {'name': 'adamw', 'lr': 1e-3},
    torch's defaults filling the rest) -> the optax transformation that takes its steps
    (chains.py: every torch.optim optimizer but LBFGS and SparseAdam).

    scheduler: a torch LR scheduler attached to the optimizer (schedules.py): its learning
    rate (and OneCycleLR's / CyclicLR's momentum) as optax schedules; without one the
    optimizer's current lr is used. param_labels: for an optimizer whose param groups differ,
    a tree like the parameters holding each one's group index: the groups' chains become one
    optax.multi_transform. scheduler_every: optimizer steps per scheduler.step() (torch code
    that steps the scheduler once an epoch: the steps of an epoch). Raises
    UnsupportedOptimizerError for LBFGS / SparseAdam (saying
    why), unknown spec keys and differing groups without labels; UnsupportedSchedulerError
    for schedulers that are not a function of the step count.
    """
    if hasattr(optimizer_or_spec, "param_groups") and len(optimizer_or_spec.param_groups) > 1:
        hypers = group_hypers(optimizer_or_spec)
        if any(h != hypers[0] for h in hypers[1:]) or (scheduler is not None and len(
                {float(b) for b in getattr(scheduler, "base_lrs", [0])}) > 1):
            if param_labels is None:
                spec_from_torch(optimizer_or_spec)  # its one line: the groups differ
            return _groups(optimizer_or_spec, hypers, scheduler, param_labels, scheduler_every)
    name, h = _hyper(optimizer_or_spec)
    lr, mom_schedule = _float(h["lr"]), None
    if scheduler is not None:
        lr, mom_schedule = learning_rates(scheduler, scheduler_every)[0]
    momentum = chains.Expr("momentum") if mom_schedule is not None else None
    chain = chains.links(name, h, chains.Expr("learning_rate"), momentum)
    return chains.build(chain, {"learning_rate": lr, "momentum": mom_schedule})


def _every(schedule, steps: int):
    from flaxport.port.schedules import every

    return every(schedule, steps) if schedule is not None and steps > 1 else schedule


def learning_rates(scheduler, scheduler_every: int = 1) -> list:
    """[(learning rate schedule, momentum schedule or None)] per param group of a torch scheduler's
    optimizer, as functions of the optimizer step count (what the optax chains are built with)."""
    from flaxport.port.optimizers import schedule_links

    links = schedule_links.from_torch(scheduler)
    out = []
    for i, link in enumerate(links.lr):
        mom = schedule_links.build(links.momentum[i], links.lambdas) if links.momentum else None
        out.append((_every(schedule_links.build(link, links.lambdas), scheduler_every), _every(mom, scheduler_every)))
    return out


def _groups(opt, hypers, scheduler, param_labels, scheduler_every):
    name = type(opt).__name__.lower()
    rates = learning_rates(scheduler, scheduler_every) if scheduler is not None else None
    transforms = {}
    for i, h in enumerate(hypers):
        lr, mom = rates[i] if rates else (_float(h["lr"]), None)
        chain = chains.links(name, h, chains.Expr("learning_rate"), chains.Expr("momentum") if mom else None)
        transforms[i] = chains.build(chain, {"learning_rate": lr, "momentum": mom})
    return optax.multi_transform(transforms, param_labels)


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


def optax_state_from_torch(tx, torch_optimizer, torch_module, params, to_flax, scheduler=None,
                           scheduler_every: int = 1):
    """The optax state of `tx` (optax_from_torch's) holding what `torch_optimizer` holds now.

    torch_module: the module whose parameters the optimizer updates (for their names).
    params: the Flax parameter tree the state is for. to_flax: {torch parameter name:
    array} (every parameter of torch_module) -> a tree shaped like `params` (the key map's
    params_to_flax, or a translation's conversion). Moments (exp_avg, momentum_buffer, ...)
    and the step count come from the torch optimizer's state (zeros for a parameter
    without state); the schedules' count from the scheduler's last_epoch. A torch
    optimizer that has not stepped gives tx.init(params) with that count (times
    scheduler_every: the schedules count optimizer steps).
    """
    import torch

    name = optimizer_name(torch_optimizer)
    state = tx.init(params)
    names = {id(p): n for n, p in torch_module.named_parameters()}
    per_param = {names[id(p)]: s for p, s in torch_optimizer.state.items() if id(p) in names and s}
    count = None
    if scheduler is not None:
        from flaxport.port.optimizers import schedule_links

        count = schedule_links.from_torch(scheduler).count * int(scheduler_every)
    steps = {int(_float(s["step"])) for s in per_param.values() if "step" in s}
    if len(steps) > 1:
        raise UnsupportedOptimizerError(f"the torch optimizer's parameters have taken different numbers of steps "
                                        f"({sorted(steps)}): its state cannot be carried as one optax state")
    step = steps.pop() if steps else None
    fields = {}
    first = next(iter(per_param.values()), {})
    scalars = {field: _np(first[k]) for k, field in SCALARS.get(name, {}).items() if k in first}
    for torch_key, field in MOMENTS[name].items():
        have = {n: s[torch_key] for n, s in per_param.items() if isinstance(s.get(torch_key), torch.Tensor)}
        if have:
            fields[field] = to_flax({n: _np(have[n]) if n in have else np.zeros(tuple(p.shape), _np(p).dtype)
                                     for n, p in torch_module.named_parameters()})

    def fill(node):
        if _schedule_counted(node):
            return node._replace(count=jnp.asarray(count, node.count.dtype)) if count is not None else node
        updates = {f: _fill_like(getattr(node, f), v) for f, v in fields.items() if f in node._fields}
        updates.update({f: jnp.asarray(v, getattr(node, f).dtype) for f, v in scalars.items() if f in node._fields})
        if "count" in node._fields and step is not None:
            updates["count"] = jnp.asarray(step, node.count.dtype)
        elif "count" in node._fields and updates:  # torch keeps no step here (SGD, Muon): it has stepped
            updates["count"] = jnp.asarray(count if count is not None else 1, node.count.dtype)
        return node._replace(**updates) if updates else node

    return _map_states(state, fill)


def _masked(x) -> bool:
    return isinstance(x, optax.MaskedNode)


def _fill_like(old, new):
    """`new` (a full parameter tree) cast into `old`'s leaves; where a param group's state holds
    optax.MaskedNode (a parameter of another group), it stays."""
    leaves, tree = jax.tree_util.tree_flatten(old, is_leaf=_masked)
    values = jax.tree.leaves(new)
    return jax.tree_util.tree_unflatten(tree, [o if _masked(o) else jnp.asarray(v, o.dtype)
                                               for o, v in zip(leaves, values)])


def optimizer_name(optimizer_or_spec) -> str:
    """'adam', 'sgd', ... of a torch optimizer or spec (the key of MOMENTS); raises for untranslated ones."""
    if hasattr(optimizer_or_spec, "param_groups"):
        name = type(optimizer_or_spec).__name__.lower()
        chains.defaults(name)
        return name
    return _hyper(optimizer_or_spec)[0]


def torch_moments(name: str, opt_state) -> dict:
    """{torch state name ('exp_avg', ...): the optax state's tree of it} for optimizer `name`;
    the param groups' states (optax.multi_transform's) merged into one tree."""
    found: dict = {}
    fields = {f: k for k, f in MOMENTS[name].items()}

    def visit(node):
        for f, k in fields.items():
            if f in getattr(node, "_fields", ()) and not _schedule_counted(node):
                found.setdefault(k, []).append(getattr(node, f))
        return node

    _map_states(opt_state, visit)
    return {k: _merge(trees) for k, trees in found.items()}


def _merge(trees):
    """One tree from param groups' trees, each holding MaskedNode where another group's parameter is."""
    flat = [jax.tree_util.tree_flatten(t, is_leaf=_masked) for t in trees]
    merged = [next((leaves[i] for leaves, _ in flat if not _masked(leaves[i])), flat[0][0][i])
              for i in range(len(flat[0][0]))]
    return jax.tree_util.tree_unflatten(flat[0][1], merged)


def _np(t):
    return t.detach().cpu().numpy().copy()
