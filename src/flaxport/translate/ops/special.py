"""Special functions (torch.special, Bessel, gamma family, orthogonal polynomials) and float bit-level ops.

Where jax.scipy.special has the function it is called; torch's orthogonal polynomials are
evaluated by their three-term recurrences (runtime `orthogonal_polynomial`). Bessel functions
of the second kind (Y, K) and Airy's have no JAX counterpart and are refused by name.
"""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, MUL, Expr, Outputs, Unsupported, binary, call, op

# aten op -> function of its one tensor argument
_UNARY = {
    "i0": "jax.scipy.special.i0", "special_i0e": "jax.scipy.special.i0e", "special_i1": "jax.scipy.special.i1",
    "special_i1e": "jax.scipy.special.i1e", "special_modified_bessel_i0": "jax.scipy.special.i0",
    "special_modified_bessel_i1": "jax.scipy.special.i1", "special_erfcx": "jax.scipy.special.erfcx",
    "special_ndtr": "jax.scipy.special.ndtr", "special_ndtri": "jax.scipy.special.ndtri",
    "special_log_ndtr": "jax.scipy.special.log_ndtr", "special_entr": "jax.scipy.special.entr",
    "sinc": "jnp.sinc", "signbit": "jnp.signbit", "deg2rad": "jnp.deg2rad", "rad2deg": "jnp.rad2deg",
    "isneginf": "jnp.isneginf", "isposinf": "jnp.isposinf", "special_expit": "jax.nn.sigmoid",
}
# aten op -> function of (self, other)
_BINARY = {
    "igamma": "jax.scipy.special.gammainc", "igammac": "jax.scipy.special.gammaincc",
    "special_zeta": "jax.scipy.special.zeta", "special_xlog1py": "jax.scipy.special.xlog1py",
    "xlogy": "jax.scipy.special.xlogy", "hypot": "jnp.hypot",
    "nextafter": "jnp.nextafter", "copysign": "jnp.copysign", "heaviside": "jnp.heaviside",
    "float_power": "jnp.float_power", "logaddexp2": "jnp.logaddexp2",
}
_NO_JAX = ("special_bessel_y0", "special_bessel_y1", "special_modified_bessel_k0", "special_modified_bessel_k1",
           "special_scaled_modified_bessel_k0", "special_scaled_modified_bessel_k1", "special_airy_ai")


def _unary(name, fn):
    @op(f"aten.{name}")
    def handler(c, node):
        return call(fn, c.x("self"))

    return handler


def _binary(name, fn):
    @op(f"aten.{name}")
    def handler(c, node):
        names = [k for k in c.args if k not in ("out",)][:2]
        return call(fn, c.x(names[0]), c.x(names[1]))

    return handler


def _refused(name):
    @op(f"aten.{name}")
    def handler(c, node):
        raise Unsupported("a special function JAX has no counterpart of")

    return handler


for _name, _fn in _UNARY.items():
    _unary(_name, _fn)
for _name, _fn in _BINARY.items():
    _binary(_name, _fn)
for _name in _NO_JAX:
    _refused(_name)


@op("aten.special_bessel_j0.default", "aten.special_bessel_j1.default")
def bessel_j(c, node):
    return call(c.helper("bessel_j"), 0 if "j0" in str(node.target) else 1, c.x("self"))


@op("aten.special_spherical_bessel_j0.default")
def spherical_bessel_j0(c, node):
    """sin(x) / x, 1 at 0: numpy's sinc of x / pi."""
    return call("jnp.sinc", binary(c, c.x("x"), "/", Expr("jnp.pi"), MUL))


@op("aten.polygamma.default")
def polygamma(c, node):
    """torch's polygamma takes negative x too (jax's, through the Hurwitz zeta, does not): runtime polygamma."""
    if c.raw("n") == 0:
        return call("jax.scipy.special.digamma", c.x("self"))
    return call(c.helper("polygamma"), c.x("n"), c.x("self"))


@op("aten.mvlgamma.default")
def mvlgamma(c, node):
    return call("jax.scipy.special.multigammaln", c.x("self"), c.x("p"))


@op("aten.logit.default")
def logit(c, node):
    x = c.x("self")
    eps = c.raw("eps") if c.has("eps") else None
    if eps is not None:
        x = call("jnp.clip", x, c.lit(eps, "eps"), binary(c, Expr("1"), "-", c.lit(eps, "eps"), 13))
    return call("jax.scipy.special.logit", x)


@op("aten.frexp.Tensor")
def frexp(c, node):
    """(mantissa, exponent): torch's exponent is int32."""
    result = call("jnp.frexp", c.x("self"))
    return Outputs((Expr(f"{result.at(ATOM)}[0]"), Expr(f"{result.at(ATOM)}[1].astype(jnp.int32)")))


@op("aten.ldexp.Tensor", "aten.ldexp.default")
def ldexp(c, node):
    """self * 2 ** other, in self's float type (other may be an integer tensor)."""
    return binary(c, c.x("self"), "*", call("jnp.exp2", c.x("other")), MUL)


@op("aten.logcumsumexp.default")
def logcumsumexp(c, node):
    return call("lax.cumlogsumexp", c.x("self"), axis=c.dim("dim", c.val("self").ndim))


# torch.special's orthogonal polynomials: aten op -> the runtime's name for the kind
_POLYNOMIALS = {
    "special_chebyshev_polynomial_t": "chebyshev_t", "special_chebyshev_polynomial_u": "chebyshev_u",
    "special_chebyshev_polynomial_v": "chebyshev_v", "special_chebyshev_polynomial_w": "chebyshev_w",
    "special_shifted_chebyshev_polynomial_t": "shifted_chebyshev_t",
    "special_shifted_chebyshev_polynomial_u": "shifted_chebyshev_u",
    "special_shifted_chebyshev_polynomial_v": "shifted_chebyshev_v",
    "special_shifted_chebyshev_polynomial_w": "shifted_chebyshev_w",
    "special_hermite_polynomial_h": "hermite_h", "special_hermite_polynomial_he": "hermite_he",
    "special_laguerre_polynomial_l": "laguerre_l", "special_legendre_polynomial_p": "legendre_p",
}


def _polynomial(name, kind):
    @op(f"aten.{name}")
    def handler(c, node):
        return call(c.helper("orthogonal_polynomial"), repr(kind), c.x("x"), c.x("n"))

    return handler


for _name, _kind in _POLYNOMIALS.items():
    _polynomial(_name, _kind)
