"""The PyTorch reference models of the seed article (imports torch; load lazily)."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """(B, in) -> (B, 1): [Linear -> BatchNorm1d(w, eps) -> ReLU] per width, then Linear(1)."""

    def __init__(self, in_features: int, widths, bn_eps=0.8, bn_momentum=0.1, batchnorm=True):
        super().__init__()
        layers = []
        for width in widths:
            layers.append(nn.Linear(in_features, width))
            if batchnorm:
                layers.append(nn.BatchNorm1d(width, bn_eps, bn_momentum))
            layers.append(nn.ReLU())
            in_features = width
        layers.append(nn.Linear(in_features, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def generator(config) -> MLP:
    return MLP(config.z_dim, config.g_widths, config.bn_eps, config.bn_momentum)


def discriminator(config) -> MLP:
    return MLP(1, config.d_widths, config.bn_eps, config.bn_momentum, config.d_batchnorm)
