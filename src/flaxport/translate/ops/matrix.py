"""Matrix functions (torch.linalg and its older names): inverses, solves, factorisations, norms, as jnp.linalg.

Both frameworks call LAPACK on a CPU, so factorisations that are unique only up to signs (QR,
SVD, eigenvectors) come out with torch's signs there. torch's `info` outputs (the *_ex ops,
with check_errors=False) are zeros: JAX returns NaNs where LAPACK would report a failure.
"""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, MUL, Expr, Outputs, Unsupported, binary, call, op


def _mT(x: Expr) -> Expr:
    """The matrix transpose of a batch of matrices (..., M, N) -> (..., N, M)."""
    return Expr(f"jnp.swapaxes({x}, -1, -2)")


def _info(c, i):
    """torch's LAPACK status output: zeros of its shape (int32)."""
    return call("jnp.zeros", c.size(list(c.out[i].shape)), "jnp.int32")


@op("aten.linalg_inv.default")
def inv(c, node):
    return call("jnp.linalg.inv", c.x("A"))


@op("aten.linalg_inv_ex.default")
def inv_ex(c, node):
    return Outputs((call("jnp.linalg.inv", c.x("A")), _info(c, 1)))


@op("aten.linalg_det.default", "aten.det.default")
def det(c, node):
    return call("jnp.linalg.det", c.x("A" if c.has("A") else "self"))


@op("aten.logdet.default")
def logdet(c, node):
    """log(det): NaN for a negative determinant, as torch."""
    return call("jnp.log", call("jnp.linalg.det", c.x("self")))


@op("aten.linalg_slogdet.default", "aten.slogdet.default")
def slogdet(c, node):
    result = call("jnp.linalg.slogdet", c.x("A" if c.has("A") else "self"))
    return Outputs((Expr(f"{result}.sign"), Expr(f"{result}.logabsdet")))


def _vector_rhs(c, a="A", b="B") -> bool:
    """torch reads B as a batch of vectors when it has one dim less than A and A's batch and rows as shape."""
    av, bv = c.val(a), c.val(b)
    return bv.ndim == 1 or (bv.ndim == av.ndim - 1 and tuple(bv.shape) == tuple(av.shape[:-1]))


def _solve(c, a: Expr, b: Expr, left: bool, vector: bool) -> Expr:
    if vector:
        return Expr(f"{call('jnp.linalg.solve', a, Expr(f'{b.at(ATOM)}[..., None]')).text}[..., 0]")
    if left:
        return call("jnp.linalg.solve", a, b)
    return _mT(call("jnp.linalg.solve", _mT(a), _mT(b)))  # X A = B  <=>  A^T X^T = B^T


@op("aten.linalg_solve.default")
def solve(c, node):
    left = c.raw("left") if c.has("left") else True
    return _solve(c, c.x("A"), c.x("B"), left, _vector_rhs(c))


@op("aten.linalg_solve_ex.default")
def solve_ex(c, node):
    left = c.raw("left") if c.has("left") else True
    return Outputs((_solve(c, c.x("A"), c.x("B"), left, _vector_rhs(c)), _info(c, 1)))


def _cholesky(c, name, upper) -> Expr:
    lower = call("jnp.linalg.cholesky", c.x(name))
    return call("jnp.conj", _mT(lower)) if upper and c.val(name).is_complex() else (_mT(lower) if upper else lower)


@op("aten.linalg_cholesky.default", "aten.cholesky.default")
def cholesky(c, node):
    return _cholesky(c, "self", bool(c.raw("upper")))


@op("aten.linalg_cholesky_ex.default")
def cholesky_ex(c, node):
    return Outputs((_cholesky(c, "self", bool(c.raw("upper"))), _info(c, 1)))


@op("aten.cholesky_solve.default")
def cholesky_solve(c, node):
    """cholesky_solve(B, L, upper): solves A X = B for A = L L^H (or U^H U)."""
    return call("jax.scipy.linalg.cho_solve", Expr(f"({c.x('input2')}, {not c.raw('upper')})"), c.x("self"))


@op("aten.cholesky_inverse.default")
def cholesky_inverse(c, node):
    factor = c.x("self")
    product = binary(c, _mT(factor), "@", factor, MUL) if c.raw("upper") else \
        binary(c, factor, "@", _mT(factor), MUL)
    return call("jnp.linalg.inv", product)


