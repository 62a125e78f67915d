"""A torch LR scheduler (an object, already attached to its optimizer) as links to the schedule
functions of port/schedules.py: one learning-rate link per param group, the cycled momentum's
where OneCycleLR / CyclicLR cycle it, and the count torch is at. Built for check_step, written
out in train_step.py."""
from __future__ import annotations

import dataclasses

from flaxport.port.optimizers.chains import Expr, Link
from flaxport.port.schedules import MULTIPLICATIVE, REFUSED, TRANSLATED, UnsupportedSchedulerError


@dataclasses.dataclass
class ScheduleLinks:
    lr: list  # a Link per param group
    momentum: list | None  # a Link per param group, or None
    count: int  # the scheduler's last_epoch: the count the optax state starts from
    lambdas: dict = dataclasses.field(default_factory=dict)  # name -> lambdas.Translated, for LambdaLR
    text: str = ""  # the scheduler, e.g. "OneCycleLR(max_lr=0.1, total_steps=100)"


def _f(v) -> float:
    return float(v.item() if hasattr(v, "item") else v)


def from_torch(scheduler) -> ScheduleLinks:
    """The links of a torch scheduler; UnsupportedSchedulerError (one line, saying why) otherwise."""
    name = type(scheduler).__name__
    if name in REFUSED:
        raise UnsupportedSchedulerError(f"torch scheduler {name} is not translated: {REFUSED[name]}")
    if name not in TRANSLATED:
        raise UnsupportedSchedulerError(f"torch scheduler {name} is not translated (translated: "
                                        f"{', '.join(TRANSLATED)})")
    lambdas: dict = {}
    groups = scheduler.optimizer.param_groups
    lr = [_lr_link(scheduler, i, lambdas) for i in range(len(groups))]
    momentum = None
    if name == "OneCycleLR" and scheduler.cycle_momentum:
        momentum = [_one_cycle(scheduler, g, "max_momentum", "base_momentum", "max_momentum") for g in groups]
    elif name == "CyclicLR" and scheduler.cycle_momentum:
        momentum = [_cyclic(scheduler, mx, base) for base, mx in zip(scheduler.base_momentums,
                                                                     scheduler.max_momentums)]
    count = scheduler._schedulers[0].last_epoch if name == "ChainedScheduler" else scheduler.last_epoch
    return ScheduleLinks(lr, momentum, int(count), lambdas, describe(scheduler))


def describe(scheduler) -> str:
    name = type(scheduler).__name__
    if name in ("SequentialLR", "ChainedScheduler"):
        return f"{name}({', '.join(describe(s) for s in scheduler._schedulers)})"
    return name


def _lr_link(s, group: int, lambdas: dict) -> Link:
    name = type(s).__name__
    base = _f(s.base_lrs[group]) if hasattr(s, "base_lrs") else None
    if name == "StepLR":
        return Link("step_lr", (("base_lr", base), ("step_size", int(s.step_size)), ("gamma", _f(s.gamma))))
    if name == "MultiStepLR":
        return Link("multi_step_lr", (("base_lr", base), ("milestones", tuple(sorted(s.milestones.elements()))),
                                      ("gamma", _f(s.gamma))))
    if name == "ConstantLR":
        return Link("constant_lr", (("base_lr", base), ("factor", _f(s.factor)), ("total_iters", int(s.total_iters))))
    if name == "LinearLR":
        return Link("linear_lr", (("base_lr", base), ("start_factor", _f(s.start_factor)),
                                  ("end_factor", _f(s.end_factor)), ("total_iters", int(s.total_iters))))
    if name == "ExponentialLR":
        return Link("exponential_lr", (("base_lr", base), ("gamma", _f(s.gamma))))
    if name == "PolynomialLR":
        return Link("polynomial_lr", (("base_lr", base), ("total_iters", int(s.total_iters)), ("power", _f(s.power))))
    if name == "CosineAnnealingLR":
        return Link("cosine_annealing_lr", (("base_lr", base), ("T_max", int(s.T_max)), ("eta_min", _f(s.eta_min))))
    if name == "CosineAnnealingWarmRestarts":
        return Link("cosine_annealing_warm_restarts", (("base_lr", base), ("T_0", int(s.T_0)),
                                                       ("T_mult", int(s.T_mult)), ("eta_min", _f(s.eta_min))))
    if name == "OneCycleLR":
        return _one_cycle(s, s.optimizer.param_groups[group], "initial_lr", "max_lr", "min_lr")
    if name == "CyclicLR":
        return _cyclic(s, s.base_lrs[group], s.max_lrs[group])
    if name == "LambdaLR":
        from flaxport.port.optimizers.lambdas import translate_lambda

        fn = s.lr_lambdas[group]
        found = next((n for n, t in lambdas.items() if t.fn is fn), None)
        if found is None:
            found = "lr_lambda" if not lambdas else f"lr_lambda{len(lambdas) + 1}"
            lambdas[found] = fn.translate(found) if hasattr(fn, "translate") else translate_lambda(fn, found)
        return Link("lambda_lr", (("base_lr", base), ("lr_lambda", Expr(found))))
    if name == "SequentialLR":
        inner = [_lr_link(c, group, lambdas) for c in s._schedulers]
        return Link("sequential", (("schedules", inner), ("milestones", tuple(int(m) for m in s._milestones))))
    # ChainedScheduler: the rates multiply where each scheduler multiplies the rate
    for c in s._schedulers:
        kind = type(c).__name__
        if kind not in MULTIPLICATIVE and not (kind == "CosineAnnealingLR" and _f(c.eta_min) == 0.0):
            raise UnsupportedSchedulerError(f"ChainedScheduler of {kind}: only schedulers that multiply the rate "
                                            f"chain as a product ({', '.join(MULTIPLICATIVE)}, CosineAnnealingLR "
                                            "with eta_min=0)")
    inner = [_lr_link(c, group, lambdas) for c in s._schedulers]
    return Link("chained", (("base_lr", _f(s._schedulers[0].base_lrs[group])), ("schedules", inner)))


