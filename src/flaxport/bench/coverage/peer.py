"""torchax beside flaxport in the coverage benchmark: the same module on the same inputs, in float64 and float32.

torchax runs the torch module's own forward on JAX arrays (`torchax.extract_jax`, jitted). Its
verdict is the proof's rule on the outputs: float64 (jax x64 against the torch module in
`.double()`) within 1e-5 + 1e-5 x max|torch|; the float32 difference is reported beside it.
torchax 0.0.13 names torch's named-dimension overloads (`aten.prod.dim_Dimname`, ...), which
torch 2.13 no longer has; where its plain import fails on one of those, it is imported again
with such lookups answered by a placeholder (no graph of torch 2.13 holds those ops).
"""
from __future__ import annotations

import copy
import re
import sys
import time

import numpy as np

ATOL = RTOL = 1e-5  # the proof's


def run(name: str, module, args, kwargs) -> dict:
    """{name, ok, float64, float32, seconds, reason} of peer `name` ("torchax") on the sample."""
    out = {"name": name, "ok": False, "float64": None, "float32": None, "seconds": None, "reason": ""}
    start = time.perf_counter()
    try:
        import_torchax()
        for precision in ("float64", "float32"):
            expected, got = _outputs(module, args, kwargs, precision)
            if len(expected) != len(got):
                out["reason"] = f"{precision}: torchax returns {len(got)} arrays, torch {len(expected)}"
                break
            out[precision] = max((float(np.max(np.abs(a.astype(np.float64) - b), initial=0.0))
                                  for a, b in zip(expected, got)), default=0.0)
            if precision == "float64":
                out["ok"] = all(a.shape == b.shape and np.max(np.abs(a - b), initial=0.0)
                                <= ATOL + RTOL * np.max(np.abs(a), initial=0.0) for a, b in zip(expected, got))
                if not out["ok"]:
                    out["reason"] = f"float64 outputs differ (max |diff| {out['float64']:.3g})"
    except Exception as e:  # noqa: BLE001 - the peer's failure is a result
        from flaxport.bench.coverage import one_line

        out["ok"], out["reason"] = False, one_line(e)
    out["seconds"] = round(time.perf_counter() - start, 2)
    return out


def _outputs(module, args, kwargs, precision):
    """(torch's output arrays, torchax's) in `precision`, eval mode."""
    import jax
    import torch
    import torchax
    from torch.utils import _pytree

    from flaxport.translate.proof import FAST_COMPILE

    dtype = torch.float64 if precision == "float64" else torch.float32

    def cast(v):
        return v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v

    model = copy.deepcopy(module).eval().to(dtype)
    args, kwargs = _pytree.tree_map(cast, (tuple(args), dict(kwargs)))
    with torch.no_grad():
        expected = [a.numpy() for a in _pytree.tree_leaves(model(*args, **kwargs)) if torch.is_tensor(a)]
    tensors, spec = _pytree.tree_flatten((args, kwargs))
    where = [i for i, v in enumerate(tensors) if torch.is_tensor(v)]
    with jax.enable_x64(precision == "float64"):
        states, forward = torchax.extract_jax(model)

        def call(states, arrays):
            leaves = list(tensors)
            for i, a in zip(where, arrays):
                leaves[i] = a
            a, k = _pytree.tree_unflatten(leaves, spec)
            return [x for x in _pytree.tree_leaves(forward(states, a, k)) if isinstance(x, jax.Array)]

        # compiled as the proof compiles (once, run once)
        got = jax.jit(call, compiler_options=FAST_COMPILE)(states, [jax.numpy.asarray(tensors[i].numpy()) for i in where])
        return expected, [np.asarray(a) for a in got]


def import_torchax():
    """torchax, with its default environment built (see the module docstring)."""
    try:
        import torchax

        torchax.default_env()
        return torchax
    except AttributeError as e:
        if "has no overload name" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchax" or m.startswith("torchax.")]:
        del sys.modules[name]
    import torch._ops

    real = torch._ops.OpOverloadPacket.__getattr__

    def tolerant(packet, key):
        try:
            return real(packet, key)
        except AttributeError:
            if re.search(r"dimname|names", key, re.IGNORECASE):
                return _Missing(f"{packet._qualified_op_name}.{key}")
            raise

    torch._ops.OpOverloadPacket.__getattr__ = tolerant
    try:
        import torchax

        torchax.default_env()
    finally:
        torch._ops.OpOverloadPacket.__getattr__ = real
    return torchax


class _Missing:
    """An overload torchax names that this torch does not have (never called: no graph holds it)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<missing overload {self.name}>"
