"""Convolutions on flaxport's native CPU kernels: torch's conv1d/conv2d in channels-last.

`convolution` takes torch's arguments (the weight in torch's layout) and picks the kernel:
a depthwise convolution (groups = input = output channels) runs on the depthwise kernel, one
whose window is its whole input is XLA's matrix product, every other 1-D or 2-D one (any
stride, dilation, padding, kernel size and group count) on the dense kernel. `runs` says
whether it can here: on a CPU, in float32 or bfloat16, with the kernels built. Generated model
files (`translate`) call both; the workloads call `native_conv2d`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from flaxport import kernels
from flaxport.kernels.ffi_conv import HWIO, OIHW, dense, depthwise


def runs(x, weight, stride, padding, dilation, groups) -> bool:
    """Whether `convolution` runs this convolution on the kernels: 1-D or 2-D, x and weight both
    float32 or both bfloat16, on a CPU, with the kernels built (and padding of at least 0)."""
    n = weight.ndim - 2
    return (n in (1, 2) and x.dtype == weight.dtype and x.dtype in (jnp.float32, jnp.bfloat16)
            and all(p >= 0 for side in padding for p in side) and jax.default_backend() == "cpu"
            and kernels.available())


def convolution(x, weight, stride, padding, dilation, groups):
    """x (N, *S, C), weight (O, C/groups, *K) in torch's layout -> (N, *S', O), for 1 or 2 spatial axes.

    stride, dilation: one int per axis; padding: (low, high) per axis. Check `runs` first.
    """
    if x.dtype == jnp.bfloat16:
        # A product of two bfloat16 values is exact in float32, so the float32 kernels compute
        # the sums bfloat16 convolutions accumulate (oneDNN's too), rounded once at the end.
        y = convolution(x.astype(jnp.float32), weight.astype(jnp.float32), stride, padding, dilation, groups)
        return y.astype(jnp.bfloat16)
    if weight.ndim == 3:  # 1-D: one row of a 2-D image
        y = convolution(x[:, None], weight[:, :, None], (1, *stride), [(0, 0), *padding], (1, *dilation), groups)
        return y[:, 0]
    stride, dilation, pads = tuple(stride), tuple(dilation), tuple(tuple(p) for p in padding)
    out_channels, group_in, kh, kw = weight.shape
    if groups == 1 and set(dilation) == {1} and pads == ((0, 0), (0, 0)) and x.shape[1:3] == (kh, kw):
        return _whole_window(x, weight)
    if groups == x.shape[-1] == out_channels and group_in == 1:
        return depthwise(x, weight[:, 0].transpose(1, 2, 0), pads, stride, dilation)  # (kh, kw, C)
    return dense(x, weight, pads, stride, dilation, groups, OIHW)


def _whole_window(x, weight):
    """x (N, kh, kw, C), weight (O, C, kh, kw) -> (N, 1, 1, O): a convolution whose one window is
    the whole unpadded input (VGG's 7x7 classifier on a 7x7 map, a 1x1 convolution of a 1x1
    map) is a matrix product. As XLA's dot it reads the weights where they lie: packing them
    for the kernels costs more than the product (timm VGG-11's 411 MB head: its pack, swapped
    pack and weight gradient took 350 of the 640 ms of a train step at 64x64)."""
    n, out_channels = x.shape[0], weight.shape[0]
    rows = x.transpose(0, 3, 1, 2).reshape(n, -1)  # (N, C*kh*kw), the order of a weight row
    y = jax.lax.dot_general(rows, weight.reshape(out_channels, -1), (((1,), (1,)), ((), ())))
    return y.reshape(n, 1, 1, out_channels)


def supported(x_shape, kernel_shape, stride: int, padding: int, *dtypes) -> bool:
    """Whether native_conv2d can run this convolution: float32 x and kernel on a CPU, the kernels built."""
    return (all(jnp.dtype(d) == jnp.float32 for d in dtypes) and jax.default_backend() == "cpu"
            and kernels.available())


def native_conv2d(x, kernel, padding: int, stride: int = 1):
    """x (N, H, W, Cin), kernel (kh, kw, Cin, Cout) HWIO -> (N, Ho, Wo, Cout): torch's
    conv2d(stride, padding) in NHWC; check `supported` first."""
    pads = ((padding, padding), (padding, padding))
    return dense(x, kernel, pads, (stride, stride), (1, 1), 1, HWIO)
