"""The DDIM pieces both twins share: diffusion schedule, embedding frequencies, sampling
times, learning-rate schedule. Imports neither torch nor jax at module level.

`diffusion_schedule` takes NumPy, JAX or torch arrays and answers in the same kind, so
the twins cannot drift apart in the one formula that defines the noise process.
"""
from __future__ import annotations

import math

import numpy as np


def _math(x):
    """The array namespace of x: torch, jax.numpy or numpy (for floats and NumPy arrays)."""
    module = type(x).__module__
    if module.startswith("torch"):
        import torch

        return torch
    if isinstance(x, (np.ndarray, np.generic, float, int)):
        return np
    import jax.numpy as jnp

    return jnp


def diffusion_schedule(diffusion_times, min_signal_rate: float, max_signal_rate: float):
    """keras's continuous cosine schedule: times in [0, 1] (any shape) -> (noise_rates, signal_rates).

    angle = acos(max_signal_rate) + t * (acos(min_signal_rate) - acos(max_signal_rate));
    signal = cos(angle), noise = sin(angle), so signal^2 + noise^2 = 1. The angles are
    Python floats: they enter the array's own dtype (float32 or float64) as constants.
    """
    xp = _math(diffusion_times)
    start_angle = math.acos(max_signal_rate)
    end_angle = math.acos(min_signal_rate)
    angles = start_angle + diffusion_times * (end_angle - start_angle)
    return xp.sin(angles), xp.cos(angles)


def embedding_angular_speeds(embedding_dims: int, min_frequency: float, max_frequency: float) -> np.ndarray:
    """2*pi*f for f = exp(linspace(log min, log max, dims // 2)): float64 (dims // 2,).

    keras's sinusoidal_embedding; each twin casts these constants to its dtype, so both
    embed with the same numbers.
    """
    frequencies = np.exp(np.linspace(math.log(min_frequency), math.log(max_frequency), embedding_dims // 2))
    return 2.0 * math.pi * frequencies


def sampling_times(diffusion_steps: int):
    """(times, next_times), float64 (steps,): keras's reverse diffusion visits t = 1 - k/steps
    and remixes at t - 1/steps (0 after the last step)."""
    step_size = 1.0 / diffusion_steps
    times = 1.0 - np.arange(diffusion_steps) * step_size
    return times, times - step_size


def learning_rate(config, step: int) -> float:
    """The learning rate of update number `step` (0-based), as optax's schedule gives it:
    constant, or warmup_cosine_decay_schedule(0, lr, warmup_steps, schedule_steps, 0)."""
    if config.lr_schedule == "constant":
        return config.lr
    if config.lr_schedule != "warmup_cosine":
        raise ValueError(f"lr_schedule {config.lr_schedule!r}: choose constant or warmup_cosine")
    check_schedule(config)
    if step < config.warmup_steps:
        return config.lr * step / config.warmup_steps
    decay = config.schedule_steps - config.warmup_steps
    progress = min(step - config.warmup_steps, decay) / decay
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


EMA_WARMUP_OFFSET = 10.0


def ema_decay(config, update):
    """The EMA decay of update number `update` (0-based; a Python int, or an integer JAX
    scalar inside a trace): config.ema, or with config.ema_warmup

        min(ema, (1 + update) / (10 + update))

    as TF's ExponentialMovingAverage(num_updates=) and diffusers' EMA warm it up. The EMA
    then averages roughly the last tenth of the run (0.1 at the first update, 0.9 at the
    81st, 0.99 at the 891st), so it forgets the random initialisation in a short run too;
    it reaches a decay of 0.999 after ~9,000 updates."""
    if not config.ema_warmup:
        return config.ema
    progress = (1.0 + update) / (EMA_WARMUP_OFFSET + update)
    return min(config.ema, progress) if isinstance(update, int) else _math(progress).minimum(config.ema, progress)


def check_schedule(config) -> None:
    if config.lr_schedule == "warmup_cosine" and config.schedule_steps <= config.warmup_steps:
        raise ValueError(f"lr_schedule warmup_cosine needs schedule_steps (total train steps, got "
                         f"{config.schedule_steps}) above warmup_steps ({config.warmup_steps})")
