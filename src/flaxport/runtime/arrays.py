"""torch's array ops that jnp has no one call for, written to be copied into a generated model file.

Like runtime/functions.py: each function imports only jax, jax.numpy, numpy and math, takes
torch's arguments, and the emitter copies the ones a model uses.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flaxport.runtime.functions import _ceil_extra, _lowest, _tuple


def _index_dtype():
    """torch's int64 indices where JAX holds 64-bit integers (jax_enable_x64), else int32."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def as_strided(x, size, stride, storage_offset=0):
    """torch.as_strided of a contiguous tensor: element [i, j, ...] is x's flat element
    storage_offset + i * stride[0] + j * stride[1] + ... ; -> shape `size`."""
    index = storage_offset
    for axis, (n, step) in enumerate(zip(size, stride)):
        index = index + (jnp.arange(n) * step).reshape((-1,) + (1,) * (len(size) - axis - 1))
    return x.reshape(-1)[index]


def as_strided_scatter(x, src, size, stride, storage_offset=0):
    """torch.as_strided_scatter of a contiguous tensor: x with the elements as_strided would read set to src."""
    index = storage_offset
    for axis, (n, step) in enumerate(zip(size, stride)):
        index = index + (jnp.arange(n) * step).reshape((-1,) + (1,) * (len(size) - axis - 1))
    return x.reshape(-1).at[index].set(src).reshape(x.shape)


def cumulative_extreme(x, axis, largest=True):
    """torch.cummax / torch.cummin: (running extreme, index of its latest occurrence) along axis."""
    values = (lax.cummax if largest else lax.cummin)(x, axis=axis % x.ndim)
    positions = lax.broadcasted_iota(jnp.int32, x.shape, axis % x.ndim)
    held = (x == values) | jnp.isnan(x)
    indices = lax.cummax(jnp.where(held, positions, 0), axis=axis % x.ndim)
    return values, indices.astype(_index_dtype())


def cdist(x1, x2, p=2.0):
    """torch.cdist: p-norm distances between the rows of x1 (..., P, M) and x2 (..., R, M) -> (..., P, R)."""
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    if p == 0:
        return jnp.sum(diff != 0, axis=-1).astype(x1.dtype)
    return jnp.linalg.vector_norm(diff, ord=p, axis=-1)


def pdist(x, p=2.0):
    """torch.pdist: the p-norm distances between every pair of rows i < j of x (N, M), row-major."""
    i, j = jnp.triu_indices(x.shape[0], k=1)
    return cdist(x[i][:, None], x[j][:, None], p)[:, 0, 0]


def embedding_bag(weight, indices, offsets, mode="mean", per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):  # torch's default mode is "mean"
    """torch's F.embedding_bag: sums / means / maxes of the embeddings of each bag. 2-D indices
    (B, N) are B bags of N; 1-D indices are cut into bags at `offsets`. -> (bags, D)."""
    if indices.ndim == 2:
        offsets = jnp.arange(0, indices.size, indices.shape[1])
        indices = indices.reshape(-1)
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    # the bag of each index: how many bag starts after the first it has reached (past the last bag: dropped)
    bag = jnp.searchsorted(offsets[1:], jnp.arange(indices.shape[0]), side="right")
    rows = weight[indices]
    keep = jnp.ones(indices.shape, bool) if padding_idx is None else indices != padding_idx
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    if mode == "max":
        rows = jnp.where(keep[:, None], rows, -jnp.inf)
        out = jax.ops.segment_max(rows, bag, num_segments=bags)
        return jnp.where(jnp.isneginf(out), 0, out)
    rows = jnp.where(keep[:, None], rows, 0)
    out = jax.ops.segment_sum(rows, bag, num_segments=bags)
    if mode == "mean":
        count = jax.ops.segment_sum(keep.astype(rows.dtype), bag, num_segments=bags)
        out = out / jnp.maximum(count, 1)[:, None]
    return out


