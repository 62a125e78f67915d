"""BatchNorm with torch.nn.BatchNorm1d/2d semantics, in Flax.

Stock `flax.linen.BatchNorm` differs from torch in two ways that break step-for-step
parity (see docs and ../shared/notes/porting-pitfalls.md):

* momentum: torch blends `running = (1 - m) * running + m * batch` with m=0.1; Flax
  uses `m * running + (1 - m) * batch` with m=0.99. Here `momentum` is torch's number.
* running variance: torch stores the *unbiased* batch variance (times n/(n-1)) in the
  running average but normalises with the *biased* one; Flax stores the biased one.
  At batch 10 that is an 11% gap in eval-mode variance.

The train-mode normalisation and its gradient are flaxport.runtime's `batch_norm_train`, the one a
translated model runs.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from flax import linen as nn
from jax import lax

# torch's closed-form gradient (two reductions per channel), the same function the translated files carry
from flaxport.runtime.functions import batch_norm_train


class BatchNorm(nn.Module):
    """Normalise over every axis but the last (features): (N, C) or NHWC (N, H, W, C).

    Attributes:
      use_running_average: eval mode (running statistics) when True.
      momentum: torch convention, the weight of the *new* batch (torch default 0.1).
      epsilon: added to the variance (torch default 1e-5; `BatchNorm1d(64, 0.8)` is 0.8).
      use_scale, use_bias: torch's `affine`.

    Params `scale`, `bias` (C,); batch_stats `mean`, `var` (C,) start at 0 and 1 as in
    torch. torch's `num_batches_tracked` is not kept: it only matters for momentum=None.
    """

    use_running_average: Optional[bool] = None
    momentum: float = 0.1
    epsilon: float = 1e-5
    use_scale: bool = True
    use_bias: bool = True

    @nn.compact
    def __call__(self, x, use_running_average: Optional[bool] = None):
        use_ra = nn.merge_param("use_running_average", self.use_running_average, use_running_average)
        features = x.shape[-1]
        ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32)
        ra_var = self.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32)

        scale = (self.param("scale", nn.initializers.ones, (features,), jnp.float32) if self.use_scale
                 else jnp.ones((features,), x.dtype))
        bias = (self.param("bias", nn.initializers.zeros, (features,), jnp.float32) if self.use_bias
                else jnp.zeros((features,), x.dtype))
        if use_ra:
            return (x - ra_mean.value) * lax.rsqrt(ra_var.value + self.epsilon) * scale + bias
        n = x.size // features
        if n < 2:
            raise ValueError(f"BatchNorm in train mode needs more than 1 value per channel, got {x.shape}")
        y, mean, var = batch_norm_train(x, scale, bias, self.epsilon)
        if not self.is_initializing():
            m = self.momentum
            mean, var = lax.stop_gradient(mean), lax.stop_gradient(var)
            ra_mean.value = (1.0 - m) * ra_mean.value + m * mean
            ra_var.value = (1.0 - m) * ra_var.value + m * var * (n / (n - 1))
        return y
