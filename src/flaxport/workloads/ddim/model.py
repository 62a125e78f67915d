"""keras-io DDIM's residual UNet in Flax (NHWC), layer for layer with model_torch.UNet.

Inputs: noisy images (N, H, W, 3) and their noise variances (N, 1, 1, 1). The variance
gets a sinusoidal embedding (N, 1, 1, 32), repeated over the image (keras's nearest
UpSampling2D by the image size) and concatenated after `stem`, a 1x1 conv to widths[0].
Then for each width but the last a down stage `down{i}_{j}` (block_depth residual blocks,
each output kept as a skip, 2x2 average pool); `mid{j}` residual blocks at the last
width; up stages `up{i}_{j}` (bilinear x2 upsampling, then per block: concatenate the
skip, residual block); `head`, a zero-initialised 1x1 conv to 3 channels (the predicted
noise). i is the width's index, so down{i} and up{i} work at the same resolution.

Residual block: [1x1 conv `shortcut` if the width changes] + (BatchNorm without scale and
offset `norm` -> 3x3 conv `conv1` -> swish -> 3x3 conv `conv2`).
Convs use keras's init (glorot_uniform kernel, zero bias), not torch's.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from flaxport.nn import BatchNorm, conv2d
from flaxport.workloads.ddim.schedule import embedding_angular_speeds


class Conv(nn.Module):
    """keras Conv2D(features, k, padding='same') on NHWC: kernel (k, k, cin, features), bias."""

    features: int
    kernel_size: int = 1
    zero_init: bool = False  # keras kernel_initializer="zeros" (the head)
    impl: str = "native"

    @nn.compact
    def __call__(self, x):
        k = self.kernel_size
        init = nn.initializers.zeros if self.zero_init else nn.initializers.glorot_uniform()
        kernel = self.param("kernel", init, (k, k, x.shape[-1], self.features))
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        y = conv2d(x, kernel.astype(x.dtype), padding=k // 2, impl=self.impl, fallback="xla")  # xla: config.py
        return y + bias.astype(x.dtype)


def average_pool2x(x_nhwc):
    """keras AveragePooling2D(2) = torch avg_pool2d(2): (N, H, W, C) -> (N, H/2, W/2, C)."""
    n, h, w, c = x_nhwc.shape
    return x_nhwc.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


def _upsample_axis(x, axis: int):
    """Bilinear x2 along `axis` with half-pixel centres: output 2i sits at source i - 1/4,
    2i+1 at i + 1/4, so they are 0.75 x[i] + 0.25 x[i-1] and 0.75 x[i] + 0.25 x[i+1],
    with the index clamped at the borders (torch/TF clamp the source coordinate)."""
    n = x.shape[axis]
    take = lambda a, b: lax.slice_in_dim(x, a, b, axis=axis)  # noqa: E731  (static: no gather)
    prev = jnp.concatenate([take(0, 1), take(0, n - 1)], axis=axis)
    nxt = jnp.concatenate([take(1, n), take(n - 1, n)], axis=axis)
    even = 0.75 * x + 0.25 * prev
    odd = 0.75 * x + 0.25 * nxt
    out = jnp.stack([even, odd], axis=axis + 1)
    return out.reshape(x.shape[:axis] + (2 * n,) + x.shape[axis + 1:])


def upsample_bilinear2x(x_nhwc):
    """keras UpSampling2D(2, 'bilinear') = torch interpolate(scale_factor=2, mode='bilinear',
    align_corners=False) = jax.image.resize(..., 'bilinear'): (N, H, W, C) -> (N, 2H, 2W, C).

    Written out (separable, two taps per axis) rather than jax.image.resize, which builds
    dense (H, 2H) weight matrices; tests check all three agree."""
    return _upsample_axis(_upsample_axis(x_nhwc, 1), 2)


def sinusoidal_embedding(noise_variances, angular_speeds):
    """(N, 1, 1, 1) variances -> (N, 1, 1, D): concat[sin(2 pi f x), cos(2 pi f x)]."""
    angles = noise_variances * jnp.asarray(angular_speeds, noise_variances.dtype)
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class ResidualBlock(nn.Module):
    width: int
    bn_momentum: float = 0.01
    bn_eps: float = 1e-3
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, x, train: bool):
        """x (N, H, W, Cin) -> (N, H, W, width)."""
        if x.shape[-1] == self.width:
            residual = x
        else:
            residual = Conv(self.width, 1, impl=self.conv_impl, name="shortcut")(x)
        h = BatchNorm(momentum=self.bn_momentum, epsilon=self.bn_eps, use_scale=False, use_bias=False,
                      name="norm")(x, not train)
        h = nn.swish(Conv(self.width, 3, impl=self.conv_impl, name="conv1")(h))
        h = Conv(self.width, 3, impl=self.conv_impl, name="conv2")(h)
        return h + residual


class UNet(nn.Module):
    widths: tuple = (32, 64, 96, 128)
    block_depth: int = 2
    embedding_dims: int = 32
    embedding_min_frequency: float = 1.0
    embedding_max_frequency: float = 1000.0
    channels: int = 3
    bn_momentum: float = 0.01
    bn_eps: float = 1e-3
    conv_impl: str = "native"

    @nn.compact
    def __call__(self, noisy_images_nhwc, noise_variances, train: bool):
        """noisy images (N, H, W, C), noise variances (N, 1, 1, 1) -> predicted noise (N, H, W, C).

        H and W must be divisible by 2 ** (len(widths) - 1)."""
        n, h, w, _ = noisy_images_nhwc.shape
        speeds = embedding_angular_speeds(self.embedding_dims, self.embedding_min_frequency,
                                          self.embedding_max_frequency)
        e = sinusoidal_embedding(noise_variances.astype(noisy_images_nhwc.dtype), speeds)
        e = jnp.broadcast_to(e, (n, h, w, e.shape[-1]))
        x = Conv(self.widths[0], 1, impl=self.conv_impl, name="stem")(noisy_images_nhwc)
        x = jnp.concatenate([x, e], axis=-1)

        block = lambda width, name: ResidualBlock(width, self.bn_momentum, self.bn_eps,  # noqa: E731
                                                  self.conv_impl, name=name)
        skips = []
        for i, width in enumerate(self.widths[:-1]):
            for j in range(self.block_depth):
                x = block(width, f"down{i}_{j}")(x, train)
                skips.append(x)
            x = average_pool2x(x)
        for j in range(self.block_depth):
            x = block(self.widths[-1], f"mid{j}")(x, train)
        for i in reversed(range(len(self.widths) - 1)):
            x = upsample_bilinear2x(x)
            for j in range(self.block_depth):
                x = jnp.concatenate([x, skips.pop()], axis=-1)
                x = block(self.widths[i], f"up{i}_{j}")(x, train)
        return Conv(self.channels, 1, zero_init=True, impl=self.conv_impl, name="head")(x)


def unet(config) -> UNet:
    return UNet(widths=tuple(config.widths), block_depth=config.block_depth, embedding_dims=config.embedding_dims,
                embedding_min_frequency=config.embedding_min_frequency,
                embedding_max_frequency=config.embedding_max_frequency, channels=config.channels,
                bn_momentum=config.bn_momentum, bn_eps=config.bn_eps, conv_impl=config.conv_impl)


def block_names(config) -> list:
    """[(name, input channels, width)] of every residual block, in forward order."""
    out, cin, skips = [], config.widths[0] + config.embedding_dims, []
    for i, width in enumerate(config.widths[:-1]):
        for j in range(config.block_depth):
            out.append((f"down{i}_{j}", cin, width))
            cin = width
            skips.append(width)
    for j in range(config.block_depth):
        out.append((f"mid{j}", cin, config.widths[-1]))
        cin = config.widths[-1]
    for i in reversed(range(len(config.widths) - 1)):
        for j in range(config.block_depth):
            out.append((f"up{i}_{j}", cin + skips.pop(), config.widths[i]))
            cin = config.widths[i]
    return out


def dummy_inputs(config, n: int = 2):
    side = config.image_size
    return jnp.zeros((n, side, side, config.channels), jnp.float32), jnp.zeros((n, 1, 1, 1), jnp.float32)


def train_flops(config) -> int:
    """Model FLOPs of one train step: 2 x multiply-adds of every conv, forward plus backward
    (twice the forward: input and weight gradients) less stem's input gradient, which
    nobody asks for. Pools, upsampling, norms and the optimizer are left out (a few %).
    110 GFLOP for the bench config, 32x32 at batch 64 (keras-io: 64x64, 438)."""
    b, side, levels = config.batch_size, config.image_size, len(config.widths) - 1
    conv = lambda s, k, cin, cout: 2 * b * s * s * k * k * cin * cout  # noqa: E731  ('same' padding)
    stem = conv(side, 1, config.channels, config.widths[0])
    forward = stem + conv(side, 1, config.widths[0], config.channels)  # stem, head
    for name, cin, width in block_names(config):
        level = levels if name.startswith("mid") else int(name[len("down" if name.startswith("down") else "up")])
        s = side >> level
        forward += conv(s, 3, cin, width) + conv(s, 3, width, width) + (conv(s, 1, cin, width) if cin != width else 0)
    return 3 * forward - stem
