"""torch's functional ops in JAX, written to be copied into a generated model file.

Every function here imports only jax, jax.numpy, numpy and math (the generated file's
imports), works on torch's layout (N, C, *spatial) and takes torch's arguments, so the
translation of `F.max_pool2d(x, 3, 2, 1, ceil_mode=True)` reads `max_pool(x, (3, 3),
(2, 2), (1, 1), ceil_mode=True)`. The emitter copies the source of the ones a model uses
(`inspect.getsource`), so what is tested here is what the user gets.

Numerics follow torch's CPU kernels (docs/porting.md): explicit padding per side, pooling
windows with `ceil_mode` and `count_include_pad`, interpolation source indices computed
as torch computes them, two-pass (biased) variances for the norms.
"""
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _channels_last(x, n):
    """(..., C, *S) -> (..., *S, C) for n spatial axes.

    XLA:CPU convolves, pools and normalises channels-last, and on torch's layout it wraps
    each such op in transposes of its own, which it does not cancel between ops. So these
    functions compute channels-last inside and transpose at their edges: between two
    layers the transposes meet and XLA removes them. What a train step keeps for the
    gradient stays in the layout it was computed in, so activations of feature maps and
    per-channel gates are channels-last inside too (apply_channels_last, multiply_channels).
    """
    return jnp.moveaxis(x, x.ndim - n - 1, -1)


def _channels_first(x, n):
    """(..., *S, C) -> (..., C, *S) for n spatial axes (undoes _channels_last)."""
    return jnp.moveaxis(x, -1, x.ndim - n - 1)


def _fusion_boundary_jvp(primals, tangents):
    return fusion_boundary(primals[0]), tangents[0]


@jax.custom_jvp
def fusion_boundary(x):
    """x, unchanged, as the input of a new XLA fusion on a CPU (elsewhere nothing at all).

    A linear layer's input goes through it, and a convolution's whose one window is the whole
    input (a linear layer too). XLA:CPU's YNNPACK fusions otherwise take a reduction (a
    pooling) with the matrix products after it into one fusion, which computes the first
    product again for every tile of the second: VGG-11's forward at 32x32 took 3.3 s there
    against 55 ms with its products apart. A rounding to x's own precision is exact, and
    YNNPACK does not fuse it; its derivative is the identity's.
    """
    if x.dtype not in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        return x
    bits = jnp.finfo(x.dtype)
    return lax.platform_dependent(x, cpu=lambda v: lax.reduce_precision(v, bits.nexp, bits.nmant), default=lambda v: v)


fusion_boundary.defjvp(_fusion_boundary_jvp)


def _computed_once_jvp(primals, tangents):
    return computed_once(primals[0]), tangents[0]


@jax.custom_jvp
def computed_once(x):
    """x, unchanged, computed once on a CPU for every op that reads it (elsewhere nothing at all).

    A module's input that an element-wise op and a convolution or a matrix product both read (a
    residual block's `out + x` beside `self.conv1(x)`) goes through it. XLA:CPU computes a
    cheap element-wise value again inside each fusion that reads it, even where another reader has
    it written out anyway; along a residual stream each block's sum is such a value, so every
    block recomputed the normalisations, sums and activations of all the blocks before it
    (ResNet-152's stage of 36 blocks: its forward 1.4x as long). XLA computes a division only once:
    x divided by a one made from x is x, bit for bit, zeros, infinities and NaN too (a subnormal
    becomes zero, as in every arithmetic op of XLA:CPU, which flushes them). Its derivative is the
    identity's.
    """
    if x.dtype not in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        return x
    return lax.platform_dependent(x, cpu=lambda v: v / (jnp.sign(v) * 0 + 1), default=lambda v: v)