@op("aten.linalg_qr.default")
def qr(c, node):
    mode = c.raw("mode") if c.has("mode") else "reduced"
    if mode == "r":
        return Outputs((call("jnp.zeros", "(0,)", c.dtype(c.out[0].dtype)), call("jnp.linalg.qr", c.x("A"), mode="'r'")))
    result = call("jnp.linalg.qr", c.x("A"), mode=repr(mode) if mode != "reduced" else None)
    return Outputs((Expr(f"{result.at(ATOM)}[0]"), Expr(f"{result.at(ATOM)}[1]")))


@op("aten.qr.default")
def qr_old(c, node):
    some = c.raw("some") if c.has("some") else True
    result = call("jnp.linalg.qr", c.x("self"), mode=None if some else "'complete'")
    return Outputs((Expr(f"{result.at(ATOM)}[0]"), Expr(f"{result.at(ATOM)}[1]")))


@op("aten.linalg_svd.default")
def svd(c, node):
    return Outputs((SINGULAR_VECTORS, call("jnp.linalg.svd", c.x("A"), compute_uv="False"), SINGULAR_VECTORS))


@op("aten.svd.default")
def svd_old(c, node):
    """torch.svd: (U, S, V)."""
    return Outputs((SINGULAR_VECTORS, call("jnp.linalg.svd", c.x("self"), compute_uv="False"), SINGULAR_VECTORS))


@op("aten.linalg_svdvals.default")
def svdvals(c, node):
    return call("jnp.linalg.svd", c.x("A"), compute_uv="False")


# Eigenvectors and singular vectors are unique only up to a sign (a phase) each, and JAX's LAPACK picks
# others than torch's for some matrices.
EIGENVECTORS = Unsupported("eigenvectors, unique only up to sign, come out with other signs than torch's; "
                           "use eigenvalues, or normalise the vectors' signs after the call")
SINGULAR_VECTORS = Unsupported("singular vectors, unique only up to sign, come out with other signs than "
                               "torch's; use singular values (svdvals), or normalise the vectors' signs after the call")


@op("aten.linalg_eig.default")
def eig(c, node):
    return Outputs((call("jnp.linalg.eigvals", c.x("self")), EIGENVECTORS))


@op("aten.linalg_eigvals.default")
def eigvals(c, node):
    return call("jnp.linalg.eigvals", c.x("self"))


@op("aten.linalg_eigh.default")
def eigh(c, node):
    uplo = c.raw("UPLO") if c.has("UPLO") else "L"
    result = call("jnp.linalg.eigh", c.x("self"), UPLO=repr(uplo) if uplo != "L" else None, symmetrize_input="False")
    return Outputs((Expr(f"{result.at(ATOM)}[0]"), EIGENVECTORS))


@op("aten.linalg_eigvalsh.default")
def eigvalsh(c, node):
    """torch reads only the UPLO triangle (jnp.linalg.eigvalsh averages the matrix with its transpose)."""
    uplo = c.raw("UPLO") if c.has("UPLO") else "L"
    result = call("jnp.linalg.eigh", c.x("self"), UPLO=repr(uplo) if uplo != "L" else None, symmetrize_input="False")
    return Expr(f"{result.at(ATOM)}[0]")


def _tolerance(c, name):
    v = c.raw(name) if c.has(name) else None
    return None if v is None else c.x(name)


@op("aten.linalg_pinv.atol_rtol_tensor", "aten.linalg_pinv.atol_rtol_float", "aten.linalg_pinv.default",
    "aten.pinverse.default")
def pinv(c, node):
    """Singular values below max(atol, rtol * largest) count as zero; torch's default rtol (no atol, no
    rtol given) is eps * max(M, N), as jnp's."""
    x = c.x("self")
    hermitian = "True" if c.has("hermitian") and c.raw("hermitian") else None
    if c.has("rcond"):  # pinverse(rcond) / linalg_pinv(rcond): a relative cut-off
        return call("jnp.linalg.pinv", x, rtol=c.x("rcond"), hermitian=hermitian)
    atol, rtol = _tolerance(c, "atol"), _tolerance(c, "rtol")
    if atol is not None:
        raise Unsupported("pinv with an absolute tolerance (atol)")
    if hermitian:  # torch reads one triangle, jnp averages the matrix with its transpose
        return call(c.helper("pinv_hermitian"), x, rtol=rtol)
    return call("jnp.linalg.pinv", x, rtol=rtol)