def lu_unpack(lu, pivots):
    """torch.lu_unpack: (P, L, U) with A = P @ L @ U from a packed LU factorisation (..., M, N) and
    LAPACK's pivots (counted from 1)."""
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    order = lax.linalg.lu_pivots_to_permutation(pivots - 1, m)  # A[..., order, :] = L @ U
    return jnp.swapaxes(jax.nn.one_hot(order, m, dtype=lu.dtype), -1, -2), lower, upper


def lu_solve(lu, pivots, b, left=True, adjoint=False):
    """torch.linalg.lu_solve: X with A X = B (A^H X = B if adjoint; X A = B if not left), A = P L U packed
    in lu with LAPACK's pivots (counted from 1); B (..., N, K)."""
    if not left:  # X A = B  <=>  A^H X^H = B^H
        bh = jnp.conj(jnp.swapaxes(b, -1, -2))
        return jnp.conj(jnp.swapaxes(lu_solve(lu, pivots, bh, True, not adjoint), -1, -2))
    return jax.scipy.linalg.lu_solve((lu, pivots - 1), b, trans=2 if adjoint else 0)


def pinv_hermitian(a, rtol=None):
    """torch.linalg.pinv(hermitian=True): from the eigendecomposition of a's lower triangle (the part
    torch reads), eigenvalues below rtol * the largest (default eps * N) taken as zero."""
    w, v = jnp.linalg.eigh(a, symmetrize_input=False)
    rtol = a.shape[-1] * jnp.finfo(a.dtype).eps if rtol is None else rtol
    kept = jnp.abs(w) > rtol * jnp.max(jnp.abs(w), axis=-1, keepdims=True, initial=0)
    inverse = jnp.where(kept, 1 / jnp.where(kept, w, 1), 0)
    return (v * inverse[..., None, :]) @ jnp.conj(jnp.swapaxes(v, -1, -2))


def ormqr(a, tau, other, left=True, transpose=False):
    """torch.ormqr: other multiplied by the full orthogonal Q (M, M) whose Householder reflectors
    are a's columns (geqrf's output) and tau; Q^H where transpose, Q on the right where not left."""
    m, n = a.shape[-2:]
    # reflectors with tau = 0 are the identity: padding gives the full Q
    a = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, max(m - n, 0))])[..., :m]
    tau = jnp.pad(tau, [(0, 0)] * (tau.ndim - 1) + [(0, m - tau.shape[-1])])
    q = lax.linalg.householder_product(a, tau)
    if transpose:
        q = jnp.conj(jnp.swapaxes(q, -1, -2))
    return q @ other if left else other @ q


def orthogonal_polynomial(kind, x, n):
    """torch.special's orthogonal polynomial `kind` ('chebyshev_t', 'hermite_he', 'shifted_chebyshev_u',
    'laguerre_l', 'legendre_p', ...) of degree n (truncated to an integer; 0 below degree 0) at x,
    elementwise by its three-term recurrence."""
    dtype = jnp.result_type(x, n, float)
    x, n = jnp.broadcast_arrays(jnp.asarray(x, dtype), jnp.trunc(n).astype(jnp.int32))
    if kind.startswith("shifted_"):
        x, kind = 2 * x - 1, kind[len("shifted_"):]
    one = jnp.ones_like(x)
    first = {"chebyshev_t": x, "chebyshev_u": 2 * x, "chebyshev_v": 2 * x - 1, "chebyshev_w": 2 * x + 1,
             "hermite_h": 2 * x, "hermite_he": x, "laguerre_l": 1 - x, "legendre_p": x}[kind]

    def step(k, previous, current):  # P_{k+1} from P_k and P_{k-1}
        if kind.startswith("chebyshev"):
            return 2 * x * current - previous
        if kind == "hermite_h":
            return 2 * x * current - 2 * k * previous
        if kind == "hermite_he":
            return x * current - k * previous
        if kind == "laguerre_l":
            return ((2 * k + 1 - x) * current - k * previous) / (k + 1)
        return ((2 * k + 1) * x * current - k * previous) / (k + 1)

    def body(state):
        k, previous, current, out = state
        following = step(k.astype(dtype), previous, current)
        return k + 1, current, following, jnp.where(n == k + 1, following, out)

    out = jnp.where(n == 0, one, jnp.where(n == 1, first, 0))
    top = jnp.max(n, initial=1)
    return lax.while_loop(lambda state: state[0] < top, body, (jnp.int32(1), one, first, out))[3]


