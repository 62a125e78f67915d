"""Dense with torch.nn.Linear's default initialisation.

torch initialises Linear with kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(fan_in),
1/sqrt(fan_in)) for the weight and the same bound for the bias; Flax's Dense uses
lecun_normal and a zero bias. Twins that must learn alike start from the same law.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


def torch_kernel_init(key, shape, dtype=jnp.float32):
    """Kernel (fan_in, ..., fan_out) ~ U(+-1/sqrt(fan_in)); fan_in = prod(shape[:-1])."""
    fan_in = math.prod(shape[:-1])
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def torch_bias_init(fan_in: int):
    """Bias ~ U(+-1/sqrt(fan_in)); returns an initializer."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class Dense(nn.Module):
    """y = x @ kernel + bias; x (..., fan_in) -> (..., features). kernel is torch's weight.T."""

    features: int
    use_bias: bool = True

    @nn.compact
    def __call__(self, x):
        fan_in = x.shape[-1]
        kernel = self.param("kernel", torch_kernel_init, (fan_in, self.features))
        y = jnp.dot(x, kernel)
        if self.use_bias:
            y = y + self.param("bias", torch_bias_init(fan_in), (self.features,))
        return y