@op("aten.linalg_matrix_rank.atol_rtol_tensor", "aten.linalg_matrix_rank.atol_rtol_float",
    "aten.linalg_matrix_rank.default", "aten.linalg_matrix_rank.tol_tensor")
def matrix_rank(c, node):
    """The number of singular values above max(atol, rtol * largest)."""
    name = "input" if c.has("input") else "self"
    x = c.x(name)
    shape = c.val(name).shape
    if 0 in tuple(shape[-2:]):  # an empty matrix has rank 0 (jnp finds no largest singular value)
        return call("jnp.zeros", c.size(list(shape[:-2]), hint="shape"), "jnp.int64")
    if c.has("tol"):
        return call("jnp.linalg.matrix_rank", x, tol=c.x("tol"))
    atol, rtol = _tolerance(c, "atol"), _tolerance(c, "rtol")
    if atol is not None:
        raise Unsupported("matrix_rank with an absolute tolerance (atol)")
    return call("jnp.linalg.matrix_rank", x, rtol=rtol)


@op("aten.linalg_matrix_power.default")
def matrix_power(c, node):
    return call("jnp.linalg.matrix_power", c.x("self"), c.lit(c.raw("n"), "n"))


@op("aten.linalg_multi_dot.default")
def multi_dot(c, node):
    items = [c.x_item("tensors", i) for i in range(len(c.raw("tensors")))]
    return call("jnp.linalg.multi_dot", Expr("[" + ", ".join(i.text for i in items) + "]"))


def _norm_ord(c, name):
    v = c.raw(name) if c.has(name) else None
    if v is None:
        return None
    return repr(v) if isinstance(v, str) else c.lit(v, name)


@op("aten.linalg_matrix_norm.default", "aten.linalg_matrix_norm.str_ord")
def matrix_norm(c, node):
    dims = tuple(c.raw("dim")) if c.has("dim") else (-2, -1)
    keep = "True" if c.has("keepdim") and c.raw("keepdim") else None
    return call("jnp.linalg.norm", _cast(c), ord=_norm_ord(c, "ord"), axis=repr(dims), keepdims=keep)


@op("aten.linalg_norm.default", "aten.linalg_norm.ord_str")
def norm(c, node):
    """linalg.norm: a vector norm over one dim (or all, flattened, without ord), a matrix norm over two."""
    dims = c.raw("dim") if c.has("dim") else None
    keep = "True" if c.has("keepdim") and c.raw("keepdim") else None
    x = _cast(c)
    order = _norm_ord(c, "ord")
    if dims is None and order is None:
        return call("jnp.linalg.norm", Expr(f"{x.at(ATOM)}.reshape(-1)"), keepdims=None) if not keep else \
            call("jnp.linalg.norm", x, axis=repr(tuple(range(c.val("self").ndim))), keepdims=keep)
    axis = repr(tuple(dims)) if dims is not None and len(dims) > 1 else (repr(dims[0]) if dims else None)
    return call("jnp.linalg.norm", x, ord=order, axis=axis, keepdims=keep)


def _cast(c) -> Expr:
    x = c.x("self")
    if c.has("dtype") and c.raw("dtype") is not None and c.raw("dtype") != c.val("self").dtype:
        return Expr(f"{x.at(ATOM)}.astype({c.dtype(c.raw('dtype'))})")
    return x


@op("aten.linalg_cond.default", "aten.linalg_cond.p_str")
def cond(c, node):
    return call("jnp.linalg.cond", c.x("self"), p=_norm_ord(c, "p"))


@op("aten.linalg_cross.default", "aten.cross.default")
def cross(c, node):
    if c.has("dim") and c.raw("dim") is not None:
        dim = c.raw("dim")
    else:  # torch.cross without dim: the first dim of size 3
        shape = [c.static(s) for s in c.out.shape]
        dim = shape.index(3)
    return call("jnp.cross", c.x("self"), c.x("other"), axis=repr(dim))