def polygamma(n, x):
    """torch.polygamma for any real x: digamma (n = 0); trigamma by its reflection
    -trigamma(1 - x) + (pi / sin(pi x))^2 below 1/2 (n = 1); (-1)^(n+1) n! zeta(n + 1, x) above, the
    Hurwitz zeta lifted to positive x by zeta(s, q) = q^-s + zeta(s, q + 1)."""
    if n == 0:
        return jax.scipy.special.digamma(x)
    if n == 1:
        reflected = -jax.scipy.special.polygamma(1, 1 - x) + (jnp.pi / jnp.sin(jnp.pi * x)) ** 2
        return jnp.where(x < 0.5, reflected, jax.scipy.special.polygamma(1, x))

    def lift(state):
        q, head = state
        below = q <= 0
        return jnp.where(below, q + 1, q), head + jnp.where(below, q ** -(n + 1.0), 0)

    q, head = lax.while_loop(lambda state: jnp.any(state[0] <= 0), lift, (x, jnp.zeros_like(x)))
    sign = 1 if n % 2 else -1
    return sign * jnp.exp(jax.scipy.special.gammaln(n + 1.0)) * (head + jax.scipy.special.zeta(n + 1.0, q))


def bessel_j(order, x):
    """torch.special.bessel_j0 / bessel_j1: J_n(x) = (1 / 2 pi) times the integral over a period of
    cos(n t - x sin t), by the trapezoid rule on 128 points, which for a periodic integrand is exact
    to rounding for |x| up to about 60 (jax.scipy.special.bessel_jn is NaN in float32)."""
    t = jnp.arange(128, dtype=x.dtype) * (2 * jnp.pi / 128)
    return jnp.mean(jnp.cos(order * t - x[..., None] * jnp.sin(t)), axis=-1)


def searchsorted(sorted_sequence, values, side="left", sorter=None):
    """torch.searchsorted: a 1-D sorted_sequence for every value, or one sorted row (..., M) for the
    values (..., K) of the same leading index; `sorter` the indices that sort each row."""
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    if sorted_sequence.ndim == 1:
        return jnp.searchsorted(sorted_sequence, values, side=side)
    search = jnp.vectorize(lambda row, v: jnp.searchsorted(row, v, side=side), signature="(m),(k)->(k)")
    return search(sorted_sequence, values)


def masked_scatter(x, mask, source):
    """torch.masked_scatter: x where mask is false; where it is true, source's elements in row-major order."""
    mask = jnp.broadcast_to(mask, x.shape)
    position = jnp.cumsum(mask.reshape(-1)) - 1  # the source element each true place takes
    taken = source.reshape(-1)[jnp.clip(position, 0, source.size - 1)].reshape(x.shape)
    return jnp.where(mask, taken, x)


def index_put_mask(x, mask, values, accumulate=False):
    """x[mask] = values (+= where accumulate) for a boolean mask over x's leading dims: values hold one
    row for each true place in row-major order, or one row for all of them."""
    rest = x.shape[mask.ndim:]
    rows = values.reshape((1,) * (1 + len(rest) - values.ndim) + values.shape)
    rows = jnp.broadcast_to(rows, rows.shape[:1] + rest).astype(x.dtype)
    position = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, rows.shape[0] - 1)  # the row each true place takes
    taken = rows[position].reshape(x.shape)
    where = mask.reshape(mask.shape + (1,) * len(rest))
    return jnp.where(where, x + taken if accumulate else taken, x)


