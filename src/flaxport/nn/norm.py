"""LayerNorm and GroupNorm with torch.nn semantics, channels-last.

Two differences from `flax.linen.LayerNorm` / `GroupNorm` at their defaults:

* epsilon: torch uses 1e-5, Flax 1e-6. On rows whose variance is near eps (a
  near-constant feature vector) that changes the output by O(1).
* variance: computed two-pass, E[(x - mean)^2], as torch does; Flax's default
  `use_fast_variance=True` uses E[x^2] - E[x]^2, which cancels badly in float32 when
  the mean is large against the spread.

Param names are Flax's: `scale` (torch `weight`) and `bias`, both (C,).
flaxport.port maps them.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn
from jax import lax


def _normalize(x, axes, epsilon):
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = jnp.mean(jnp.square(centered), axis=axes, keepdims=True)
    return centered * lax.rsqrt(var + epsilon)


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm(C, eps, elementwise_affine, bias) over the last axis: x (..., C) -> (..., C).

    Only a 1-D normalized_shape (the last axis) is supported, as in most models.
    """

    epsilon: float = 1e-5
    use_scale: bool = True  # torch elementwise_affine
    use_bias: bool = True  # torch bias (and elementwise_affine)

    @nn.compact
    def __call__(self, x):
        c = x.shape[-1]
        y = _normalize(x, (-1,), self.epsilon)
        if self.use_scale:
            y = y * self.param("scale", nn.initializers.ones, (c,), jnp.float32)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
        return y


class GroupNorm(nn.Module):
    """torch.nn.GroupNorm(num_groups, C, eps, affine) on channels-last x (N, *spatial, C) -> same.

    Statistics per sample and group over the spatial axes and the C // num_groups
    channels of the group (torch's channels c*G//C belong to group c // (C // G)).
    """

    num_groups: int
    epsilon: float = 1e-5
    use_scale: bool = True  # torch affine
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        c, g = x.shape[-1], self.num_groups
        if c % g:
            raise ValueError(f"GroupNorm: {c} channels do not split into {g} groups")
        grouped = x.reshape(x.shape[:-1] + (g, c // g))
        axes = tuple(range(1, x.ndim - 1)) + (x.ndim,)  # spatial axes and within-group channels
        y = _normalize(grouped, axes, self.epsilon).reshape(x.shape)
        if self.use_scale:
            y = y * self.param("scale", nn.initializers.ones, (c,), jnp.float32)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (c,), jnp.float32)
        return y
