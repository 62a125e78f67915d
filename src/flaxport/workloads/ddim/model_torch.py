"""The PyTorch twin of model.UNet (NCHW): the same layers, names and order.

keras's init (xavier/glorot uniform kernels, zero biases, zero head kernel) replaces
torch's default, so a fresh torch UNet starts from the same law as the Flax one.
BatchNorm2d(affine=False, momentum=0.01, eps=1e-3) is keras's
BatchNormalization(center=False, scale=False) with its momentum 0.99 and epsilon.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from flaxport.workloads.ddim.model import block_names
from flaxport.workloads.ddim.schedule import embedding_angular_speeds


def keras_conv(cin: int, cout: int, kernel_size: int, zero: bool = False) -> nn.Conv2d:
    """Conv2D(cout, k, padding='same') with keras's init."""
    conv = nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2)
    nn.init.zeros_(conv.weight) if zero else nn.init.xavier_uniform_(conv.weight)
    nn.init.zeros_(conv.bias)
    return conv


class ResidualBlock(nn.Module):
    def __init__(self, cin: int, width: int, config):
        super().__init__()
        if cin != width:
            self.shortcut = keras_conv(cin, width, 1)
        self.norm = nn.BatchNorm2d(cin, eps=config.bn_eps, momentum=config.bn_momentum, affine=False)
        self.conv1 = keras_conv(cin, width, 3)
        self.conv2 = keras_conv(width, width, 3)

    def forward(self, x):
        """x (N, Cin, H, W) -> (N, width, H, W)."""
        residual = self.shortcut(x) if hasattr(self, "shortcut") else x
        h = self.norm(x)
        h = F.silu(self.conv1(h))
        h = self.conv2(h)
        return h + residual


class UNet(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.widths, self.depth = tuple(config.widths), config.block_depth
        speeds = embedding_angular_speeds(config.embedding_dims, config.embedding_min_frequency,
                                          config.embedding_max_frequency)
        # A float64 constant, cast to the input's dtype in forward as the Flax twin does: a
        # float32 buffer would stay rounded after .double() (angles reach 2000 pi, so the
        # rounding moves a float64 embedding by ~1e-4). Not state: no state_dict key.
        self.angular_speeds = speeds.reshape(1, -1, 1, 1)
        self.stem = keras_conv(config.channels, config.widths[0], 1)
        for name, cin, width in block_names(config):
            self.add_module(name, ResidualBlock(cin, width, config))
        self.head = keras_conv(config.widths[0], config.channels, 1, zero=True)

    def forward(self, noisy_images, noise_variances):
        """noisy images (N, C, H, W), noise variances (N, 1, 1, 1) -> predicted noise (N, C, H, W)."""
        n, _, h, w = noisy_images.shape
        speeds = torch.as_tensor(self.angular_speeds, dtype=noise_variances.dtype, device=noise_variances.device)
        angles = noise_variances * speeds  # (N, D/2, 1, 1)
        e = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
        e = e.expand(n, e.shape[1], h, w)  # keras UpSampling2D(size=image_size, "nearest")
        x = torch.cat([self.stem(noisy_images), e], dim=1)
        skips = []
        for i in range(len(self.widths) - 1):
            for j in range(self.depth):
                x = getattr(self, f"down{i}_{j}")(x)
                skips.append(x)
            x = F.avg_pool2d(x, 2)
        for j in range(self.depth):
            x = getattr(self, f"mid{j}")(x)
        for i in reversed(range(len(self.widths) - 1)):
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            for j in range(self.depth):
                x = torch.cat([x, skips.pop()], dim=1)
                x = getattr(self, f"up{i}_{j}")(x)
        return self.head(x)