def _one_cycle(s, group, low, peak, final) -> Link:
    phases = s._schedule_phases
    total = int(s.total_steps)
    pct = (float(phases[0]["end_step"]) + 1) / total
    return Link("one_cycle", (("total_steps", total), ("low", _f(group[low])), ("peak", _f(group[peak])),
                              ("final", _f(group[final])), ("pct_start", pct),
                              ("anneal_strategy", getattr(s, "_anneal_func_type", "cos")),
                              ("three_phase", len(phases) == 3)))


def _cyclic(s, low, peak) -> Link:
    if getattr(s, "_scale_fn_custom", None) is not None:
        raise UnsupportedSchedulerError("CyclicLR with a scale_fn of your own is not translated: name a mode "
                                        "(triangular, triangular2, exp_range)")
    up = round(float(s.total_size) * float(s.step_ratio))
    return Link("cyclic", (("total_steps_up", up), ("total_steps_down", int(round(s.total_size)) - up),
                           ("low", _f(low)), ("peak", _f(peak)), ("mode", s.mode), ("gamma", _f(s.gamma))))


def functions(links) -> list:
    """The schedules.py functions a list of links calls (nested ones too), in first-use order."""
    names: list = []

    def visit(v):
        if isinstance(v, Link):
            if v.fn not in names:
                names.append(v.fn)
            for _, value in v.kwargs:
                visit(value)
        elif isinstance(v, (list, tuple)):
            for e in v:
                visit(e)

    visit(list(links))
    return names


def build(link: Link, lambdas: dict | None = None):
    """The schedule function of `link` (schedules.py's functions; Exprs name `lambdas`' JAX functions)."""
    from flaxport.port import schedules

    def value(v):
        if isinstance(v, Link):
            return build(v, lambdas)
        if isinstance(v, Expr):
            return lambdas[str(v)].jax
        if isinstance(v, list):
            return [value(e) for e in v]
        return v

    return getattr(schedules, link.fn)(**{k: value(v) for k, v in link.kwargs})


def schedules_from_torch(scheduler) -> tuple:
    """A torch LR scheduler -> (lr schedule, momentum schedule or None, its count now), for its
    first param group (`from_torch` has every group's).

    The momentum schedule is OneCycleLR's / CyclicLR's cycled momentum (SGD/RMSprop
    `momentum`, Adam's beta1); count is the scheduler's `last_epoch` (0 right after
    construction), the count the optax state starts from to continue where torch is.
    Raises UnsupportedSchedulerError, saying why, for the others.
    """
    links = from_torch(scheduler)
    lr = build(links.lr[0], links.lambdas)
    momentum = build(links.momentum[0], links.lambdas) if links.momentum else None
    return lr, momentum, links.count
