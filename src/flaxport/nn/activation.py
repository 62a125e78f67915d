"""GELU with torch's default (exact, erf-based), in Flax.

`flax.linen.gelu` / `jax.nn.gelu` default to the tanh approximation; torch's
`nn.GELU()` is exact (`approximate='none'`). The two differ by up to ~5e-4, enough to
fail a layer-by-layer parity check (docs: porting pitfalls, GELU).
"""
from __future__ import annotations

import jax
from flax import linen as nn


def _is_approximate(approximate) -> bool:
    if approximate in ("none", False, None):
        return False
    if approximate in ("tanh", True):
        return True
    raise ValueError(f"GELU approximate={approximate!r}: use 'none' (torch's default, exact) or 'tanh'")


def gelu(x, approximate="none"):
    """torch.nn.functional.gelu(x, approximate=...): 'none' (exact erf form) or 'tanh'; any shape."""
    return jax.nn.gelu(x, approximate=_is_approximate(approximate))


class GELU(nn.Module):
    """torch.nn.GELU as a module (so a parity report can name it); x (...) -> (...)."""

    approximate: str = "none"

    def __call__(self, x):
        return gelu(x, self.approximate)
