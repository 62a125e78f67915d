"""torch.autocast's CPU bfloat16 policy for a JAX function: what `with torch.autocast("cpu",
dtype=torch.bfloat16):` does to a torch forward, done to the traced JAX program.

The function is traced to a jaxpr and run again primitive by primitive: matrix products and
convolutions take bfloat16 operands and accumulate in float32; their result is rounded to
bfloat16 once, after the bias when a float32 bias is added to it next (torch's addmm and
convolution kernels add it before rounding); reductions of bfloat16 values accumulate in float32 and
round their result; every other primitive runs in the dtypes it is given, mixed operands
promoted (bfloat16 + float32 -> float32, as torch promotes). Parameters stay float32 (the
master weights): their casts are part of the program, so gradients come back float32.
Calls (pjit, custom_jvp/vjp) are run through, except a custom_jvp/vjp around a kernel of its own
(an ffi_call, such as flaxport's CPU convolutions, which only its own rule differentiates): it
runs whole, as a convolution, on operands rounded to bfloat16 and in float32; loops and conditionals (scan, while, cond)
run as traced, their operands cast back to the dtypes they were traced with.
Self-contained (jax and jnp): train_step.py carries it for `--precision bf16`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

MATMULS = ("dot_general", "conv_general_dilated")
REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "cumsum", "cumprod", "cummax", "cummin",
              "argmax", "argmin", "reduce_and", "reduce_or")
CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
         "remat", "checkpoint")


def autocast(fn, dtype=jnp.bfloat16, reductions=jnp.float32):
    """fn(*args) under torch.autocast's CPU policy for `dtype` (bfloat16). reductions: the type
    reductions of `dtype` values accumulate in (float32, as torch; `dtype` itself only to show
    what accumulating in bfloat16 would do)."""

    def run(*args):
        closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = _run(closed.jaxpr, closed.consts, jax.tree.leaves(args), dtype, reductions)
        return jax.tree.unflatten(jax.tree.structure(shapes), out)

    return run


def _floating(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def _cast(x, dtype):
    return x.astype(dtype) if _floating(x) and jnp.result_type(x) != dtype else x


def _run(jaxpr, consts, args, dtype, reductions):
    env = {}
    unrounded = set()  # matrix products still in float32: rounded by their first use

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    def rounded(v):
        return env[v].astype(dtype) if v in unrounded else read(v)

    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        bias = [i for i, v in enumerate(eqn.invars) if not isinstance(v, jcore.Literal) and v in unrounded]
        if name == "add" and len(bias) == 1 and jnp.result_type(read(eqn.invars[1 - bias[0]])) == jnp.float32:
            # x @ w + b as torch's kernels compute it: the bias added in float32, then one rounding
            out = (read(eqn.invars[0]) + read(eqn.invars[1])).astype(dtype)
        else:
            out = _apply(eqn, [rounded(v) if not isinstance(v, jcore.Literal) else v.val for v in eqn.invars],
                         dtype, reductions)
        if name in MATMULS or _kernel_call(eqn):
            unrounded.update(eqn.outvars)
        if not eqn.primitive.multiple_results:
            out = [out]
        for var, value in zip(eqn.outvars, out):
            env[var] = value
    return [rounded(v) if not isinstance(v, jcore.Literal) else v.val for v in jaxpr.outvars]


def _inner(eqn):
    """The jaxpr (and its consts) a call primitive runs."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        inner = eqn.params.get(key)
        if inner is not None:
            return (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())
    return None


def _kernel_call(eqn) -> bool:
    """A call whose program holds an ffi_call: run whole (see the module docstring)."""
    if eqn.primitive.name not in CALLS or _inner(eqn) is None:
        return False
    jaxpr, _ = _inner(eqn)
    return any(e.primitive.name == "ffi_call" or _kernel_call(e) for e in jaxpr.eqns)


def _apply(eqn, values, dtype, reductions):
    name = eqn.primitive.name
    traced = [v.aval.dtype for v in eqn.invars]
    if _kernel_call(eqn):  # float32 in and out, the operands rounded as a bfloat16 convolution's
        rounded = [_cast(_cast(v, dtype), t) if _floating(v) else v for v, t in zip(values, traced)]
        params = eqn.primitive.get_bind_params(eqn.params)  # as jax's own eval_jaxpr binds a call
        if isinstance(params, tuple):  # (subfuns, params) in other jax versions
            subfuns, params = params
            rounded = [*subfuns, *rounded]
        out = eqn.primitive.bind(*rounded, **params)
        return out if eqn.primitive.multiple_results else out[0]
    if name in MATMULS:
        low = [_cast(v, dtype) for v in values]
        params = {**eqn.params, "preferred_element_type": jnp.float32}
        return eqn.primitive.bind(*low, **params)  # float32, rounded where it is used (_run)
    if name in CALLS and _inner(eqn) is not None:
        jaxpr, consts = _inner(eqn)
        out = _run(jaxpr, consts, values, dtype, reductions)
        return out if eqn.primitive.multiple_results else out[0]
    if name in REDUCTIONS and any(jnp.result_type(v) == dtype for v in values):
        out = eqn.primitive.bind(*[_cast(v, reductions) for v in values], **eqn.params)
        return [_cast(o, dtype) for o in out] if eqn.primitive.multiple_results else _cast(out, dtype)
    if name in ("scan", "while", "cond") or not any(_floating(v) for v in values):
        return eqn.primitive.bind(*[_cast(v, t) if _floating(v) else v for v, t in zip(values, traced)],
                                  **eqn.params)
    if name == "convert_element_type":
        return eqn.primitive.bind(*values, **eqn.params)
    # mixed operands promote as torch promotes (bfloat16 with float32 -> float32)
    floats = [jnp.result_type(v) for v in values if _floating(v)]
    wide = jnp.result_type(*floats) if floats else None
    changed = [_cast(v, wide) if _floating(v) and jnp.issubdtype(t, jnp.floating) else v
               for v, t in zip(values, traced)]
    params = dict(eqn.params)
    if "preferred_element_type" in params and params["preferred_element_type"] is not None:
        params["preferred_element_type"] = wide
    try:
        return eqn.primitive.bind(*changed, **params)
    except (TypeError, ValueError):  # a primitive tied to its traced dtypes: run it as traced
        return eqn.primitive.bind(*[_cast(v, t) for v, t in zip(values, traced)], **eqn.params)
