"""torch.optim.lr_scheduler schedulers as optax schedules (functions of the step count).

A torch scheduler rewrites `group['lr']` (and, for OneCycleLR / CyclicLR, the momentum or
Adam's beta1) at every `scheduler.step()`; optimizer step k (counting from 0) runs with the
value the scheduler computed at its `last_epoch == k`. An optax schedule is that value as
a function of k, so `schedule(k)` here is torch's value at `last_epoch == k`. Each function
below builds one from torch's arguments; they are self-contained (jnp and math only) so
train_step.py carries the source of those it uses:

  StepLR, MultiStepLR, ConstantLR, LinearLR, ExponentialLR, PolynomialLR  base x a factor of k
  CosineAnnealingLR        eta_min + (base - eta_min) (1 + cos(pi k / T_max)) / 2 (back up after T_max)
  CosineAnnealingWarmRestarts  the cosine restarting at T_0, T_0 (1 + T_mult), ...
  OneCycleLR, CyclicLR     torch's phases (and their momentum, reversed)
  SequentialLR             each scheduler from 0 at its milestone; ChainedScheduler: factors multiplied
  LambdaLR                 base x the lambda, translated from its Python source (lambdas.py)

torch computes most of these recursively (lr times a factor each step); the closed forms
agree with it to rounding (float64: ~1e-16 relative). Two differ from the optax built-in
of the same name: optax.cosine_decay_schedule stays at eta_min after T_max where torch's
cosine comes back up, and optax.cosine_onecycle_schedule puts its phase boundaries one step
later than torch (int(pct_start * T) instead of pct_start * T - 1). ReduceLROnPlateau reads
a metric, not the step count, and MultiplicativeLR a product of a function's values: both
are refused in one line.
"""
from __future__ import annotations

import math

import jax.numpy as jnp

from flaxport.errors import UserError


class UnsupportedSchedulerError(UserError):
    """A torch LR scheduler with no faithful optax translation here."""


REFUSED = {
    "ReduceLROnPlateau": "it lowers the rate when a metric the loop passes to step(metric) stops improving, not as a "
                         "function of the step count; the closest optax one is optax.contrib.reduce_on_plateau, "
                         "which reads the loss",
    "MultiplicativeLR": "it multiplies the rate by lr_lambda(k) at every step, a running product; write the product "
                        "out as a LambdaLR",
}
# kept for callers that name the closest optax counterpart
CLOSEST = {"ReduceLROnPlateau": "optax.contrib.reduce_on_plateau (it reads the loss, not the step)",
           "MultiplicativeLR": "a Python function of the step count (an optax schedule)"}
TRANSLATED = ("StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR", "CosineAnnealingLR",
              "CosineAnnealingWarmRestarts", "OneCycleLR", "CyclicLR", "SequentialLR", "ChainedScheduler", "LambdaLR")
MULTIPLICATIVE = ("StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR", "PolynomialLR", "LambdaLR")


# --------------------------------------------------------------------------- the schedules
def as_steps(count):
    """The step count as the default float type (float64 under jax x64: the rate is not rounded)."""
    return jnp.asarray(count, jnp.result_type(float))


def step_lr(base_lr, step_size, gamma=0.1):
    """torch's StepLR: base_lr * gamma ** (k // step_size)."""
    return lambda count: base_lr * gamma ** jnp.floor(as_steps(count) / step_size)


def multi_step_lr(base_lr, milestones, gamma=0.1):
    """torch's MultiStepLR: base_lr * gamma ** (the milestones passed, counted with repeats)."""
    return lambda count: base_lr * gamma ** sum(jnp.where(as_steps(count) >= m, 1.0, 0.0) for m in milestones)


def constant_lr(base_lr, factor=1.0 / 3, total_iters=5):
    """torch's ConstantLR: base_lr * factor before total_iters, base_lr after."""
    return lambda count: base_lr * jnp.where(as_steps(count) < total_iters, factor, 1.0)


def linear_lr(base_lr, start_factor=1.0 / 3, end_factor=1.0, total_iters=5):
    """torch's LinearLR: the factor moves linearly from start_factor to end_factor over total_iters."""
    return lambda count: base_lr * (start_factor + (end_factor - start_factor)
                                    * jnp.minimum(as_steps(count), total_iters) / total_iters)


def exponential_lr(base_lr, gamma):
    """torch's ExponentialLR: base_lr * gamma ** k."""
    return lambda count: base_lr * gamma ** as_steps(count)


def polynomial_lr(base_lr, total_iters=5, power=1.0):
    """torch's PolynomialLR: base_lr * (1 - min(k, total_iters) / total_iters) ** power."""
    return lambda count: base_lr * (1.0 - jnp.minimum(as_steps(count), total_iters) / total_iters) ** power