def max_pool_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """The indices torch's max_pool1d/2d/3d(return_indices=True) gives, x (N, C, *S): each window's
    first maximum as a flat position in its (N, C) plane (row-major over S)."""
    n = len(kernel_size)
    stride = _tuple(stride or kernel_size, n)
    padding, dilation = _tuple(padding, n), _tuple(dilation, n)
    spatial = x.shape[x.ndim - n:]
    positions = jnp.broadcast_to(jnp.arange(math.prod(spatial)).reshape(spatial), x.shape)
    pads = [(0, 0)] * (x.ndim - n) + [(p, p + _ceil_extra(size, k, s, p, d, ceil_mode))
                                      for size, k, s, p, d in zip(spatial, kernel_size, stride, padding, dilation)]

    def first_maximum(a, b):  # the larger value; on a tie (or NaN: torch takes it) the earlier position
        (va, pa), (vb, pb) = a, b
        take = (vb > va) | ((vb == va) & (pb < pa)) | (jnp.isnan(vb) & ~jnp.isnan(va))
        return jnp.where(take, vb, va), jnp.where(take, pb, pa)

    ones = (1,) * (x.ndim - n)
    _, found = lax.reduce_window((x, positions), (_lowest(x.dtype), jnp.asarray(positions.size, positions.dtype)),
                                 first_maximum, ones + tuple(kernel_size), ones + tuple(stride), pads,
                                 window_dilation=ones + tuple(dilation))
    return found


