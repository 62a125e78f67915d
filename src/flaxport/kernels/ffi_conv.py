"""The native CPU convolutions as differentiable JAX functions (FFI calls with a custom_vjp).

Two kernels (docs/cpu.md): `dense` runs any grouped convolution (groups = 1 included) and
`depthwise` one filter per channel. Both are 2-D, NHWC, float32, with any stride, dilation,
kernel size and padding:

forward:          y  = fwd(pad(x), w)   (dense: the padding skipped, never written out)
weight gradient:  dw = dw_kernel(pad(x), dy)
input gradient:   dx = fwd of dy with the flipped kernel, per phase of the stride (phases.py)

except that a 1x1, unpadded, ungrouped convolution whose weight holds LARGE_WEIGHT elements
or more takes both gradients as XLA's matrix products (the vjp of `_pointwise`).

The same sums as `lax.conv_general_dilated` and its transposes, in another order: float32
rounding differs at the 1e-6 relative level. The kernels' sums run in a fixed order, so
their results are the same bits for any thread count; the large 1x1 gradients are XLA's
dots, which make no such promise (tests/test_kernels_conv.py finds the same bits with one and
two threads on the shapes it runs).
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flaxport import kernels
from flaxport.kernels.phases import input_gradient

LANES = 16


def _require():
    if not kernels.available():
        raise RuntimeError(f"native CPU conv kernels unavailable: {kernels.unavailable_reason()}")


def _lanes(a, axis=-1):
    """a with `axis` zero-padded to a multiple of 16 (the kernels read whole vectors of weights)."""
    extra = -a.shape[axis] % LANES
    if not extra:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, extra)
    return jnp.pad(a, widths)


def _window(stride, dilation) -> dict:
    return {"stride_h": np.int64(stride[0]), "stride_w": np.int64(stride[1]),
            "dilation_h": np.int64(dilation[0]), "dilation_w": np.int64(dilation[1])}


def _out_size(size, k, s, d):
    return max(0, (size - d * (k - 1) - 1) // s + 1)


def _taps(w, taps, axis):
    """w's kernel taps `taps` (ascending, evenly spaced) along `axis`, in reverse order."""
    first, step = _steps(taps)
    return lax.rev(lax.slice_in_dim(w, first, taps[-1] + 1, step, axis), (axis,))


def _pad(x, pads):
    return lax.pad(x, jnp.zeros((), x.dtype), ((0, 0, 0), (*pads[0], 0), (*pads[1], 0), (0, 0, 0)))


# ----------------------------------------------------------------------------- dense and grouped
OIHW, HWIO = 0, 1  # torch's weight layout (translated files), the workloads' Flax layout