def cosine_annealing_lr(base_lr, T_max, eta_min=0.0):
    """torch's CosineAnnealingLR: half a cosine from base_lr to eta_min over T_max steps, and on
    (torch's cosine comes back up after T_max; optax.cosine_decay_schedule stays down)."""
    return lambda count: eta_min + (base_lr - eta_min) * (1 + jnp.cos(math.pi * as_steps(count) / T_max)) / 2


def cosine_annealing_warm_restarts(base_lr, T_0, T_mult=1, eta_min=0.0):
    """torch's CosineAnnealingWarmRestarts: the cosine restarts after T_0, T_0 T_mult, ... steps."""

    def schedule(count):
        t = as_steps(count)
        if T_mult == 1:
            done, period = jnp.floor(t / T_0) * T_0, T_0
        else:  # cycles of T_0 T_mult^n: n from the logarithm, corrected where it rounds across a restart
            n = jnp.floor(jnp.log(t / T_0 * (T_mult - 1) + 1) / math.log(T_mult))
            n = n - jnp.where(T_0 * (T_mult**n - 1) / (T_mult - 1) > t, 1, 0)
            n = n + jnp.where(T_0 * (T_mult ** (n + 1) - 1) / (T_mult - 1) <= t, 1, 0)
            done, period = T_0 * (T_mult**n - 1) / (T_mult - 1), T_0 * T_mult**n
        return eta_min + (base_lr - eta_min) * (1 + jnp.cos(math.pi * (t - done) / period)) / 2

    return schedule


def anneal(strategy, start, end, pct):
    if strategy == "cos":
        return end + (start - end) / 2.0 * (jnp.cos(math.pi * pct) + 1)
    return (end - start) * pct + start


def one_cycle(total_steps, low, peak, final, pct_start=0.3, anneal_strategy="cos", three_phase=False):
    """torch's OneCycleLR: low -> peak by step pct_start T - 1, then -> final at T - 1 (three_phase:
    -> low again by 2 pct_start T - 2 first). The rate is (max_lr / div_factor, max_lr, that /
    final_div_factor); the cycled momentum (max_momentum, base_momentum, max_momentum)."""
    if three_phase:
        phases = [(float(pct_start * total_steps) - 1, low, peak),
                  (float(2 * pct_start * total_steps) - 2, peak, low), (total_steps - 1.0, low, final)]
    else:
        phases = [(float(pct_start * total_steps) - 1, low, peak), (total_steps - 1.0, peak, final)]

    def schedule(count):
        t = jnp.minimum(as_steps(count), total_steps)
        # torch takes the first phase whose end_step >= t (the last one past them all)
        value, start, chosen = 0.0, 0.0, False
        for i, (end, a, b) in enumerate(phases):
            inside = t <= end if i < len(phases) - 1 else True
            value = jnp.where(chosen, value, anneal(anneal_strategy, a, b, (t - start) / (end - start)))
            chosen = jnp.logical_or(chosen, inside)
            start = end
        return value

    return schedule


def cyclic(total_steps_up, total_steps_down, low, peak, mode="triangular", gamma=1.0):
    """torch's CyclicLR: low -> peak over step_size_up steps and back over step_size_down, the
    height scaled by mode (triangular: 1, triangular2: halved each cycle, exp_range: gamma ** k).
    The cycled momentum is the same with (max_momentum, base_momentum)."""
    size = total_steps_up + total_steps_down
    ratio = total_steps_up / size

    def schedule(count):
        t = as_steps(count)
        cycle = jnp.floor(1 + t / size)
        x = 1.0 + t / size - cycle
        scale = jnp.where(x <= ratio, x / ratio, (x - 1) / (ratio - 1))
        if mode == "triangular2":
            scale = scale / 2.0 ** (cycle - 1)
        elif mode == "exp_range":
            scale = scale * gamma**t
        return low + (peak - low) * scale

    return schedule


def sequential(schedules, milestones):
    """torch's SequentialLR: schedules[i] from step milestones[i - 1], counting from 0 there."""

    def schedule(count):
        t = as_steps(count)
        value = schedules[0](t)
        for start, later in zip(milestones, schedules[1:]):
            value = jnp.where(t >= start, later(t - start), value)
        return value

    return schedule


def chained(base_lr, schedules):
    """torch's ChainedScheduler of schedulers that multiply the rate: base_lr times each one's factor."""

    def schedule(count):
        value = base_lr
        for s in schedules:
            value = value * (s(count) / base_lr)
        return value

    return schedule


def lambda_lr(base_lr, lr_lambda):
    """torch's LambdaLR: base_lr * lr_lambda(k), the lambda translated to JAX."""
    return lambda count: base_lr * lr_lambda(as_steps(count))


def every(schedule, steps):
    """A schedule torch steps once every `steps` optimizer steps (scheduler.step() once an epoch)."""
    return lambda count: schedule(jnp.floor_divide(count, steps))
