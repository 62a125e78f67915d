"""Convolutions on flaxport's native CPU kernels: torch's conv1d/conv2d in channels-last.

`convolution` takes torch's arguments (the weight in torch's layout) and picks the kernel:
a depthwise convolution (groups = input = output channels) runs on the depthwise kernel,
every other 1-D or 2-D one (any stride, dilation, padding, kernel size and group count) on
the dense one. `runs` says whether it can here: on a CPU, in float32, with the kernels
built. Generated model files (`translate`) call both; the workloads call `native_conv2d`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from flaxport import kernels
from flaxport.kernels.ffi_conv import HWIO, OIHW, dense, depthwise


def runs(x, weight, stride, padding, dilation, groups) -> bool:
    """Whether `convolution` runs this convolution on the kernels: 1-D or 2-D, float32 x and
    weight, on a CPU, with the kernels built (and padding of at least 0)."""
    n = weight.ndim - 2
    return (n in (1, 2) and x.dtype == jnp.float32 and weight.dtype == jnp.float32
            and all(p >= 0 for side in padding for p in side) and jax.default_backend() == "cpu"
            and kernels.available())


def convolution(x, weight, stride, padding, dilation, groups):
    """x (N, *S, C), weight (O, C/groups, *K) in torch's layout -> (N, *S', O), for 1 or 2 spatial axes.

    stride, dilation: one int per axis; padding: (low, high) per axis. Check `runs` first.
    """
    if weight.ndim == 3:  # 1-D: one row of a 2-D image
        y = convolution(x[:, None], weight[:, :, None], (1, *stride), [(0, 0), *padding], (1, *dilation), groups)
        return y[:, 0]
    stride, dilation, pads = tuple(stride), tuple(dilation), tuple(tuple(p) for p in padding)
    out_channels, group_in, kh, kw = weight.shape
    if groups == x.shape[-1] == out_channels and group_in == 1:
        return depthwise(x, weight[:, 0].transpose(1, 2, 0), pads, stride, dilation)  # (kh, kw, C)
    return dense(x, weight, pads, stride, dilation, groups, OIHW)


def supported(x_shape, kernel_shape, stride: int, padding: int, *dtypes) -> bool:
    """Whether native_conv2d can run this convolution: float32 x and kernel on a CPU, the kernels built."""
    return (all(jnp.dtype(d) == jnp.float32 for d in dtypes) and jax.default_backend() == "cpu"
            and kernels.available())


def native_conv2d(x, kernel, padding: int, stride: int = 1):
    """x (N, H, W, Cin), kernel (kh, kw, Cin, Cout) HWIO -> (N, Ho, Wo, Cout): torch's
    conv2d(stride, padding) in NHWC; check `supported` first."""
    pads = ((padding, padding), (padding, padding))
    return dense(x, kernel, pads, (stride, stride), (1, 1), 1, HWIO)