def channel_blocks(channels: int) -> tuple:
    """(B, V): a group's output channels as B blocks of V <= 4 vectors of 16, the widest V that
    divides the ceil(channels / 16) vectors (the kernel's register tile is V vectors wide)."""
    vectors = -(-channels // LANES)
    width = next(v for v in (4, 3, 2, 1) if vectors % v == 0)
    return vectors // width, width


def _dims(w, layout):
    """(O, I, kh, kw) of a weight in `layout`."""
    return tuple(w.shape) if layout == OIHW else (w.shape[3], w.shape[2], w.shape[0], w.shape[1])


def _steps(taps):
    """(first, step) of evenly spaced kernel taps, in the order given."""
    return taps[0], (taps[1] - taps[0] if len(taps) > 1 else 1)


def pack(w, after, groups, layout, swap=False, rows=None, cols=None):
    """w (O, I, kh, kw) in `layout` -> (G, B, len(rows), len(cols), Ci, 16V), the forward kernel's
    blocks of output channels. swap: the input gradient's weights (in and out channels swapped in
    each group); rows, cols: the kernel taps to take, in order (default all, ascending).

    after: the array the packed weights are used with, which the pack waits for (it does not
    read it). A pack that depends on the weight alone is scheduled by XLA before anything else,
    so every layer's packed weights would be held at once: a temporary buffer the size of all
    the model's convolution weights (45 MB for ResNet-18), which glibc maps afresh on every
    call, page by page, once it is over its 32 MB mmap threshold (ResNet-18 at batch 8, 64x64,
    glibc's defaults: 22 ms a forward; 8.5 ms packed where used). Waiting for its input, one
    layer's pack is live at a time."""
    _require()
    o, i, kh, kw = _dims(w, layout)
    rows, cols = rows or tuple(range(kh)), cols or tuple(range(kw))
    outs, ins = (i, o // groups) if swap else (o // groups, i)
    blocks, width = channel_blocks(outs)
    (r0, rs), (c0, cs) = _steps(rows), _steps(cols)
    out = jax.ShapeDtypeStruct((groups, blocks, len(rows), len(cols), ins, width * LANES), jnp.float32)
    return jax.ffi.ffi_call("flaxport_conv_pack", out, vmap_method="sequential")(
        w, after, layout=np.int64(layout), swap=np.int64(swap), row_start=np.int64(r0), row_step=np.int64(rs),
        col_start=np.int64(c0), col_step=np.int64(cs))


def dense_forward(x, packed, group_outputs, stride, dilation, pads=((0, 0), (0, 0))):
    """x (N, H, W, G*Ci), packed weights (G, B, kh, kw, Ci, 16V) -> (N, Ho, Wo, G*group_outputs),
    x zero-padded by pads ((top, bottom), (left, right)), all at least 0 (the kernel skips the
    padding's products; it is never written out)."""
    _require()
    n, h, w, _ = x.shape
    g, _, kh, kw, _, _ = packed.shape
    (top, bottom), (left, right) = pads
    out = jax.ShapeDtypeStruct((n, _out_size(h + top + bottom, kh, stride[0], dilation[0]),
                                _out_size(w + left + right, kw, stride[1], dilation[1]), g * group_outputs),
                               jnp.float32)
    # Under vmap (harness.vmap's stacked members) each member runs the kernel in turn:
    # the same sums, in the same order, as its own single run.
    return jax.ffi.ffi_call("flaxport_conv_fwd", out, vmap_method="sequential")(
        x, packed, **_window(stride, dilation), group_out_channels=np.int64(group_outputs),
        pad_top=np.int64(top), pad_bottom=np.int64(bottom), pad_left=np.int64(left), pad_right=np.int64(right))


def _dense_weight_gradient(x_padded, dy, w, groups, layout, stride, dilation):
    _require()
    group_outputs = _dims(w, layout)[0] // groups
    out = jax.ShapeDtypeStruct(w.shape, jnp.float32)
    return jax.ffi.ffi_call("flaxport_conv_dw", out, vmap_method="sequential")(
        x_padded, dy, **_window(stride, dilation), group_out_channels=np.int64(group_outputs),
        layout=np.int64(layout), groups=np.int64(groups), block_vectors=np.int64(channel_blocks(group_outputs)[1]))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def dense(x, w, pads, stride, dilation, groups, layout=OIHW):
    """x (N, H, W, Cin), w (O, Cin/groups, kh, kw) (or HWIO) -> (N, Ho, Wo, O): torch's conv2d.

    pads ((top, bottom), (left, right)), stride (sh, sw), dilation (dh, dw), groups.
    """
    return _dense_fwd(x, w, pads, stride, dilation, groups, layout)[0]


def _dense_fwd(x, w, pads, stride, dilation, groups, layout):
    y = dense_forward(x, pack(w, x, groups, layout), _dims(w, layout)[0] // groups, stride, dilation, pads)
    return y, (x, w)


# A 1x1 weight of this many elements or more (1 MB of float32): its gradients are XLA dots.
LARGE_WEIGHT = 1 << 18


def _pointwise(x, w, layout, stride):
    """x (N, H, W, I), w (O, I, 1, 1) or (1, 1, I, O) -> (N, Ho, Wo, O): a 1x1, unpadded,
    ungrouped convolution written as one matrix product (a stride reads every s-th cell).

    Only its vjp is used: as XLA's dots the gradients read the weight where it lies; the
    kernels pack it (swapped) for dx and sum dw through their tiles, which for a large weight
    costs more than the products (docs/cpu.md)."""
    weight = w.reshape(w.shape[:2]).T if layout == OIHW else w.reshape(w.shape[2:])  # (I, O)
    return x[:, ::stride[0], ::stride[1]] @ weight


def _dense_bwd(pads, stride, dilation, groups, layout, residuals, dy):
    x, w = residuals
    if _dims(w, layout)[2:] == (1, 1) and groups == 1 and pads == ((0, 0), (0, 0)) and w.size >= LARGE_WEIGHT:
        return jax.vjp(partial(_pointwise, layout=layout, stride=stride), x, w)[1](dy)
    x_shape, x_padded = x.shape, _pad(x, pads)
    dw = _dense_weight_gradient(x_padded, dy, w, groups, layout, stride, dilation)
    _, group_inputs, kh, kw = _dims(w, layout)

    def correlate(dy, pads, rows, cols, sub_dilation):  # flipped taps, in and out channels swapped
        packed = pack(w, dy, groups, layout, swap=True, rows=rows[::-1], cols=cols[::-1])
        return dense_forward(dy, packed, group_inputs, (1, 1), sub_dilation, pads)

    dx = input_gradient(dy, x_shape, (kh, kw), stride, dilation, pads, correlate)
    return dx, dw


dense.defvjp(_dense_fwd, _dense_bwd)


# ----------------------------------------------------------------------------- depthwise
def depthwise_forward(x_padded, w, stride, dilation):
    """x_padded (N, Hp, Wp, C), w (kh, kw, C) -> (N, Ho, Wo, C), valid."""
    _require()
    n, hp, wp, c = x_padded.shape
    kh, kw, _ = w.shape
    out = jax.ShapeDtypeStruct((n, _out_size(hp, kh, stride[0], dilation[0]),
                                _out_size(wp, kw, stride[1], dilation[1]), c), jnp.float32)
    return jax.ffi.ffi_call("flaxport_depthwise_fwd", out, vmap_method="sequential")(
        x_padded, _lanes(w), **_window(stride, dilation))


def _depthwise_weight_gradient(x_padded, dy, w_shape, stride, dilation):
    _require()
    kh, kw, c = w_shape
    out = jax.ShapeDtypeStruct((kh, kw, c + -c % LANES), jnp.float32)
    dw = jax.ffi.ffi_call("flaxport_depthwise_dw", out, vmap_method="sequential")(
        x_padded, dy, **_window(stride, dilation))
    return dw[..., :c]


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def depthwise(x, w, pads, stride, dilation):
    """x (N, H, W, C), w (kh, kw, C) -> (N, Ho, Wo, C): torch's conv2d with groups = C = out channels."""
    return depthwise_forward(_pad(x, pads), w, stride, dilation)


def _depthwise_fwd(x, w, pads, stride, dilation):
    x_padded = _pad(x, pads)
    return depthwise_forward(x_padded, w, stride, dilation), (x_padded, w, x.shape)


def _depthwise_bwd(pads, stride, dilation, residuals, dy):
    x_padded, w, x_shape = residuals
    dw = _depthwise_weight_gradient(x_padded, dy, w.shape, stride, dilation)

    def correlate(dy, pads, rows, cols, sub_dilation):
        return depthwise_forward(_pad(dy, pads), _taps(_taps(w, rows, 0), cols, 1), (1, 1), sub_dilation)

    dx = input_gradient(dy, x_shape, w.shape[:2], stride, dilation, pads, correlate)
    return dx, dw


depthwise.defvjp(_depthwise_fwd, _depthwise_bwd)
