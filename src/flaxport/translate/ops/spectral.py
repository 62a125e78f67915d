"""FFTs and complex numbers: torch's three FFT kernels (every torch.fft function decomposes into them),
complex views (view_as_real, real, imag) and complex arithmetic (conj, polar, angle).
"""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, Expr, Unsupported, call, op

# torch's `normalization` argument (fft_norm_mode: none, by_root_n, by_n) as jnp.fft's `norm` for a
# forward and an inverse transform (jnp's inverse scales by 1/n unless told otherwise)
FORWARD_NORM = {0: None, 1: "'ortho'", 2: "'forward'"}
INVERSE_NORM = {0: "'forward'", 1: "'ortho'", 2: None}


def _axes(c):
    ndim = c.val("self").ndim
    return repr(tuple(d % ndim for d in c.raw("dim")))


@op("aten._fft_r2c.default")
def fft_r2c(c, node):
    """FFT of a real array over dims; onesided keeps the non-negative frequencies of the last (rfftn)."""
    fn = "jnp.fft.rfftn" if c.raw("onesided") else "jnp.fft.fftn"
    return call(fn, c.x("self"), axes=_axes(c), norm=FORWARD_NORM[c.raw("normalization")])


@op("aten._fft_c2c.default")
def fft_c2c(c, node):
    if c.raw("forward"):
        return call("jnp.fft.fftn", c.x("self"), axes=_axes(c), norm=FORWARD_NORM[c.raw("normalization")])
    return call("jnp.fft.ifftn", c.x("self"), axes=_axes(c), norm=INVERSE_NORM[c.raw("normalization")])


@op("aten._fft_c2r.default")
def fft_c2r(c, node):
    """Inverse of a onesided FFT over dims; the last of them comes out `last_dim_size` long."""
    ndim = c.val("self").ndim
    dims = [d % ndim for d in c.raw("dim")]
    sizes = [c.out.shape[d] for d in dims]
    return call("jnp.fft.irfftn", c.x("self"), s=c.size(sizes), axes=repr(tuple(dims)),
                norm=INVERSE_NORM[c.raw("normalization")])


@op("aten.view_as_real.default")
def view_as_real(c, node):
    x = c.x("self")
    return call("jnp.stack", Expr(f"[{x.at(ATOM)}.real, {x.at(ATOM)}.imag]"), axis="-1")


@op("aten.view_as_complex.default")
def view_as_complex(c, node):
    x = c.x("self")
    return call("lax.complex", Expr(f"{x.at(ATOM)}[..., 0]"), Expr(f"{x.at(ATOM)}[..., 1]"))


@op("aten.real.default")
def real(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.real") if c.val("self").is_complex() else c.x("self")


@op("aten.imag.default")
def imag(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.imag")


@op("aten.conj.default", "aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default")
def conj(c, node):
    return call("jnp.conj", c.x("self")) if c.val("self").is_complex() else c.x("self")


@op("aten.complex.default")
def complex_(c, node):
    return call("lax.complex", Expr(f"*jnp.broadcast_arrays({c.x('real')}, {c.x('imag')})"))


@op("aten.polar.default")
def polar(c, node):
    """abs * e^(i angle)."""
    return call("lax.complex", Expr(f"{c.x('abs').at(ATOM)} * jnp.cos({c.x('angle')})"),
                Expr(f"{c.x('abs').at(ATOM)} * jnp.sin({c.x('angle')})"))


@op("aten.angle.default")
def angle(c, node):
    return call("jnp.angle", c.x("self"))


@op("aten.chalf.default")
def chalf(c, node):
    raise Unsupported("complex32 (torch.chalf), which JAX has no dtype for")