@op("aten.linalg_vecdot.default")
def vecdot(c, node):
    return call("jnp.linalg.vecdot", c.x("x"), c.x("y"), axis=repr(c.raw("dim") if c.has("dim") else -1))


@op("aten.linalg_householder_product.default")
def householder_product(c, node):
    return call("lax.linalg.householder_product", c.x("input"), c.x("tau"))


@op("aten.ormqr.default")
def ormqr(c, node):
    """ormqr(A, tau, C, left, transpose): C multiplied by the Q that (A, tau) hold as Householder reflectors."""
    left = c.raw("left") if c.has("left") else True
    transpose = c.has("transpose") and c.raw("transpose")
    return call(c.helper("ormqr"), c.x("self"), c.x("input2"), c.x("input3"), left=None if left else "False",
                transpose="True" if transpose else None)


@op("aten.linalg_lu_factor.default", "aten.linalg_lu_factor_ex.default", "aten._lu_with_info.default")
def lu_factor(c, node):
    """(LU, pivots[, info]): torch counts pivots from 1 (LAPACK's convention), SciPy from 0."""
    if c.has("pivot") and not c.raw("pivot"):
        raise Unsupported("an LU factorisation without pivoting")
    result = call("jax.scipy.linalg.lu_factor", c.x("A" if c.has("A") else "self"))
    parts = (Expr(f"{result.at(ATOM)}[0]"), Expr(f"({result.at(ATOM)}[1] + 1).astype(jnp.int32)"))
    return Outputs(parts + ((_info(c, 2),) if len(c.out) == 3 else ()))


@op("aten.linalg_lu.default")
def lu(c, node):
    if c.has("pivot") and not c.raw("pivot"):
        raise Unsupported("an LU factorisation without pivoting")
    result = call("jax.scipy.linalg.lu", c.x("A"))
    return Outputs(tuple(Expr(f"{result.at(ATOM)}[{i}]") for i in range(3)))


@op("aten.lu_unpack.default")
def lu_unpack(c, node):
    return Outputs(tuple(Expr(f"{call(c.helper('lu_unpack'), c.x('LU_data'), c.x('LU_pivots')).at(ATOM)}[{i}]")
                         for i in range(3)))


@op("aten.linalg_lu_solve.default", "aten.lu_solve.default")
def lu_solve(c, node):
    if str(node.target) == "aten.lu_solve.default":  # lu_solve(B, LU, pivots)
        lu, pivots, b, left, adjoint = c.x("LU_data"), c.x("LU_pivots"), c.x("self"), True, False
    else:
        lu, pivots, b = c.x("LU"), c.x("pivots"), c.x("B")
        left = c.raw("left") if c.has("left") else True
        adjoint = c.raw("adjoint") if c.has("adjoint") else False
    return call(c.helper("lu_solve"), lu, pivots, b, left=None if left else "False",
                adjoint="True" if adjoint else None)


@op("aten.linalg_solve_triangular.default")
def solve_triangular(c, node):
    left = c.raw("left") if c.has("left") else True
    a, b = c.x("self"), c.x("B")
    unit = "True" if c.has("unitriangular") and c.raw("unitriangular") else None
    lower = None if c.raw("upper") else "True"
    if left:
        return call("jax.scipy.linalg.solve_triangular", a, b, lower=lower, unit_diagonal=unit)
    # X A = B  <=>  A^T X^T = B^T, and A^T is lower where A is upper
    return _mT(call("jax.scipy.linalg.solve_triangular", _mT(a), _mT(b), lower="True" if c.raw("upper") else None,
                    unit_diagonal=unit))


@op("aten.triangular_solve.default")
def triangular_solve(c, node):
    """triangular_solve(B, A, upper, transpose, unitriangular) -> (X, A): solves A X = B (A^T X = B)."""
    upper = c.raw("upper") if c.has("upper") else True
    transpose = c.has("transpose") and c.raw("transpose")
    unit = "True" if c.has("unitriangular") and c.raw("unitriangular") else None
    x = call("jax.scipy.linalg.solve_triangular", c.x("A"), c.x("self"), trans=1 if transpose else None,
             lower=None if upper else "True", unit_diagonal=unit)
    return Outputs((x, c.x("A")))


