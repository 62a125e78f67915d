"""torch's array ops that jnp has no one call for, written to be copied into a generated model file.

Like runtime/functions.py: each function imports only jax, jax.numpy, numpy and math, takes
torch's arguments, and the emitter copies the ones a model uses.
"""
import jax
import jax.numpy as jnp
from jax import lax


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
    return values, indices.astype(jnp.int64 if jax.config.jax_enable_x64 else jnp.int32)


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
                  padding_idx=None):
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
