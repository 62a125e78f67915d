"""Conv2d and max_pool2d with torch.nn semantics, in NHWC.

Three things differ from `flax.linen.Conv` at its defaults and break ports:

* padding: Flax defaults to 'SAME', torch to 0. 'SAME' equals torch's `padding=1` for
  a stride-1 3x3 kernel but not for stride 2 (SAME pads (0, 1), torch (1, 1)). Here
  `padding` is torch's number: that many zeros on every side.
* init: torch draws weight and bias from U(+-1/sqrt(fan_in)), fan_in = cin * kh * kw;
  Flax uses lecun_normal and zero bias.
* layout: the kernel is HWIO (kh, kw, cin, cout); torch's weight is OIHW.

`impl` picks how the convolution runs on XLA. "native" calls flaxport's own direct
convolution kernels through the XLA FFI (`flaxport.kernels`, CPU only, built on first
use). Where they cannot run (float64, no C++ compiler, FLAXPORT_NATIVE=0) it runs
`fallback` on a CPU ("im2col" unless the caller knows better: the DDIM's big convs are
faster as "xla") and "xla" on GPU/TPU. "im2col" gathers the kh*kw shifted views
into one (N*H*W, kh*kw*cin) matrix and multiplies once; "xla" calls
`lax.conv_general_dilated`. Same numbers up to float rounding; on XLA:CPU im2col is the
faster one for small convolutions (docs/cpu.md, "The CNN"), and a conv
inside `lax.scan` there runs far slower than the same conv jitted alone (jax#12868)
while the matmul form does not.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax import lax

from flaxport.nn.linear import torch_bias_init, torch_kernel_init
from flaxport.runtime import functions


def im2col(x, kh: int, kw: int, padding: int, stride: int = 1):
    """x (N, H, W, C) -> patches (N, Ho, Wo, kh*kw*C), ordered (i, j, c) like an HWIO kernel."""
    n, h, w, c = x.shape
    if padding:
        x = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    ho = (h + 2 * padding - kh) // stride + 1
    wo = (w + 2 * padding - kw) // stride + 1
    views = [x[:, i:i + stride * (ho - 1) + 1:stride, j:j + stride * (wo - 1) + 1:stride, :]
             for i in range(kh) for j in range(kw)]
    return views[0] if len(views) == 1 else jnp.concatenate(views, axis=-1)


def conv2d(x, kernel, padding: int = 0, stride: int = 1, impl: str = "im2col", fallback: str = "im2col"):
    """torch's conv2d in NHWC: x (N, H, W, Cin), kernel (kh, kw, Cin, Cout) -> (N, Ho, Wo, Cout).

    `fallback`: what impl="native" runs on a CPU where the kernels cannot."""
    kh, kw, cin, cout = kernel.shape
    if impl == "native":
        from flaxport.kernels.conv import native_conv2d, supported

        if supported(x.shape, kernel.shape, stride, padding, x.dtype, kernel.dtype):
            return native_conv2d(x, kernel, padding, stride)
        impl = fallback if jax.default_backend() == "cpu" else "xla"
    if impl == "xla":
        return lax.conv_general_dilated(x, kernel, (stride, stride), ((padding, padding), (padding, padding)),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    if impl != "im2col":
        raise ValueError(f"conv impl {impl!r}: choose native, im2col or xla")
    cols = im2col(x, kh, kw, padding, stride)
    n, ho, wo, k = cols.shape
    return jnp.dot(cols.reshape(n * ho * wo, k), kernel.reshape(k, cout)).reshape(n, ho, wo, cout)


class Conv2d(nn.Module):
    """torch.nn.Conv2d(cin, features, kernel_size, stride, padding) on NHWC input.

    Params: kernel (kh, kw, cin, features) = torch weight.permute(2, 3, 1, 0); bias (features,).
    """

    features: int
    kernel_size: int = 3
    stride: int = 1
    padding: int = 0
    use_bias: bool = True
    impl: str = "im2col"

    @nn.compact
    def __call__(self, x):
        k = self.kernel_size
        cin = x.shape[-1]
        kernel = self.param("kernel", torch_kernel_init, (k, k, cin, self.features))
        y = conv2d(x, kernel, self.padding, self.stride, self.impl)
        if self.use_bias:
            y = y + self.param("bias", torch_bias_init(cin * k * k), (self.features,))
        return y


def max_pool2d(x, window: int = 2):
    """torch.max_pool2d(x, window) (stride = window, no padding, floor) on NHWC x (N, H, W, C).

    flaxport.runtime's max-pool: for windows that tile the input, a reshape and a max rather
    than `lax.reduce_window`, whose gradient (select_and_scatter) XLA:CPU runs slowly; the
    gradient goes to each window's first maximum, as torch's does.
    """
    return functions.max_pool(x, (window, window), channels_last=True)