def adaptive_max_pool_indices(x, output_size):
    """The indices torch's adaptive_max_pool1d/2d/3d(return_indices=True) gives: each window's first
    maximum as a flat position in its (N, C) plane (torch's windows: floor(i * size / out) to
    ceil((i + 1) * size / out))."""
    n = len(output_size)
    spatial = x.shape[x.ndim - n:]
    index, flat = [], 0
    for axis, (size, out) in enumerate(zip(spatial, output_size)):
        starts = np.array([(i * size) // out for i in range(out)])
        ends = np.array([-(-((i + 1) * size) // out) for i in range(out)])
        # each window as `width` positions (a short window repeats its last: the first maximum stays)
        where = np.minimum(starts[:, None] + np.arange(max(ends - starts)), ends[:, None] - 1)
        shape = [1] * (2 * n)
        shape[axis], shape[n + axis] = out, where.shape[1]
        index.append(where.reshape(shape))  # axes (out_0, ..., out_n-1, width_0, ..., width_n-1)
        flat = flat * size + index[-1]
    windows = x[(...,) + tuple(index)].reshape(x.shape[:x.ndim - n] + tuple(output_size) + (-1,))
    flat = jnp.broadcast_to(flat, tuple(output_size) + flat.shape[n:]).reshape(tuple(output_size) + (-1,))
    first = jnp.argmax(windows, axis=-1)  # the first maximum (NaN counts as the maximum, as in torch)
    return jnp.take_along_axis(jnp.broadcast_to(flat, windows.shape), first[..., None], axis=-1)[..., 0]


def max_unpool(x, indices, output_size):
    """torch's max_unpool1d/2d/3d: zeros of (N, C, *output_size) with each value of x (N, C, *S) put at
    the flat position of its plane that indices give."""
    lead = x.shape[:x.ndim - len(output_size)]
    planes = jnp.zeros(lead + (math.prod(output_size),), x.dtype)
    plane = jnp.indices(lead + (1,), sparse=True)[:-1]  # (N, 1, 1), (1, C, 1): each value's own plane
    flat = planes.at[(*plane, indices.reshape(lead + (-1,)))].set(x.reshape(lead + (-1,)))
    return flat.reshape(lead + tuple(output_size))


def fractional_max_pool(x, kernel_size, output_size, samples):
    """torch's fractional_max_pool2d/3d with its random samples (N, C, n) in [0, 1): (values,
    indices) of (N, C, *output_size) (or (C, ...)). Along each axis window i starts at
    floor((i + u) * alpha) - floor(u * alpha), alpha = (size - kernel) / (out - 1), the last at
    size - kernel; u is the plane's sample for the axis (torch's order: W, H for 2-d; T, H, W for 3-d)."""
    n = len(kernel_size)
    lead, spatial = x.shape[:x.ndim - n], x.shape[x.ndim - n:]
    samples = samples.reshape(lead + (n,)).astype(x.dtype)
    which = (1, 0) if n == 2 else tuple(range(n))
    flat = 0
    for axis, (size, out, kernel) in enumerate(zip(spatial, output_size, kernel_size)):
        u = samples[..., which[axis], None]
        alpha = jnp.asarray((size - kernel) / max(out - 1, 1), x.dtype)
        starts = (jnp.floor((jnp.arange(out - 1, dtype=x.dtype) + u) * alpha) - jnp.floor(u * alpha)).astype(jnp.int32)
        starts = jnp.concatenate([starts, jnp.full(lead + (1,), size - kernel, jnp.int32)], axis=-1)
        where = starts[..., :, None] + jnp.arange(kernel)  # lead + (out, kernel)
        shape = lead + tuple(out if a == axis else 1 for a in range(n)) + tuple(
            kernel if a == axis else 1 for a in range(n))
        flat = flat * size + where.reshape(shape)  # lead + (out_0, ..., out_n-1, kernel_0, ..., kernel_n-1)
    flat = jnp.broadcast_to(flat, lead + tuple(output_size) + tuple(kernel_size)).reshape(
        lead + tuple(output_size) + (-1,))
    planes = x.reshape(lead + (-1,))
    windows = jnp.take_along_axis(planes, flat.reshape(lead + (-1,)), axis=-1).reshape(flat.shape)
    first = jnp.argmax(windows, axis=-1)[..., None]  # the first maximum, as torch's strict '>' scan
    return (jnp.take_along_axis(windows, first, axis=-1)[..., 0],
            jnp.take_along_axis(flat, first, axis=-1)[..., 0].astype(_index_dtype()))


def most_frequent(x, axis=-1, keepdims=False):
    """torch.mode: (the most frequent value along `axis`, the smallest among equally frequent ones;
    the last index holding it)."""
    x = jnp.moveaxis(jnp.atleast_1d(x), axis, -1)
    ordered = jnp.sort(x, axis=-1)
    frequency = jnp.sum(ordered[..., :, None] == ordered[..., None, :], axis=-1)
    value = jnp.take_along_axis(ordered, jnp.argmax(frequency, axis=-1)[..., None], axis=-1)
    index = jnp.max(jnp.where(x == value, jnp.arange(x.shape[-1]), -1), axis=-1, keepdims=True)
    if not keepdims:
        value, index = value[..., 0], index[..., 0]
    else:
        value, index = jnp.moveaxis(value, -1, axis), jnp.moveaxis(index, -1, axis)
    return value, index.astype(_index_dtype())


def segment_reduce(data, reduce, lengths, initial=None):
    """torch's segment_reduce along axis 0: `data` cut into consecutive segments of `lengths` (1-D),
    each reduced ('sum', 'mean', 'max', 'min', 'prod') to one value; `initial` joins every segment
    (an empty one is `initial`, else the reduction's identity, NaN for a mean)."""
    ids = jnp.searchsorted(jnp.cumsum(lengths), jnp.arange(data.shape[0]), side="right")
    segment = {"sum": jax.ops.segment_sum, "mean": jax.ops.segment_sum, "max": jax.ops.segment_max,
               "min": jax.ops.segment_min, "prod": jax.ops.segment_prod}[reduce]
    out = segment(data, ids, num_segments=lengths.shape[0])
    counts = lengths.reshape((-1,) + (1,) * (data.ndim - 1)).astype(out.dtype)
    if initial is not None:
        combine = {"sum": jnp.add, "mean": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}
        out = combine[reduce](out, initial)
    if reduce == "mean":
        out = out / counts if initial is None else jnp.where(counts == 0, initial, out / counts)
    return out


def histogramdd(x, bins, bounds=None, weight=None, density=False):
    """torch.histogramdd: points x (..., D) counted on a grid of `bins` per dimension over `bounds`
    (torch's range: (min, max) pairs flattened; the data's own span when None) -> (counts, [edges of
    each dimension])."""
    dims = x.shape[-1]
    pairs = None if bounds is None else [tuple(bounds[i:i + 2]) for i in range(0, len(bounds), 2)]
    counts, edges = jnp.histogramdd(x.reshape(-1, dims), bins, range=pairs,
                                    weights=None if weight is None else weight.reshape(-1), density=density)
    return counts.astype(x.dtype), [e.astype(x.dtype) for e in edges]
