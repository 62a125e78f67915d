"""Generator and Discriminator in Flax, layer for layer the PyTorch reference.

Submodule names are torch's `nn.Sequential` indices (net_0 = net.0, ...), so the key
map in convert.py is mechanical.
"""
from __future__ import annotations

from flax import linen as nn

from flaxport import nn as fpnn


class MLP(nn.Module):
    """(B, in) -> (B, 1): [Dense -> BatchNorm -> ReLU] per width, then Dense(1).

    Names follow torch's Sequential: Linear at 3k, BatchNorm at 3k+1 (ReLU at 3k+2).
    """

    widths: tuple
    bn_eps: float = 0.8
    bn_momentum: float = 0.1
    batchnorm: bool = True

    @nn.compact
    def __call__(self, x, train: bool):
        idx = 0
        for width in self.widths:
            x = fpnn.Dense(width, name=f"net_{idx}")(x)
            if self.batchnorm:
                x = fpnn.BatchNorm(momentum=self.bn_momentum, epsilon=self.bn_eps, name=f"net_{idx + 1}")(
                    x, use_running_average=not train
                )
                idx += 3
            else:
                idx += 2
            x = nn.relu(x)
        return fpnn.Dense(1, name=f"net_{idx}")(x)


def generator(config) -> MLP:
    return MLP(config.g_widths, config.bn_eps, config.bn_momentum)


def discriminator(config) -> MLP:
    return MLP(config.d_widths, config.bn_eps, config.bn_momentum, config.d_batchnorm)
