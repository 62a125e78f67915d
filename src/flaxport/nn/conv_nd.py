"""Conv1d / Conv3d (and any rank) with torch.nn semantics, channels-last.

The same three differences from `flax.linen.Conv` as conv.py's Conv2d (padding is
torch's symmetric number, torch's uniform init, kernel layout), for 1 to 3 spatial
axes, plus stride, dilation and groups per torch:

  torch weight (O, I/groups, *k)  ->  kernel (*k, I/groups, O) = weight.permute(2, ..., 1, 0)
"""
from __future__ import annotations

import math

from flax import linen as nn
from jax import lax

from flaxport.nn.linear import torch_bias_init, torch_kernel_init

SPATIAL = {1: "W", 2: "HW", 3: "DHW"}


def dimension_numbers(ndim: int):
    """('NWC', 'WIO', 'NWC') for ndim=1, ('NHWC', 'HWIO', 'NHWC'), ('NDHWC', 'DHWIO', 'NDHWC')."""
    s = SPATIAL[ndim]
    return ("N" + s + "C", s + "IO", "N" + s + "C")


def as_tuple(v, n: int, what: str) -> tuple:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n:
        raise ValueError(f"{what}={v!r} does not fit {n} spatial axes")
    return t


class ConvNd(nn.Module):
    """torch.nn.Conv{ndim}d(cin, features, kernel_size, stride, padding, dilation, groups, bias).

    x (N, *spatial, cin) -> (N, *out, features); params kernel (*k, cin/groups, features), bias (features,).
    """

    features: int
    kernel_size: int | tuple = 3
    stride: int | tuple = 1
    padding: int | tuple = 0
    dilation: int | tuple = 1
    groups: int = 1
    use_bias: bool = True
    ndim: int = 2

    @nn.compact
    def __call__(self, x):
        n = self.ndim
        if x.ndim != n + 2:
            raise ValueError(f"Conv{n}d expects (N, *{n} spatial, C) input, got shape {x.shape}")
        k = as_tuple(self.kernel_size, n, "kernel_size")
        cin = x.shape[-1]
        if cin % self.groups or self.features % self.groups:
            raise ValueError(f"Conv{n}d groups={self.groups} must divide {cin} in and {self.features} out channels")
        kernel = self.param("kernel", torch_kernel_init, k + (cin // self.groups, self.features))
        y = lax.conv_general_dilated(
            x, kernel, as_tuple(self.stride, n, "stride"), [(p, p) for p in as_tuple(self.padding, n, "padding")],
            rhs_dilation=as_tuple(self.dilation, n, "dilation"), dimension_numbers=dimension_numbers(n),
            feature_group_count=self.groups)
        if self.use_bias:
            y = y + self.param("bias", torch_bias_init(math.prod(k) * cin // self.groups), (self.features,))
        return y


class Conv1d(ConvNd):
    """torch.nn.Conv1d on (N, L, C) input; kernel (k, cin/groups, features)."""

    ndim: int = 1


class Conv3d(ConvNd):
    """torch.nn.Conv3d on (N, D, H, W, C) input; kernel (kd, kh, kw, cin/groups, features)."""

    ndim: int = 3
