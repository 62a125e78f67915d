"""Float32 noise told from bugs: a failing float32 check is repeated in float64 on both sides.

A correct port can fail a float32 row because the two frameworks round differently and
the model amplifies it (a BatchNorm over a handful of values, Adam on gradients near
zero, max-pool near ties). In float64 (jax x64 + torch .double()) that rounding is ~1e-16
and such a row passes, while a real bug fails there as well. The recheck runs the same
check in float64 (same weights, inputs, dropout masks, steps), and each failing float32
row is labelled

  float32 rounding (passes in float64 at X)    or    real divergence (fails in float64 too, X)

`why` names the docs/porting.md entries that explain the rounding rows of a model.
"""
from __future__ import annotations

import copy

import numpy as np

from flaxport.port.report import REAL, ROUNDING
from flaxport.port.weights import set_torch_mode

GUIDE = "docs/porting.md"
NOT_FLOAT64 = ("not possible: with float64 weights and inputs the Flax side still computes in {} (a dtype "
               "fixed in the model?), so rounding cannot be told from bugs here")


def is_float32(*trees) -> bool:
    """Whether any floating tensor/array among `trees` (nested dicts/tuples) is float32."""
    import jax

    for leaf in jax.tree.leaves(trees):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and str(dtype).replace("torch.", "") == "float32":
            return True
    return False


def torch_float64(module):
    """A float64 deep copy of a torch module."""
    return copy.deepcopy(module).double()


def array_float64(x):
    """A float32 tensor/array as float64 (a tensor stays a tensor); others unchanged."""
    if hasattr(x, "detach"):
        return x.detach().double() if x.is_floating_point() else x
    a = np.asarray(x)
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a


def tree_float64(tree):
    import jax

    return jax.tree.map(array_float64, tree)


def classify(rows32: list, rows64: list) -> str:
    """Label each failing float32 row by its float64 twin (Row.cause); -> a one-line summary."""
    by_key = {r.key: r for r in rows64}
    rounding = real = 0
    for r in rows32:
        if r.ok:
            continue
        twin = by_key.get(r.key)
        if twin is None:
            r.cause = "unclassified (no float64 counterpart)"
            real += 1
        elif twin.ok:
            r.cause = f"{ROUNDING} (passes in float64 at {twin.max_abs:.2g})"
            rounding += 1
        else:
            r.cause = f"{REAL} (fails in float64 too, {twin.max_abs:.3g})"
            real += 1
    return (f"{rounding + real} float32 row{'s' if rounding + real != 1 else ''} off: {rounding} float32 rounding, "
            f"{real} real divergence{'s' if real != 1 else ''}")


def batchnorm_counts(torch_module, inputs, kwargs=None) -> dict:
    """{BatchNorm name: values per channel it normalises over} for one eval forward on `inputs` (a copy runs)."""
    import torch

    tm = set_torch_mode(copy.deepcopy(torch_module), False)
    counts: dict = {}
    handles = []

    def hook(name):
        def record(mod, args, out):
            counts.setdefault(name, args[0].numel() // args[0].shape[1])  # returns None: the output stays

        return record

    for name, m in tm.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            handles.append(m.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            tm(*inputs, **(kwargs or {}))
    finally:
        for h in handles:
            h.remove()
    return counts


def why(rows: list, torch_module, inputs, kwargs=None, optimizer: str | None = None) -> list:
    """Explanations (docs/porting.md entries) that fit the float32-rounding rows of this model."""
    import torch

    rounding = [r for r in rows if r.rounding]
    if not rounding:
        return []
    out = []
    few = {n: c for n, c in batchnorm_counts(torch_module, inputs, kwargs).items() if c <= 32}
    if few and any(r.phase != "forward" or r.torch_name.split("[")[0] not in few for r in rounding):
        name, count = min(few.items(), key=lambda kv: kv[1])
        out.append(f"BatchNorm {name!r} normalises over {count} values per channel in train mode, which amplifies "
                   f"rounding in its outputs and gradients ({GUIDE}, entry 28)")
    label = {"adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop", "adagrad": "Adagrad"}.get(optimizer or "")
    if label and any(r.phase in ("param", "moment") for r in rounding):
        out.append(f"{label} divides by the gradient's own size, so gradients near zero (rounding noise, e.g. a "
                   f"bias before a BatchNorm) become steps of up to lr that differ between frameworks ({GUIDE}, "
                   "entry 22)")
    pools = any(isinstance(m, (torch.nn.MaxPool1d, torch.nn.MaxPool2d, torch.nn.MaxPool3d))
                for m in torch_module.modules())
    if pools and any(r.phase in ("grad", "param", "moment") for r in rounding):
        out.append(f"max-pool sends each window's gradient to its largest element, and near ties are decided by "
                   f"rounding ({GUIDE}, entry 21)")
    if not out:
        out.append("float32 keeps about 7 significant digits and the two frameworks round in different places; "
                   "float64 is the proof")
    return out