@op("aten.linalg_tensorinv.default")
def tensorinv(c, node):
    ind = c.raw("ind") if c.has("ind") else 2
    return call("jnp.linalg.tensorinv", c.x("self"), ind=c.lit(ind, "ind") if ind != 2 else None)


@op("aten.linalg_tensorsolve.default")
def tensorsolve(c, node):
    """X with tensordot(A, X, X.ndim) = B, the dims of A listed moved to its end first; torch asks only
    that A's leading sizes multiply to B's size (jnp.linalg.tensorsolve, that they equal B's shape)."""
    a, ndim = c.x("self"), c.val("self").ndim
    dims = list(c.raw("dims") or []) if c.has("dims") else []
    if dims:
        a = call("jnp.moveaxis", a, repr(tuple(dims)), repr(tuple(range(ndim - len(dims), ndim))))
    system = call("jnp.linalg.solve", Expr(f"{a.at(ATOM)}.reshape({c.x('other').at(ATOM)}.size, -1)"),
                  Expr(f"{c.x('other').at(ATOM)}.reshape(-1)"))
    return Expr(f"{system.at(ATOM)}.reshape({c.size(list(c.out.shape)).text})")


@op("aten.linalg_vander.default")
def vander(c, node):
    """Powers 0 .. N-1 of x along a new last axis (N defaults to x's last size)."""
    n = c.out.shape[-1]
    x = c.x("x") if c.val("x").ndim else Expr(f"{c.x('x').at(ATOM)}.reshape(1)")
    return binary(c, Expr(f"{x.at(ATOM)}[..., None]"), "**", call("jnp.arange", c.lit(n, "N")), 15)


@op("aten.linalg_matrix_exp.default", "aten.matrix_exp.default")
def matrix_exp(c, node):
    return call("jax.scipy.linalg.expm", c.x("self"))


@op("aten.trace.default")
def trace(c, node):
    return call("jnp.trace", c.x("self"))


@op("aten.kron.default")
def kron(c, node):
    return call("jnp.kron", c.x("self"), c.x("other"))


@op("aten.block_diag.default")
def block_diag(c, node):
    items = [c.x_item("tensors", i) for i in range(len(c.raw("tensors")))]
    return call("jax.scipy.linalg.block_diag", *[i.text for i in items])


@op("aten.tensordot.default")
def tensordot(c, node):
    axes = (tuple(c.raw("dims_self")), tuple(c.raw("dims_other")))
    a, b = c.x("self"), c.x("other")
    # torch contracts a size-1 dim with any size (as broadcast): that side's sum, kept as size 1
    sizes = [(c.static(c.val("self").shape[i]), c.static(c.val("other").shape[j])) for i, j in zip(*axes)]
    widen_a = tuple(i for i, (m, n) in zip(axes[0], sizes) if m != n and n == 1)
    widen_b = tuple(j for j, (m, n) in zip(axes[1], sizes) if m != n and m == 1)
    if widen_a:
        a = call("jnp.sum", a, axis=repr(widen_a), keepdims="True")
    if widen_b:
        b = call("jnp.sum", b, axis=repr(widen_b), keepdims="True")
    return call("jnp.tensordot", a, b, axes=repr(axes))


@op("aten.inner.default")
def inner(c, node):
    return call("jnp.inner", c.x("self"), c.x("other"))


@op("aten._cdist_forward.default", "aten.cdist.default")
def cdist(c, node):
    p = c.raw("p") if c.has("p") else 2.0
    return call(c.helper("cdist"), c.x("x1"), c.x("x2"), c.lit(p, "p") if p != 2.0 else None)


@op("aten._pdist_forward.default", "aten.pdist.default")
def pdist(c, node):
    p = c.raw("p") if c.has("p") else 2.0
    return call(c.helper("pdist"), c.x("self"), c.lit(p, "p") if p != 2.0 else None)


@op("aten.geqrf.default")
def geqrf(c, node):
    raise Unsupported("LAPACK's raw QR (Householder vectors and scales): JAX keeps it private; use torch.linalg.qr")


@op("aten.linalg_ldl_factor_ex.default", "aten.linalg_ldl_factor.default", "aten.linalg_ldl_solve.default")
def ldl(c, node):
    raise Unsupported("LDL with Bunch-Kaufman pivoting, which JAX has no counterpart of; use torch.linalg.cholesky "
                      "or torch.linalg.solve")
