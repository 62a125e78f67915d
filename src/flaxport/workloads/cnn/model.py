"""The seed article's CNN in Flax, layer for layer with model_torch.CNN (same names).

conv1 3x3x32 (padding 1) -> bn1 -> relu -> max_pool 2 -> conv2 3x3x64 -> bn2 -> relu ->
max_pool 2 -> flatten -> fc1 256 -> relu -> fc2 10 -> log_softmax.
Input NHWC float in [0, 1]; the flatten is NHWC's (h, w, c) order, so fc1's kernel rows
are a permutation of torch's (convert.py does it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxport.nn import BatchNorm, Conv2d, Dense, max_pool2d


class CNN(nn.Module):
    conv_widths: tuple = (32, 64)
    hidden: int = 256
    num_classes: int = 10
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, images_nhwc, train: bool):
        """images_nhwc (N, H, W, C) float32 -> log-probabilities (N, num_classes)."""
        h = images_nhwc
        for i, width in enumerate(self.conv_widths, start=1):
            h = Conv2d(width, 3, padding=1, impl=self.conv_impl, name=f"conv{i}")(h)
            h = BatchNorm(momentum=self.bn_momentum, epsilon=self.bn_eps, name=f"bn{i}")(h, not train)
            h = max_pool2d(nn.relu(h), 2)
        h = h.reshape(h.shape[0], -1)
        h = nn.relu(Dense(self.hidden, name="fc1")(h))
        return jax.nn.log_softmax(Dense(self.num_classes, name="fc2")(h), axis=-1)


def cnn(config) -> CNN:
    return CNN(conv_widths=tuple(config.conv_widths), hidden=config.hidden, num_classes=config.num_classes,
               bn_eps=config.bn_eps, bn_momentum=config.bn_momentum, conv_impl=config.conv_impl)


def flat_geometry(config) -> tuple:
    """(channels, height, width) of the activation fc1 flattens."""
    side = config.image_size // 2 ** len(config.conv_widths)
    return config.conv_widths[-1], side, side


def flat_features(config) -> int:
    """fc1's input width: the last conv's channels times the pooled image area."""
    c, h, w = flat_geometry(config)
    return c * h * w


def train_flops(config) -> int:
    """Model FLOPs of one train step: 2 x multiply-adds of the convs and matmuls, forward
    plus backward (twice the forward: input and weight gradients), less conv1's input
    gradient, which nobody asks for. 1.22 GFLOP for the default config."""
    b, side, cin = config.batch_size, config.image_size, config.channels
    forward, first = 0, None
    for cout in config.conv_widths:
        layer = 2 * b * side * side * 9 * cin * cout  # 3x3, padding 1: output keeps the size
        first = layer if first is None else first
        forward += layer
        side, cin = side // 2, cout
    forward += 2 * b * (flat_features(config) * config.hidden + config.hidden * config.num_classes)
    return 3 * forward - first


def dummy_input(config, n: int = 1):
    return jnp.zeros((n, config.image_size, config.image_size, config.channels), jnp.float32)
