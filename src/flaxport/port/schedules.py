"""torch.optim.lr_scheduler schedulers as optax schedules (functions of the step count).

A torch scheduler rewrites `group['lr']` (and, for OneCycleLR, the momentum or Adam's
beta1) after every `optimizer.step()`; optimizer step k (counting from 0) runs with the
value the scheduler computed at its `last_epoch == k`. An optax schedule is that value as
a function of k, so `schedule(k)` here is torch's value at `last_epoch == k`:

  StepLR(step_size, gamma)           base * gamma ** (k // step_size)      optax.exponential_decay(staircase)
  ExponentialLR(gamma)               base * gamma ** k                     optax.exponential_decay
  LinearLR(start, end, total_iters)  base * (start + (end - start) * min(k, T) / T)   optax.linear_schedule
  CosineAnnealingLR(T_max, eta_min)  eta_min + (base - eta_min) * (1 + cos(pi k / T)) / 2, for every k
  OneCycleLR(max_lr, total_steps, pct_start, anneal_strategy, div_factor, final_div_factor, three_phase)
                                     torch's phases: ends at pct_start * T - 1 (and 2 pct_start T - 2), T - 1

torch computes most of these recursively (lr times a factor each step), the closed forms
agree with it to rounding (float64: ~1e-16 relative). Two differ from the optax built-in
of the same name and are written out here: optax.cosine_decay_schedule stays at eta_min
after T_max where torch's cosine comes back up, and optax.cosine_onecycle_schedule puts its
phase boundaries one step later than torch (int(pct_start * T) instead of pct_start * T - 1).
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import optax

from flaxport.errors import UserError


class UnsupportedSchedulerError(UserError):
    """A torch LR scheduler with no faithful optax translation here."""


# The optax counterpart to reach for when a scheduler is not translated.
CLOSEST = {
    "MultiStepLR": "optax.piecewise_constant_schedule(lr, {milestone: gamma, ...})",
    "ConstantLR": "optax.piecewise_constant_schedule(lr * factor, {total_iters: 1 / factor})",
    "PolynomialLR": "optax.polynomial_schedule",
    "CosineAnnealingWarmRestarts": "optax.sgdr_schedule",
    "CyclicLR": "optax.join_schedules of two optax.linear_schedule",
    "SequentialLR": "optax.join_schedules",
    "ChainedScheduler": "a product of optax schedules",
    "LambdaLR": "a Python function of the step count (an optax schedule)",
    "MultiplicativeLR": "a Python function of the step count (an optax schedule)",
    "ReduceLROnPlateau": "optax.contrib.reduce_on_plateau (it reads the loss, not the step)",
}
TRANSLATED = ("StepLR", "ExponentialLR", "LinearLR", "CosineAnnealingLR", "OneCycleLR")


def _groups_agree(scheduler, attr_values: list, what: str):
    if len(set(attr_values)) > 1:
        raise UnsupportedSchedulerError(
            f"{type(scheduler).__name__} gives the param groups different {what}: translate each group with "
            "optax_from_torch({...spec...}, ...) and combine them with optax.multi_transform")
    return attr_values[0]


def schedules_from_torch(scheduler) -> tuple:
    """A torch LR scheduler -> (lr schedule, momentum schedule or None, its count now).

    The momentum schedule is OneCycleLR's cycled momentum (SGD/RMSprop `momentum`, Adam's
    beta1) when `cycle_momentum`; count is the scheduler's `last_epoch` (0 right after
    construction), the count the optax state starts from to continue where torch is.
    Raises UnsupportedSchedulerError naming the closest optax schedule for others.
    """
    name = type(scheduler).__name__
    if name not in TRANSLATED:
        closest = CLOSEST.get(name, "a Python function of the step count (an optax schedule)")
        raise UnsupportedSchedulerError(f"torch scheduler {name} is not translated (translated: "
                                        f"{', '.join(TRANSLATED)}); the closest optax one is {closest}")
    groups = scheduler.optimizer.param_groups
    base = _groups_agree(scheduler, [float(b) for b in scheduler.base_lrs], "base learning rates")
    count = int(scheduler.last_epoch)
    momentum = None
    if name == "StepLR":
        lr = optax.exponential_decay(base, transition_steps=int(scheduler.step_size),
                                     decay_rate=float(scheduler.gamma), staircase=True)
    elif name == "ExponentialLR":
        lr = optax.exponential_decay(base, transition_steps=1, decay_rate=float(scheduler.gamma))
    elif name == "LinearLR":
        start, end, total = float(scheduler.start_factor), float(scheduler.end_factor), int(scheduler.total_iters)
        lr = optax.linear_schedule(base * start, base * end, transition_steps=total)
    elif name == "CosineAnnealingLR":
        lr = _cosine(base, float(scheduler.eta_min), int(scheduler.T_max))
    else:
        lr, momentum = _one_cycle(scheduler, groups)
    return _float_count(lr), (_float_count(momentum) if momentum is not None else None), count


def _float_count(schedule):
    """The schedule with its (int32) count as the default float type, so that it computes in
    float64 under jax x64: optax's schedules otherwise work in float32 and round the rate."""

    def at(count):
        return schedule(jnp.asarray(count, jnp.result_type(float)))

    return at


def _cosine(base: float, eta_min: float, t_max: int):
    def schedule(count):
        return eta_min + (base - eta_min) * (1 + jnp.cos(math.pi * count / t_max)) / 2

    return schedule


def _anneal(strategy: str, start, end, pct):
    if strategy == "cos":
        return end + (start - end) / 2.0 * (jnp.cos(math.pi * pct) + 1)
    return (end - start) * pct + start


def _one_cycle(scheduler, groups) -> tuple:
    """torch's OneCycleLR phases as (lr schedule, momentum schedule or None)."""
    g = {k: _groups_agree(scheduler, [float(grp[k]) for grp in groups], k)
         for k in ("initial_lr", "max_lr", "min_lr")}
    cycle = bool(scheduler.cycle_momentum)
    if cycle:
        g.update({k: _groups_agree(scheduler, [float(grp[k]) for grp in groups], k)
                  for k in ("max_momentum", "base_momentum")})
    phases = [(float(p["end_step"]), p["start_lr"], p["end_lr"], p["start_momentum"], p["end_momentum"])
              for p in scheduler._schedule_phases]
    strategy = getattr(scheduler, "_anneal_func_type", "cos")
    total = int(scheduler.total_steps)

    def value(count, which):
        # torch walks the phases and takes the first whose end_step >= step (the last one otherwise).
        out, start = None, 0.0
        for i, (end, lr0, lr1, m0, m1) in enumerate(phases):
            a, b = (lr0, lr1) if which == "lr" else (m0, m1)
            v = _anneal(strategy, g[a], g[b], (count - start) / (end - start))
            inside = count <= end if i < len(phases) - 1 else True
            out = v if out is None else jnp.where(done, out, v)
            done = inside if i == 0 else jnp.logical_or(done, inside)
            start = end
        return out

    def lr(count):
        return value(jnp.minimum(count, total), "lr")

    def momentum(count):
        return value(jnp.minimum(count, total), "momentum")

    return lr, (momentum if cycle else None)
