"""Max and average pooling with torch.nn semantics, on channels-last input.

`flax.linen.max_pool(x, window)` differs from `torch.nn.MaxPool2d(k)` in ways a port
trips over: Flax's strides default to 1 (torch's to the kernel), its padding is 'VALID'
or 'SAME' (torch pads `padding` on both sides), and there is no `ceil_mode`. Here the
arguments are torch's numbers:

* stride defaults to kernel_size;
* padding p adds p on both sides (-inf for max, zeros for avg), torch requires p <= k/2;
* ceil_mode rounds the output size up: a last, partial window is kept when it starts
  inside the input or the left padding;
* avg-pool divides by the window's overlap with the padded input (count_include_pad=True,
  torch's default: padding zeros count, the extra ceil_mode cells do not) or with the
  input itself (count_include_pad=False).

Works for 1, 2 or 3 spatial axes: x (N, *spatial, C); the spatial rank is x.ndim - 2. The
arguments are checked here with torch's rules; the pooling is flaxport.runtime's.
"""
from __future__ import annotations

from flax import linen as nn

# the pooling a translated model runs (torch's windows, divisors and first-maximum gradient)
from flaxport.runtime import functions


def _tuple(v, n, what):
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n:
        raise ValueError(f"pool {what}={v!r} does not fit {n} spatial axes")
    return t


def pool_geometry(size: int, k: int, s: int, p: int, ceil_mode: bool):
    """(output size, extra high padding) of a torch pool over one axis of length `size`."""
    if p > k // 2:
        raise ValueError(f"pool padding {p} should be at most half the kernel size {k} (torch's rule)")
    span = size + 2 * p - k
    if span < 0:
        raise ValueError(f"pool kernel {k} is larger than the padded input {size + 2 * p}")
    if ceil_mode:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + p:  # the last window would start in the right padding
            out -= 1
    else:
        out = span // s + 1
    return out, max((out - 1) * s + k - (size + 2 * p), 0)


def _setup(x, kernel_size, stride, padding, ceil_mode):
    n = x.ndim - 2
    k = _tuple(kernel_size, n, "kernel_size")
    s = k if stride is None else _tuple(stride, n, "stride")
    p = _tuple(padding, n, "padding")
    for i in range(n):  # torch's argument errors, before runtime pools
        pool_geometry(x.shape[1 + i], k[i], s[i], p[i], ceil_mode)
    return k, s, p


def max_pool(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False):
    """torch max_pool{1,2,3}d on x (N, *spatial, C) -> (N, *out, C); padding cells are -inf."""
    k, s, p = _setup(x, kernel_size, stride, padding, ceil_mode)
    return functions.max_pool(x, k, s, p, 1, ceil_mode, channels_last=True)


def avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True):
    """torch avg_pool{1,2,3}d on x (N, *spatial, C) -> (N, *out, C)."""
    k, s, p = _setup(x, kernel_size, stride, padding, ceil_mode)
    return functions.avg_pool(x, k, s, p, ceil_mode, count_include_pad, channels_last=True)


class MaxPool(nn.Module):
    """torch.nn.MaxPool{1,2,3}d(kernel_size, stride, padding, ceil_mode) as a Flax module."""

    kernel_size: int | tuple
    stride: int | tuple | None = None
    padding: int | tuple = 0
    ceil_mode: bool = False

    def __call__(self, x):
        return max_pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode)


class AvgPool(nn.Module):
    """torch.nn.AvgPool{1,2,3}d(kernel_size, stride, padding, ceil_mode, count_include_pad) as a Flax module."""

    kernel_size: int | tuple
    stride: int | tuple | None = None
    padding: int | tuple = 0
    ceil_mode: bool = False
    count_include_pad: bool = True

    def __call__(self, x):
        return avg_pool(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad)
