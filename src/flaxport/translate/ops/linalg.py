"""Matrix products: linear, matmul, bmm, addmm, einsum, grouped (mixture-of-experts) products."""
from __future__ import annotations

from flaxport.translate.ops.table import ADD, ATOM, MUL, Expr, binary, call, method, op


@op("aten.linear.default")
def linear(c, node):
    y = binary(c, call(c.helper("fusion_boundary"), c.x("input")), "@", Expr(f"{c.x('weight').at(ATOM)}.T"), MUL)
    return binary(c, y, "+", c.x("bias"), ADD) if c.has("bias") else y


@op("aten.bilinear.default")
def bilinear(c, node):
    """nn.Bilinear: y_o = x1 W_o x2 + b_o, weight (out, in1, in2)."""
    y = call("jnp.einsum", repr("...i,oij,...j->...o"), c.x("input1"), c.x("weight"), c.x("input2"))
    return binary(c, y, "+", c.x("bias"), ADD) if c.has("bias") else y


@op("aten.cosine_similarity.default")
def cosine_similarity(c, node):
    dim = c.raw("dim") if c.has("dim") else 1
    eps = c.raw("eps") if c.has("eps") else 1e-8
    return call(c.helper("cosine_similarity"), c.x("x1"), c.x("x2"), dim=repr(dim), eps=c.lit(eps, "eps"))


@op("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def matmul(c, node):
    return binary(c, c.x("self"), "@", c.x("other" if c.has("other") else "mat2"), MUL)


@op("transformers.grouped_mm_fallback.default")
def grouped_mm(c, node):
    """HuggingFace's mixture-of-experts product: input rows offs[i-1]:offs[i] (sorted by expert) times
    weight[i]; input (S, in), weight (experts, in, out), offs (experts,) cumulative counts -> (S, out),
    rows past offs[-1] zero. torch loops over the experts at their sizes; lax.ragged_dot takes the
    group sizes as an array, so jit compiles it once."""
    sizes = call("jnp.diff", c.x("offs"), prepend=0)
    return call("lax.ragged_dot", c.x("input"), c.x("weight"), method(sizes, "astype", "jnp.int32"))


@op("aten.addmm.default", "aten.baddbmm.default", "aten.addbmm.default")
def addmm(c, node):
    prod = binary(c, c.x("mat1" if c.has("mat1") else "batch1"), "@", c.x("mat2" if c.has("mat2") else "batch2"), MUL)
    if ".addbmm." in str(node.target):
        prod = call("jnp.sum", prod, axis=0)
    beta, alpha = (c.raw(k) if c.has(k) else 1 for k in ("beta", "alpha"))
    if alpha != 1:
        prod = binary(c, c.lit(alpha, "alpha"), "*", prod, MUL)
    base = c.x("self") if beta == 1 else binary(c, c.lit(beta, "beta"), "*", c.x("self"), MUL)
    return binary(c, base, "+", prod, ADD)


@op("aten.einsum.default")
def einsum(c, node):
    operands = [c.x_item("tensors", i) for i in range(len(c.raw("tensors")))]
    return call("jnp.einsum", repr(c.raw("equation")), *operands)


@op("aten.dot.default", "aten.vdot.default", "aten.mv.default")
def dot(c, node):
    other = next(k for k in ("vec", "tensor", "other") if c.has(k))
    return binary(c, c.x("self"), "@", c.x(other), MUL)


@op("aten.outer.default", "aten.ger.default")
def outer(c, node):
    return call("jnp.outer", c.x("self"), c.x("vec2"))