computed_once.defjvp(_computed_once_jvp)


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, channels_last=False):
    """torch's conv1d/2d/3d: x (N, C, *S), weight (O, C/groups, *K) -> (N, O, *S').

    channels_last: x and the result are (N, *S, C) (the weight keeps torch's layout).
    """
    n = weight.ndim - 2
    if not channels_last:
        y = conv(_channels_last(x, n), weight, bias, stride, padding, dilation, groups, channels_last=True)
        return _channels_first(y, n)
    stride, dilation = _tuple(stride, n), _tuple(dilation, n)
    if isinstance(padding, str):  # 'valid' / 'same' (stride 1): torch puts the odd cell at the end
        total = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
        padding = [(0, 0)] * n if padding == "valid" else [(t // 2, t - t // 2) for t in total]
    else:
        padding = [(p, p) for p in _tuple(padding, n)]
    if groups == 1 and set(dilation) == {1} and x.shape[1:-1] == weight.shape[2:] and \
            all(tuple(p) == (0, 0) for p in padding):
        x = fusion_boundary(x)  # one window, the whole input: a linear layer (VGG's classifier as convolutions)
    y = _convolution(x, weight, stride, padding, dilation, groups)
    return y if bias is None else y + bias


def _convolution(x, weight, stride, padding, dilation, groups):
    """XLA's convolution: x (N, *S, C), weight (O, C/groups, *K), padding [(low, high)] per axis -> (N, *S', O)."""
    return _xla_convolution(x, weight, stride, padding, dilation, groups)


def _xla_convolution(x, weight, stride, padding, dilation, groups):
    """x (N, *S, C), weight (O, C/groups, *K), padding [(low, high)] per axis -> (N, *S', O)."""
    if groups > 1 and x.dtype == jnp.float64 and jax.default_backend() == "cpu":
        # XLA:CPU runs a grouped float64 convolution as a dense one with a (O, C, *K) kernel: for
        # 1,536 depthwise channels of 5x5 that is half a GB, and a model holds many such layers
        return _grouped_by_taps(x, weight, stride, padding, dilation, groups)
    n = weight.ndim - 2
    spatial = "DHW"[-n:]
    return lax.conv_general_dilated(x, weight, stride, padding, rhs_dilation=dilation, feature_group_count=groups,
                                    dimension_numbers=("N" + spatial + "C", "OI" + spatial, "N" + spatial + "C"))


def _grouped_by_taps(x, weight, stride, padding, dilation, groups):
    """A grouped convolution as a sum over the kernel's taps of a strided window of x times that
    tap's weights, group by group (a batched matmul): x (N, *S, C) -> (N, *S', O)."""
    n = weight.ndim - 2
    o, per_group, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    x = jnp.pad(x, [(0, 0), *padding, (0, 0)])
    out_sizes = [(x.shape[1 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    w = weight.reshape((groups, o // groups, per_group) + kernel)
    y = 0
    for tap, (starts, limits) in _taps(kernel, stride, dilation, out_sizes):
        window = lax.slice(x, (0, *starts, 0), (x.shape[0], *limits, x.shape[-1]), (1, *stride, 1))
        window = window.reshape(window.shape[:-1] + (groups, per_group))
        y = y + jnp.einsum("...gc,goc->...go", window, w[(...,) + tap], precision=lax.Precision.HIGHEST)
    return y.reshape(y.shape[:-2] + (o,))


def _taps(kernel_size, stride, dilation, out_sizes) -> list:
    """[(tap, (starts, limits))]: for each kernel tap, the spatial window of a padded input whose
    cells, taken every `stride`, are that tap's cell of every output position."""
    out = []
    for tap in itertools.product(*(range(k) for k in kernel_size)):
        starts = [t * d for t, d in zip(tap, dilation)]
        out.append((tap, (starts, [a + (o - 1) * s + 1 for a, o, s in zip(starts, out_sizes, stride)])))
    return out


def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                   channels_last=False):
    """torch's conv_transpose1d/2d/3d: weight (C, O/groups, *K), the gradient of a conv.

    A dilated conv with the kernel flipped in space and its in/out axes swapped per group
    (docs/porting.md, entry 7); padding d(k-1)-p per side plus output_padding at the end.
    """
    n = weight.ndim - 2
    if not channels_last:
        y = conv_transpose(_channels_last(x, n), weight, bias, stride, padding, output_padding, groups, dilation,
                           channels_last=True)
        return _channels_first(y, n)
    stride, padding, dilation = _tuple(stride, n), _tuple(padding, n), _tuple(dilation, n)
    output_padding = _tuple(output_padding, n)
    c, o = weight.shape[0], weight.shape[1]
    w = weight.reshape((groups, c // groups, o) + weight.shape[2:])
    w = jnp.swapaxes(w, 1, 2).reshape((groups * o, c // groups) + weight.shape[2:])
    w = jnp.flip(w, axis=tuple(range(2, n + 2)))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
            for d, k, p, op in zip(dilation, weight.shape[2:], padding, output_padding)]
    spatial = "DHW"[-n:]
    y = lax.conv_general_dilated(x, w, (1,) * n, pads, lhs_dilation=stride, rhs_dilation=dilation,
                                 feature_group_count=groups,
                                 dimension_numbers=("N" + spatial + "C", "OI" + spatial, "N" + spatial + "C"))
    return y if bias is None else y + bias


def _spatial(x, n, channels_last):
    """Positions of the n spatial axes: the trailing ones, or before the channels (channels_last)."""
    end = x.ndim - 1 if channels_last else x.ndim
    return list(range(end - n, end))


def _window(x, axes, values, fill):
    out = [fill] * x.ndim
    for a, v in zip(axes, values):
        out[a] = v
    return out


def max_pool(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, channels_last=False):
    """torch's max_pool1d/2d/3d over the spatial axes (padding counts as -inf); the gradient goes
    to the first maximum of each window, as torch's does."""
    n = len(kernel_size)
    if not channels_last:
        y = max_pool(_channels_last(x, n), kernel_size, stride, padding, dilation, ceil_mode, channels_last=True)
        return _channels_first(y, n)
    stride = _tuple(stride or kernel_size, n)
    padding, dilation = _tuple(padding, n), _tuple(dilation, n)
    axes = _spatial(x, n, True)
    pads = [(p, p + _ceil_extra(x.shape[a], k, s, p, d, ceil_mode))
            for a, k, s, p, d in zip(axes, kernel_size, stride, padding, dilation)]
    if tuple(stride) == tuple(kernel_size) and set(dilation) == {1}:
        # Windows that tile the input: pick each window's first maximum, whose gradient is a
        # select (reduce_window's is a select_and_scatter, slow on XLA:CPU).
        padded = jnp.pad(x, _window(x, axes, pads, (0, 0)), constant_values=_lowest(x.dtype))
        return _tiled_max_pool(padded, tuple(kernel_size))
    window = (tuple(kernel_size), tuple(stride), tuple(map(tuple, pads)), tuple(dilation))
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return _window_max(x, *window)  # no gradient
    return _window_max_pool(x, *window)


def _lowest(dtype):
    """The padding of a max-pool: -inf, or an integer type's least value. A NumPy value: concrete
    under jit too, so JAX sees a max-pool it can differentiate."""
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _window_max(x, kernel_size, stride, pads, dilation):
    """Each window's maximum of x (N, *S, C), the padding the dtype's lowest value."""
    axes = list(range(1, x.ndim - 1))
    return lax.reduce_window(x, _lowest(x.dtype), lax.max, _window(x, axes, kernel_size, 1),
                             _window(x, axes, stride, 1), _window(x, axes, pads, (0, 0)),
                             window_dilation=_window(x, axes, dilation, 1))


def _window_max_pool_forward(x, kernel_size, stride, pads, dilation):
    y = _window_max(x, kernel_size, stride, pads, dilation)
    return y, (x, y)


def _window_max_pool_backward(kernel_size, stride, pads, dilation, residuals, dy):
    x, y = residuals
    padded = jnp.pad(x, [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
    image = np.pad(np.ones(x.shape[1:-1], bool), pads)[None, ..., None]
    places = [place for _, place in _taps(kernel_size, stride, dilation, y.shape[1:-1])]
    cells = jnp.stack([lax.slice(padded, (0, *a, 0), (y.shape[0], *b, y.shape[-1]), (1, *stride, 1))
                       for a, b in places])
    in_image = np.stack([image[(slice(None), *map(slice, a, b, stride), slice(None))] for a, b in places])
    # torch starts each window at its first cell in the image and moves on to a greater value
    # or a NaN: the gradient goes to the first cell equal to the maximum (an all -inf window's
    # first cell in the image, never the padding), or to a window's last NaN.
    first = jnp.argmax((cells == y) & in_image, axis=0)
    last_nan = len(places) - 1 - jnp.argmax(jnp.isnan(cells)[::-1], axis=0)
    chosen = jnp.where(jnp.isnan(y), last_nan, first)
    dx = _scatter_taps([jnp.where(chosen == k, dy, 0) for k in range(len(places))], [a for a, _ in places],
                       stride, padded.shape[1:-1])
    inside = tuple(slice(low, size - high) for (low, high), size in zip(pads, padded.shape[1:-1]))
    return (dx[(slice(None), *inside, slice(None))],)


def _scatter_taps(shares, starts, stride, size):
    """The sum of each tap's share (N, *O, C) put back at its cells of an input (N, *size, C):
    share k's cell o lies at starts[k] + o * stride.

    By phases: the cells p with the same p % stride along every axis form a grid at the
    output's resolution, where each tap's share is a plain shift (a pad); the phases are
    interleaved once at the end. Putting each share back by an interior pad instead wrote the
    whole input once per tap (9 times for a 3x3 window), and at 112x112 took longer than the
    rest of the pool's gradient.
    """
    grid = [-(-p // s) for p, s in zip(size, stride)]  # each phase's cells along each axis
    phases = {}
    for share, start in zip(shares, starts):
        phase = tuple(a % s for a, s in zip(start, stride))
        shift = [(0, 0)] + [(a // s, g - a // s - o) for a, s, g, o in zip(start, stride, grid, share.shape[1:-1])]
        placed = jnp.pad(share, shift + [(0, 0)])
        phases[phase] = placed if phase not in phases else phases[phase] + placed
    zeros = jnp.zeros((shares[0].shape[0], *grid, shares[0].shape[-1]), shares[0].dtype)
    n = len(stride)
    # (N, *grid, C) per phase -> (N, g1, s1, g2, s2, ..., C) -> (N, g1*s1, g2*s2, ..., C)
    stacked = jnp.stack([phases.get(phase, zeros) for phase in itertools.product(*(range(s) for s in stride))])
    stacked = stacked.reshape((*stride, *zeros.shape))
    order = [n] + [a for i in range(n) for a in (n + 1 + i, i)] + [2 * n + 1]
    full = stacked.transpose(order).reshape((zeros.shape[0], *(g * s for g, s in zip(grid, stride)), zeros.shape[-1]))
    return full[(slice(None), *(slice(0, p) for p in size), slice(None))]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _window_max_pool(x, kernel_size, stride, pads, dilation):
    """Max-pool of x (N, *S, C) with any windows (overlapping: ResNet's 3x3 stride 2).

    The value is reduce_window's; the gradient goes to each window's first maximum, as
    torch's does: the kernel tap that holds it is found over the taps' cells (a strided slice
    each), and each tap's share of the gradient is put back in place (`_scatter_taps`).
    JAX's own gradient of reduce_window (a variadic reduce_window carrying every cell's index,
    then a scatter) took 8-10 ms of ResNet-18's 56 ms train step at 64x64 on a 2-core CPU.
    """
    return _window_max(x, kernel_size, stride, pads, dilation)


_window_max_pool.defvjp(_window_max_pool_forward, _window_max_pool_backward)


def _first_maximum_pool(x, kernel_size):
    """Each window's first maximum (torch's choice), as a select: its gradient is one too."""
    windows = _tiles(x, kernel_size)
    first = jax.nn.one_hot(jnp.argmax(windows, axis=-1), windows.shape[-1], dtype=bool)
    return jnp.sum(jnp.where(first, windows, 0), axis=-1)


def _tiled_max_pool_forward(x, kernel_size):
    return _tiled_max_pool(x, kernel_size), x


def _tiled_max_pool_backward(kernel_size, x, cotangent):
    return jax.vjp(lambda v: _first_maximum_pool(v, kernel_size), x)[1](cotangent)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _tiled_max_pool(x, kernel_size):
    """Max-pool of x (N, *S, C) with windows that tile it (stride = kernel, no dilation).

    The value is a reshape and a max (XLA:CPU keeps it inside its YNNPACK fusion of the
    convolutions around it; a reduce_window splits that fusion); the gradient goes to each
    window's first maximum as torch's does, through a select (the max's own gradient
    splits ties).
    """
    blocks = _blocks(x, kernel_size)
    lead = x.ndim - len(kernel_size) - 1
    return blocks.max(axis=tuple(lead + 2 * i + 1 for i in range(len(kernel_size))))


_tiled_max_pool.defvjp(_tiled_max_pool_forward, _tiled_max_pool_backward)


def _blocks(x, kernel_size):
    """(N, *S, C) -> (N, S1 // K1, K1, S2 // K2, K2, ..., C): each spatial axis split into its
    windows and their cells (cells past the last whole window dropped)."""
    n = len(kernel_size)
    lead = x.shape[:x.ndim - n - 1]
    outs = [s // k for s, k in zip(x.shape[len(lead):-1], kernel_size)]
    x = x[(...,) + tuple(slice(0, o * k) for o, k in zip(outs, kernel_size)) + (slice(None),)]
    return x.reshape(lead + tuple(d for o, k in zip(outs, kernel_size) for d in (o, k)) + x.shape[-1:])


def _tiles(x, kernel_size):
    """(N, *S, C) -> (N, *(S // K), C, prod(K)): the windows of a pool whose stride is its size."""
    n, b = len(kernel_size), x.ndim - len(kernel_size) - 1
    x = _blocks(x, kernel_size)
    order = list(range(b)) + [b + 2 * i for i in range(n)] + [x.ndim - 1] + [b + 2 * i + 1 for i in range(n)]
    return x.transpose(order).reshape(x.shape[:b] + tuple(x.shape[b + 2 * i] for i in range(n)) + x.shape[-1:] + (-1,))


def avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None,
             channels_last=False):
    """torch's avg_pool1d/2d/3d: windows divided as torch divides them.

    count_include_pad counts the zero padding but never the cells ceil_mode adds past it;
    without it only real cells count. divisor_override replaces the count.
    """
    n = len(kernel_size)
    if not channels_last:
        y = avg_pool(_channels_last(x, n), kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, channels_last=True)
        return _channels_first(y, n)
    stride, padding = _tuple(stride or kernel_size, n), _tuple(padding, n)
    axes = _spatial(x, n, True)
    sizes = [x.shape[a] for a in axes]
    extras = [_ceil_extra(size, k, s, p, 1, ceil_mode) for size, k, s, p in zip(sizes, kernel_size, stride, padding)]
    pads = _window(x, axes, [(p, p + e) for p, e in zip(padding, extras)], (0, 0))
    if tuple(stride) == tuple(kernel_size):  # windows that tile the input: a reshape and a sum
        total = jnp.sum(_tiles(jnp.pad(x, pads), kernel_size), axis=-1)
    else:
        total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, _window(x, axes, kernel_size, 1),
                                  _window(x, axes, stride, 1), pads)
    if divisor_override:
        return total / divisor_override
    # The divisor of every window, from a ones-array the size of what it may count.
    if count_include_pad:
        ones = np.pad(np.ones([s + 2 * p for s, p in zip(sizes, padding)]), [(0, e) for e in extras])
    else:
        ones = np.pad(np.ones(sizes), [(p, p + e) for p, e in zip(padding, extras)])
    counts = _window_sums(ones, kernel_size, stride)
    return total / jnp.asarray(counts[..., None], x.dtype)


def _window_sums(a, kernel_size, stride):
    """Sums of the (already padded) NumPy array `a` over pooling windows, computed at trace time."""
    out = a
    for axis, (k, s) in enumerate(zip(kernel_size, stride)):
        m = (out.shape[axis] - k) // s + 1
        out = np.stack([np.take(out, range(i * s, i * s + k), axis=axis).sum(axis=axis) for i in range(m)], axis=axis)
    return out


def _ceil_extra(size, k, s, p, d, ceil_mode):
    """Cells ceil_mode adds past the high padding so the last partial window exists (torch's rule:
    a window must start inside the input or the left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = -(-span // s) + 1 if ceil_mode else span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


def adaptive_avg_pool(x, output_size, channels_last=False):
    """torch's adaptive_avg_pool1d/2d/3d: window i spans [floor(i L / out), ceil((i + 1) L / out))."""
    return _adaptive(x, output_size, jnp.mean, channels_last)


def adaptive_max_pool(x, output_size, channels_last=False):
    """torch's adaptive_max_pool1d/2d/3d (values only)."""
    return _adaptive(x, output_size, jnp.max, channels_last)


def _adaptive(x, output_size, reduce, channels_last=False):
    n = len(output_size)
    for i, out in enumerate(output_size):
        axis = _spatial(x, n, channels_last)[i]
        size = x.shape[axis]
        out = size if out is None else out
        if size % out == 0:  # equal windows: one reshape and one reduction
            x = reduce(x.reshape(x.shape[:axis] + (out, size // out) + x.shape[axis + 1:]), axis=axis + 1)
            continue
        parts = [reduce(lax.slice_in_dim(x, (j * size) // out, -(-((j + 1) * size) // out), axis=axis), axis=axis,
                        keepdims=True) for j in range(out)]
        x = jnp.concatenate(parts, axis=axis)
    return x


def _output_size(x, size, scale_factor, channels_last=False):
    """F.interpolate's output size: `size`, or floor(input size * scale_factor) per spatial axis."""
    if size is not None:
        return tuple(size)
    n = len(scale_factor)
    return tuple(int(math.floor(x.shape[a] * f)) for a, f in zip(_spatial(x, n, channels_last), scale_factor))


def interpolate_nearest(x, size=None, scale_factor=None, exact=False, channels_last=False):
    """torch's F.interpolate(mode='nearest') (or 'nearest-exact' when exact) on (N, C, *spatial).

    torch reads source index floor(dst * scale) with scale = 1 / scale_factor when a scale
    factor was given, else in / out, computed in float32.
    """
    output_size = _output_size(x, size, scale_factor, channels_last)
    n = len(output_size)
    for i, out in enumerate(output_size):
        axis = _spatial(x, n, channels_last)[i]
        size_in = x.shape[axis]
        scale = np.float32(1.0 / scale_factor[i]) if scale_factor else np.float32(size_in / out)
        dst = np.arange(out, dtype=np.float32) + (np.float32(0.5) if exact else np.float32(0))
        src = np.minimum(np.floor(dst * scale).astype(np.int64), size_in - 1)
        x = jnp.take(x, jnp.asarray(src), axis=axis)
    return x


def interpolate_linear(x, size=None, scale_factor=None, align_corners=False, channels_last=False):
    """torch's F.interpolate(mode='linear' / 'bilinear' / 'trilinear'): separable linear interpolation.

    Source coordinate (dst + 0.5) * scale - 0.5, clamped at 0 (align_corners=False), or
    dst * (in - 1) / (out - 1) (align_corners=True); scale = 1 / scale_factor when given.
    """
    output_size = _output_size(x, size, scale_factor, channels_last)
    n = len(output_size)
    for i, out in enumerate(output_size):
        axis = _spatial(x, n, channels_last)[i]
        size = x.shape[axis]
        dst = np.arange(out, dtype=np.float64)
        if align_corners:
            src = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
        else:
            scale = 1.0 / scale_factor[i] if scale_factor else size / out
            src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
        lo = np.minimum(np.floor(src).astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        frac = (src - lo).reshape((-1,) + (1,) * (x.ndim - axis - 1))
        frac = jnp.asarray(frac, x.dtype)
        x = jnp.take(x, jnp.asarray(lo), axis=axis) * (1 - frac) + jnp.take(x, jnp.asarray(hi), axis=axis) * frac
    return x


def interpolate_antialias(x, size, mode="bilinear", align_corners=False, scale_factor=None):
    """torch's F.interpolate(mode='bilinear' / 'bicubic', antialias=True) on (N, C, H, W).

    Each output pixel averages the input under a triangle (bilinear) or cubic (a = -0.5) filter
    stretched by the scale when downsampling, weights normalised to sum to one: one (out, in)
    matrix per axis, as torch's separable kernel computes it.
    """
    for i, out in enumerate(size):
        axis = x.ndim - 2 + i
        weights = _antialias_weights(x.shape[axis], out, mode, align_corners,
                                     scale_factor[i] if scale_factor else None)
        x = jnp.moveaxis(jnp.tensordot(x, jnp.asarray(weights, x.dtype), axes=((axis,), (1,))), -1, axis)
    return x


def _antialias_weights(size, out, mode, align_corners, scale_factor):
    """(out, size) weights of one axis (torch's _compute_weights_aa)."""
    if align_corners:
        scale = (size - 1) / (out - 1) if out > 1 else 0.0
    else:
        scale = 1.0 / scale_factor if scale_factor else size / out
    half_width = 1.0 if mode == "bilinear" else 2.0  # the filter's support at scale 1
    support = half_width * scale if scale >= 1.0 else half_width
    stretch = 1.0 / scale if scale >= 1.0 else 1.0
    weights = np.zeros((out, size))
    for i in range(out):
        center = scale * (i + 0.5)
        first = max(int(center - support + 0.5), 0)
        last = min(int(center + support + 0.5), size)
        distance = np.abs((np.arange(first, last) - center + 0.5) * stretch)
        if mode == "bilinear":
            w = np.maximum(1.0 - distance, 0.0)
        else:
            a = -0.5
            w = np.where(distance < 1.0, ((a + 2) * distance - (a + 3)) * distance**2 + 1,
                         np.where(distance < 2.0, (((distance - 5) * distance + 8) * distance - 4) * a, 0.0))
        total = w.sum()
        weights[i, first:last] = w / total if total != 0.0 else w
    return weights


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch's layer_norm over the trailing len(normalized_shape) axes, two-pass biased variance."""
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) * lax.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, channels_last=False):
    """torch's group_norm: x (N, C, *S), statistics per (sample, group of C / num_groups channels)."""
    if not channels_last and x.ndim > 2:
        y = group_norm(_channels_last(x, x.ndim - 2), num_groups, weight, bias, eps, channels_last=True)
        return _channels_first(y, x.ndim - 2)
    # (N, *S, C): groups are blocks of consecutive channels, as in torch
    g = x.reshape(x.shape[:-1] + (num_groups, -1))
    axes = tuple(range(1, x.ndim - 1)) + (x.ndim,)
    mean = jnp.mean(g, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=axes, keepdims=True)
    y = ((g - mean) * lax.rsqrt(var + eps)).reshape(x.shape)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _batch_norm_forward(x, weight, bias, eps):
    axes = tuple(range(x.ndim - 1))
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean), axis=axes)  # two passes, as torch
    invstd = lax.rsqrt(var + eps)
    xhat = (x - mean) * invstd
    return (xhat * weight + bias, mean, var), (xhat, invstd, weight)


def _batch_norm_backward(eps, res, cotangents):
    # dx = invstd w (dy - mean(dy) - xhat mean(dy xhat)); the statistics feed running averages only
    xhat, invstd, weight = res
    dy = cotangents[0]
    axes = tuple(range(dy.ndim - 1))
    dbias = jnp.sum(dy, axis=axes)
    dweight = jnp.sum(dy * xhat, axis=axes)
    n = dy.size // dy.shape[-1]
    return (invstd * weight) * (dy - dbias / n - xhat * (dweight / n)), dweight, dbias


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_norm_train(x, weight, bias, eps):
    """Train-mode batch norm of x (N, *S, C) over all axes but the last -> (y, batch mean, biased var).

    Its gradient is the closed form of torch's batch_norm_backward: two reductions per
    channel where autodiff of the two-pass statistics makes four or five.
    """
    return _batch_norm_forward(x, weight, bias, eps)[0]


batch_norm_train.defvjp(_batch_norm_forward, _batch_norm_backward)


def apply_channels_last(activation, x, *args, **kwargs):
    """activation(x, *args, **kwargs) of an image x (N, C, H, W) -> (N, C, H, W), computed on
    its channels-last transpose. An elementwise function gives the same values in either
    layout, but a train step keeps what the function's gradient needs (GELU's erf, SiLU's
    sigmoid) in the layout it was computed in: in torch's layout, a copy transposed from the
    convolution's channels-last output, read back transposed (timm ConvNeXt-atto's train
    step at 224x224, batch 8: 200 -> 137 ms on a 2-core CPU)."""
    return _channels_first(activation(_channels_last(x, 2), *args, **kwargs), 2)


def multiply_channels(x, factor):
    """x (N, C, H, W) times a per-channel factor (N or 1, C, 1, 1) -> (N, C, H, W): a
    squeeze-and-excitation gate, a layer scale. Computed channels-last, as apply_channels_last:
    in torch's layout XLA keeps the product's gradient transposed, and the factor's gradient,
    a sum over (H, W), reads it across the convolutions' layout (timm SE-ResNeXt-26d's train
    step at 224x224, batch 8: 928 -> 629 ms on a 2-core CPU)."""
    return _channels_first(_channels_last(x, 2) * _channels_last(factor, 2), 2)


def concatenate_channels(images):
    """torch.cat(images, dim=1) of images (N, C, H, W) -> (N, sum of C, H, W), computed
    channels-last: the transposes at its edges meet those of the convolutions and
    normalisations around it and XLA removes them (a concatenation in torch's layout is a
    copy to it and back, each way a transpose)."""
    return _channels_first(jnp.concatenate([_channels_last(x, 2) for x in images], axis=-1), 2)


def batch_norm(x, running_mean, running_var, weight, bias, training, eps, channels_last=False):
    """torch's F.batch_norm of x (N, C, *S), or (N, *S, C) with channels_last -> y, same shape.

    training: the batch's statistics (biased variance, torch's closed-form gradient); else the
    running ones. The running statistics are not updated here: a JAX function does not write
    its arguments (the translation updates a module's buffers itself). Computed channels-last,
    so the transposes at its edges meet the convolutions' and XLA removes them.
    """
    if not channels_last and x.ndim > 2:
        y = batch_norm(_channels_last(x, x.ndim - 2), running_mean, running_var, weight, bias, training, eps, True)
        return _channels_first(y, x.ndim - 2)
    return batch_norm_channels_last(x, running_mean, running_var, weight, bias, training, eps)[0]


def batch_norm_channels_last(x, running_mean, running_var, weight, bias, training, eps):
    """x (N, *S, C) -> (y, the batch's mean, its biased variance) with training, else (y from
    the running statistics, None, None); weight and bias may be None (ones, zeros)."""
    c = x.shape[-1]
    weight = jnp.ones((c,), x.dtype) if weight is None else weight
    bias = jnp.zeros((c,), x.dtype) if bias is None else bias
    if training:
        return batch_norm_train(x, weight, bias, eps)
    return (x - running_mean) * lax.rsqrt(running_var + eps) * weight + bias, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False,
                                 dropout=None):
    """torch's F.scaled_dot_product_attention: (..., L, E) x (..., S, E) -> (..., L, Ev).

    A boolean mask keeps where True; a float mask is added to the scores; is_causal keeps
    the lower triangle. `dropout` (an nnx.Dropout, off in eval mode) drops attention weights
    where torch's dropout_p does.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    if enable_gqa:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = jnp.repeat(key, repeat, axis=-3), jnp.repeat(value, repeat, axis=-3)
    scores = (query @ jnp.swapaxes(key, -1, -2)) * scale
    if is_causal:
        causal = jnp.tril(jnp.ones((query.shape[-2], key.shape[-2]), bool))
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == bool else scores + attn_mask
    weights = jax.nn.softmax(scores, axis=-1)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value


def pixel_shuffle(x, upscale_factor):
    """torch's pixel_shuffle: (N, C r^2, H, W) -> (N, C, H r, W r)."""
    n, c, h, w = x.shape
    r = upscale_factor
    x = x.reshape(n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
    return x.reshape(n, c // (r * r), h * r, w * r)


def channel_shuffle(x, groups):
    """torch's channel_shuffle: the channels of x (N, C, *S) read as (groups, C // groups), transposed."""
    n, c = x.shape[:2]
    return jnp.swapaxes(x.reshape(n, groups, c // groups, *x.shape[2:]), 1, 2).reshape(x.shape)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """torch's cosine_similarity: each side divided by its norm (at least eps), then summed over dim."""
    x1, x2 = jnp.broadcast_arrays(x1, x2)
    norm1 = jnp.maximum(jnp.linalg.vector_norm(x1, axis=dim, keepdims=True), eps)
    norm2 = jnp.maximum(jnp.linalg.vector_norm(x2, axis=dim, keepdims=True), eps)
    return jnp.sum((x1 / norm1) * (x2 / norm2), axis=dim)


def _cell_gates(x, h, w_ih, w_hh, b_ih, b_hh):
    gi, gh = x @ w_ih.T, h @ w_hh.T
    return (gi, gh) if b_ih is None else (gi + b_ih, gh + b_hh)


def lstm_update(gi, gh, c):
    """One LSTM step from W_ih x + b_ih and W_hh h + b_hh (B, 4H, gates stacked i, f, g, o as torch
    stacks them) and the cell state c (B, H) -> (h', c')."""
    i, f, g, o = jnp.split(gi + gh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def gru_update(gi, gh, h):
    """One GRU step from W_ih x + b_ih and W_hh h + b_hh (B, 3H, stacked r, z, n) and h (B, H) -> h';
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), as torch."""
    i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
    r, z = jax.nn.sigmoid(i_r + h_r), jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def _hidden_gates(h, w_hh, b_hh):
    return h @ w_hh if b_hh is None else h @ w_hh + b_hh


def lstm_scan(xw, w_hh, b_hh, h0, c0, reverse=False):
    """An LSTM layer over a sequence: xw (L, N, 4H) = x @ W_ih^T + b_ih for every step at once (as
    torch's CPU LSTM computes it), w_hh (H, 4H), h0, c0 (N, H) -> (outputs (L, N, H), h_n, c_n).
    reverse: the sequence runs backwards (a bidirectional layer's second direction); outputs stay in
    the sequence's order."""

    def step(carry, xw_t):
        h, c = lstm_update(xw_t, _hidden_gates(carry[0], w_hh, b_hh), carry[1])
        return (h, c), h

    (h, c), ys = lax.scan(step, (h0, c0), xw, reverse=reverse)
    return ys, h, c


def gru_scan(xw, w_hh, b_hh, h0, reverse=False):
    """A GRU layer over a sequence: xw (L, N, 3H) = x @ W_ih^T + b_ih, w_hh (H, 3H), h0 (N, H)
    -> (outputs (L, N, H), h_n)."""

    def step(h, xw_t):
        h = gru_update(xw_t, _hidden_gates(h, w_hh, b_hh), h)
        return h, h

    h, ys = lax.scan(step, h0, xw, reverse=reverse)
    return ys, h


def rnn_scan(xw, w_hh, b_hh, h0, nonlinearity="tanh", reverse=False):
    """An Elman RNN layer over a sequence: xw (L, N, H) = x @ W_ih^T + b_ih, w_hh (H, H), h0 (N, H)
    -> (outputs (L, N, H), h_n); h' = tanh (or relu) of xw_t + h @ w_hh + b_hh."""

    def step(h, xw_t):
        pre = xw_t + _hidden_gates(h, w_hh, b_hh)
        h = jnp.tanh(pre) if nonlinearity == "tanh" else jax.nn.relu(pre)
        return h, h

    h, ys = lax.scan(step, h0, xw, reverse=reverse)
    return ys, h


def lstm_cell(x, state, w_ih, w_hh, b_ih=None, b_hh=None):
    """torch's lstm_cell: x (B, I), state (h, c) each (B, H), gates stacked i, f, g, o -> (h', c')."""
    h, c = state
    return lstm_update(*_cell_gates(x, h, w_ih, w_hh, b_ih, b_hh), c)


def gru_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    """torch's gru_cell: x (B, I), h (B, H), gates stacked r, z, n."""
    return gru_update(*_cell_gates(x, h, w_ih, w_hh, b_ih, b_hh), h)


def rnn_cell(x, h, w_ih, w_hh, b_ih=None, b_hh=None, nonlinearity="tanh"):
    """torch's rnn_tanh_cell / rnn_relu_cell: x (B, I), h (B, H) -> h'."""
    gi, gh = _cell_gates(x, h, w_ih, w_hh, b_ih, b_hh)
    return jnp.tanh(gi + gh) if nonlinearity == "tanh" else jax.nn.relu(gi + gh)


def unfold(x, kernel_size, dilation=1, padding=0, stride=1):
    """torch's F.unfold (im2col): x (N, C, H, W) -> (N, C * kh * kw, L), rows ordered (c, i, j), L row-major."""
    kernel_size, dilation, padding, stride = (_tuple(v, 2) for v in (kernel_size, dilation, padding, stride))
    patches = lax.conv_general_dilated_patches(x, kernel_size, stride, [(p, p) for p in padding],
                                               rhs_dilation=dilation, dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                               precision=lax.Precision.HIGHEST)  # copies, exactly
    return patches.reshape(x.shape[0], patches.shape[1], -1)


def fold(columns, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """torch's F.fold (col2im): columns (N, C * kh * kw, L) -> (N, C, H, W), overlaps summed: unfold's transpose."""
    kh, kw = _tuple(kernel_size, 2)
    image = jax.ShapeDtypeStruct((columns.shape[0], columns.shape[1] // (kh * kw), *output_size), columns.dtype)
    (x,) = jax.linear_transpose(lambda im: unfold(im, kernel_size, dilation, padding, stride), image)(columns)
    return x


def affine_grid(theta, size, align_corners=False):
    """torch's affine_grid (2-D): theta (N, 2, 3), size (N, C, H, W) -> grid (N, H, W, 2), (x, y) in [-1, 1]."""

    def ramp(n):  # torch's base coordinates: pixel centres (align_corners=False) or corners
        if n <= 1:
            return jnp.zeros((n,), theta.dtype)
        points = jnp.linspace(-1.0, 1.0, n, dtype=theta.dtype)
        return points if align_corners else points * (n - 1) / n

    h, w = size[2], size[3]
    xs, ys = jnp.broadcast_to(ramp(w)[None, :], (h, w)), jnp.broadcast_to(ramp(h)[:, None], (h, w))
    base = jnp.stack([xs, ys, jnp.ones_like(xs)], axis=-1)
    return jnp.einsum("hwk,njk->nhwj", base, theta)


def grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """torch's grid_sample, 2-D or 3-D: x (N, C, *S), grid (N, *So, n) of coordinates in [-1, 1]
    ordered (x, y[, z]), the last spatial axis first -> (N, C, *So).

    mode 'bilinear' (trilinear in 3-D) or 'nearest' (half to even, as torch's nearbyint);
    padding_mode 'zeros', 'border' or 'reflection'.
    """
    spatial = x.shape[2:]
    n = len(spatial)

    def pixels(coord, size):
        coord = (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
        if padding_mode == "reflection":  # mirrored at the corner pixels' centres (align_corners) or edges
            low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
            if span > 0:
                distance = jnp.abs(coord - low)
                flips, extra = jnp.floor(distance / span), jnp.fmod(distance, span)
                coord = jnp.where(flips % 2 == 0, low + extra, low + span - extra)
            else:
                coord = jnp.zeros_like(coord)
        if padding_mode in ("border", "reflection"):
            coord = jnp.clip(coord, 0, size - 1)
        return coord

    where = [pixels(grid[..., n - 1 - axis], size) for axis, size in enumerate(spatial)]

    def tap(index):
        """x at integer positions `index` (one (N, *So) array per spatial axis) -> (N, C, *So); zero outside."""
        inside = functools.reduce(jnp.logical_and, [(i >= 0) & (i <= size - 1) for i, size in zip(index, spatial)])
        index = [jnp.clip(i, 0, size - 1).astype(jnp.int32) for i, size in zip(index, spatial)]
        values = jax.vmap(lambda image, *i: image[(slice(None), *i)])(x, *index)
        return jnp.where(inside[:, None], values, 0)

    if mode == "nearest":
        return tap([jnp.round(w) for w in where])
    low = [jnp.floor(w) for w in where]
    out = 0
    for corner in itertools.product((0, 1), repeat=n):  # each of the 2^n neighbours, weighted by its nearness
        weight = functools.reduce(jnp.multiply, [(w - f) if up else (1 - (w - f)) for w, f, up in zip(where, low, corner)])
        out = out + tap([f + up for f, up in zip(low, corner)]) * weight[:, None]
    return out


def scatter(x, dim, index, src, reduce=None, include_self=True):
    """torch's scatter / scatter_add / scatter_reduce along `dim`: out[..., index[i, j], ...] = src[i, j]
    (index replaces the dim-th coordinate; src cut to index's shape). reduce "sum", "prod", "mean",
    "amax" or "amin" combines what lands on one place, with x's own value unless include_self=False."""
    grid = list(jnp.indices(index.shape, sparse=True))
    grid[dim] = index
    where = tuple(grid)
    if jnp.ndim(src):
        src = src[tuple(slice(0, n) for n in index.shape)]
    if reduce is None:
        return x.at[where].set(src)
    identity = {"sum": 0, "mean": 0, "prod": 1, "amax": -jnp.inf, "amin": jnp.inf}[reduce]
    if jnp.issubdtype(x.dtype, jnp.integer) and reduce in ("amax", "amin"):
        info = jnp.iinfo(x.dtype)
        identity = info.min if reduce == "amax" else info.max
    base = x if include_self else x.at[where].set(identity)
    combine = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "max", "amin": "min"}[reduce]
    out = getattr(base.at[where], combine)(src)
    if reduce != "mean":
        return out
    count = jnp.zeros(x.shape, x.dtype).at[where].add(1) + (1 if include_self else 0)
    count = jnp.maximum(count, 1)
    return out // count if jnp.issubdtype(x.dtype, jnp.integer) else out / count


def columns_channels_last(weight, chw):
    """A Linear weight (out, C * H * W) with torch's (c, h, w) column order -> its columns in
    (h, w, c) order, for a Linear that reads a channels-last flatten of a (C, H, W) map."""
    c, h, w = chw
    return weight.reshape(-1, c, h, w).transpose(0, 2, 3, 1).reshape(weight.shape)


def _tuple(v, n):
    return tuple(v) * (n if len(tuple(v)) == 1 else 1) if isinstance(v, (tuple, list)) else (v,) * n


def _reduce(loss, reduction):
    """torch's reduction enum (0 none, 1 mean, 2 sum) or name."""
    reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
    return loss if reduction == "none" else (jnp.mean(loss) if reduction == "mean" else jnp.sum(loss))


def nll_loss(log_probs, target, weight=None, reduction="mean", ignore_index=-100):
    """torch's nll_loss: log_probs (N, C, *d) or (C,), target (N, *d) class ids.

    The mean divides by the summed weights of the targets that are not ignore_index.
    """
    class_axis = 1 if log_probs.ndim > 1 else 0
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0)
    picked = jnp.take_along_axis(log_probs, jnp.expand_dims(safe, class_axis), axis=class_axis)
    picked = jnp.squeeze(picked, class_axis)
    w = jnp.where(keep, 1.0 if weight is None else weight[safe], 0.0).astype(log_probs.dtype)
    loss = -picked * w
    reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
    if reduction == "mean":
        return jnp.sum(loss) / jnp.sum(w)
    return _reduce(loss, reduction)


def multilabel_margin_loss(x, target, reduction="mean"):
    """torch's multilabel_margin_loss: x (N, C) or (C,) scores (a 0-d x is one class), target the
    same shape holding class ids up to the first -1; each target's hinge against every non-target, over C."""
    x, target = jnp.atleast_1d(x), jnp.atleast_1d(target)
    classes = x.shape[-1]
    valid = jnp.cumprod(target != -1, axis=-1).astype(bool)
    safe = jnp.where(valid, target, 0)
    is_target = jnp.any(valid[..., :, None] & (safe[..., :, None] == jnp.arange(classes)), axis=-2)
    picked = jnp.take_along_axis(x, safe, axis=-1)
    hinge = jnp.maximum(0.0, 1.0 - picked[..., :, None] + x[..., None, :])
    pairs = valid[..., :, None] & ~is_target[..., None, :]
    return _reduce(jnp.sum(jnp.where(pairs, hinge, 0.0), axis=(-2, -1)) / classes, reduction)


def cross_entropy(logits, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    """torch's F.cross_entropy with class-id targets (log_softmax over axis 1, then nll_loss),
    or class-probability targets when target has the logits' shape."""
    class_axis = 1 if logits.ndim > 1 else 0
    log_probs = jax.nn.log_softmax(logits, axis=class_axis)
    classes = logits.shape[class_axis]
    if target.shape == logits.shape:  # probabilities
        probs = target * (1 - label_smoothing) + label_smoothing / classes
        w = 1.0 if weight is None else weight.reshape((-1,) + (1,) * (logits.ndim - class_axis - 1))
        loss = -jnp.sum(probs * log_probs * w, axis=class_axis)
        reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
        return jnp.mean(loss) if reduction == "mean" else _reduce(loss, reduction)
    loss = nll_loss(log_probs, target, weight, reduction, ignore_index)
    if label_smoothing == 0.0:
        return loss
    # torch: (1 - s) * nll + s * (the mean over classes of -log p, weighted), same reduction
    keep = target != ignore_index
    w = 1.0 if weight is None else weight.reshape((-1,) + (1,) * (logits.ndim - class_axis - 1))
    smooth = jnp.where(keep, -jnp.sum(log_probs * w, axis=class_axis), 0.0)
    reduction = {0: "none", 1: "mean", 2: "sum"}.get(reduction, reduction)
    if reduction == "mean":
        denom = jnp.sum(keep) if weight is None else jnp.sum(jnp.where(keep, weight[jnp.where(keep, target, 0)], 0))
        smooth = jnp.sum(smooth) / denom
    else:
        smooth = _reduce(smooth, reduction)
    return (1 - label_smoothing) * loss + label_smoothing / classes * smooth


def binary_cross_entropy_with_logits(logits, target, weight=None, pos_weight=None, reduction="mean"):
    """torch's stable form: (1 - y) x + (1 + (p - 1) y) (log1p(exp(-|x|)) + max(-x, 0)) (docs/porting.md, entry 18)."""
    if pos_weight is None:
        loss = (1 - target) * logits + jax.nn.softplus(-logits)
    else:
        log_weight = 1 + (pos_weight - 1) * target
        loss = (1 - target) * logits + log_weight * (jnp.log1p(jnp.exp(-jnp.abs(logits))) + jnp.maximum(-logits, 0))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy(probs, target, weight=None, reduction="mean"):
    """torch's binary_cross_entropy: logs clamped at -100, as torch does."""
    loss = -(target * jnp.maximum(jnp.log(probs), -100) + (1 - target) * jnp.maximum(jnp.log1p(-probs), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)
