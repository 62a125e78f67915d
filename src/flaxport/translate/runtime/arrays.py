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
