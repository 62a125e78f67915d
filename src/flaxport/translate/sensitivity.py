"""How far torch's own float64 results move when its inputs change in the 14th digit.

Some models are so ill-conditioned on their example inputs that rounding decides their outputs:
a train-mode BatchNorm normalising over 2 values per channel (a batch of 2 at 1x1 pixels, late in
an EfficientNet) divides by the difference of two nearly equal numbers, and stacked a few times
turns a 1e-16 change into one of 1e-3. Two correct implementations that round differently then
disagree by that much, in float64 too. The proof asks torch the same question it asks the
translation: run again, 3 times, on inputs each moved by up to 1e-14 of itself (fixed patterns
of signs and sizes, so the runs repeat), from the same state and with the same random draws. A
translation that differs from torch by no more than twice the most torch differs from itself
there is as right as rounding allows; its row says so, with the figure.
"""
from __future__ import annotations

import numpy as np

from flaxport.translate.copies import PARAMETERS, copy_as

NUDGE = 1e-14  # ~50 float64 ulps: more than the rounding two implementations disagree by
RUNS = 3  # nudges with different patterns: torch's spread is the largest move among them
# The translation's rounding is one more such nudge: in a model this chaotic its move is the same
# size as torch's own, give or take a factor (regnet_x_400mf in train mode at 32 px: up to 1.3x)
MARGIN = 2.0


def nudged(value, seed: int = 0):
    """`value` with every floating-point tensor x in it replaced by x * (1 + NUDGE * u), u uniform
    in [-1, 1] per element (drawn from NumPy with `seed`, not from torch's generator)."""
    import torch
    from torch.utils import _pytree

    rng = np.random.default_rng(seed)

    def nudge(leaf):
        if torch.is_tensor(leaf) and leaf.is_floating_point():
            u = torch.from_numpy(rng.uniform(-1.0, 1.0, tuple(leaf.shape))).to(leaf.dtype)
            return leaf * (1 + NUDGE * u)
        return leaf

    return _pytree.tree_map(nudge, value)


def torch_spread(module, state: dict, args, kwargs, rng_state, run, outputs: dict, buffers: dict) -> dict:
    """How far torch's own results move: a copy of `module` with `state` (its buffers before the
    forward being compared) run RUNS times on inputs nudged each time with another pattern, the
    generator reset to `rng_state` every time so it draws what the first run drew.
    `run(module, args, kwargs)` does the forward as the first run did (its contexts) and returns its
    outputs as NumPy arrays, in the order of `outputs` ({row name: torch's array}); `buffers`:
    {state_dict name: torch's array after the first run}. -> {name: the largest move of the runs}."""
    import torch

    moved = dict.fromkeys([*outputs, *buffers], 0.0)
    saved = torch.get_rng_state()
    twin = copy_as(module, share=(PARAMETERS,))  # one copy, its buffers reset before each run
    try:
        for seed in range(RUNS):
            twin.load_state_dict(state, strict=False)  # the buffers: what a forward changes
            torch.set_rng_state(rng_state)
            nudged_args, nudged_kwargs = nudged((list(args), dict(kwargs)), seed)
            out = run(twin, nudged_args, nudged_kwargs)
            after = twin.state_dict()
            for (name, want), got in zip(outputs.items(), out):
                moved[name] = max(moved[name], spread(want, got))
            for name, want in buffers.items():
                moved[name] = max(moved[name], spread(want, after[name].detach().numpy()))
    finally:
        torch.set_rng_state(saved)
    return moved


def spread(a, b) -> float:
    """max |a - b| over the finite places of both (0.0 when there are none)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return 0.0
    both = np.isfinite(a) & np.isfinite(b)
    return float(np.abs(a - b)[both].max()) if both.any() else 0.0
