"""Stride-1 NHWC convolution on the native CPU kernels, with a JAX custom_vjp.

forward:          y  = conv_fwd(pad(x), w)
input gradient:   dx = conv_fwd(pad(dy, k-1-p), flip(w).swap(cin, cout))
weight gradient:  dw = conv_dw(pad(x), dy)
All three are the same sums as `lax.conv_general_dilated` and its transposes, in another
order; float32 rounding differs at the 1e-6 relative level.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from flaxport import kernels


def supported(x_shape, kernel_shape, stride: int, padding: int, *dtypes) -> bool:
    """Whether native_conv2d can run this convolution: CPU, float32 input and kernel,
    stride 1, square kernel, output channels a multiple of 16, and the kernels built."""
    kh, kw, cin, cout = kernel_shape
    return (stride == 1 and kh == kw and padding <= kh - 1 and cout % 16 == 0
            and all(jnp.dtype(d) == jnp.float32 for d in dtypes) and jax.default_backend() == "cpu"
            and kernels.available())


def _pad(x, p: int):
    return jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0))) if p else x


def _require():
    if not kernels.available():
        raise RuntimeError(f"native CPU conv kernels unavailable: {kernels.unavailable_reason()}")


def _fwd_call(x_padded, kernel):
    _require()
    n, hp, wp, _ = x_padded.shape
    k, cout = kernel.shape[0], kernel.shape[3]
    out = jax.ShapeDtypeStruct((n, hp - k + 1, wp - k + 1, cout), jnp.float32)
    # Under vmap (harness.vmap's stacked members) each member runs the kernel in turn:
    # the same sums, in the same order, as its own single run.
    return jax.ffi.ffi_call("flaxport_conv_fwd", out, vmap_method="sequential")(x_padded, kernel)


def _dw_call(x_padded, grad_out, k: int):
    _require()
    out = jax.ShapeDtypeStruct((k, k, x_padded.shape[3], grad_out.shape[3]), jnp.float32)
    return jax.ffi.ffi_call("flaxport_conv_dw", out, vmap_method="sequential")(x_padded, grad_out)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def native_conv2d(x, kernel, padding: int):
    """x (N, H, W, Cin), kernel (k, k, Cin, Cout) -> (N, H+2p-k+1, W+2p-k+1, Cout).

    torch's conv2d(stride=1, padding=p) in NHWC; check `supported` first.
    """
    return _fwd_call(_pad(x, padding), kernel)


def _native_fwd(x, kernel, padding):
    x_padded = _pad(x, padding)
    return _fwd_call(x_padded, kernel), (x_padded, kernel)


def _native_bwd(padding, residuals, grad_out):
    x_padded, kernel = residuals
    k, cin = kernel.shape[0], kernel.shape[2]
    grad_kernel = _dw_call(x_padded, grad_out, k)
    flipped = jnp.transpose(kernel[::-1, ::-1], (0, 1, 3, 2))
    if cin % 16 == 0:
        grad_x = _fwd_call(_pad(grad_out, k - 1 - padding), flipped)
    else:  # e.g. an RGB input (whose gradient is usually unused, and then dropped by XLA)
        grad_x = jax.lax.conv_general_dilated(_pad(grad_out, k - 1 - padding), flipped, (1, 1), "VALID",
                                              dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return grad_x, grad_kernel


native_conv2d.defvjp(_native_fwd, _native_bwd)
