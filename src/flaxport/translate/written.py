"""The written files run as a user runs them: the proof's last step.

model.py is loaded from its folder with its own `load()` and run jitted, in eval mode against
torch's float32 outputs (torch's random draws and dropout masks replayed, as the float64 proof
does; outputs further off than float32 rounding pass only where the files run in float64 agree
with torch in float64: a model amplifying rounding, said in a note), then once in train mode,
which must stay finite where torch's output is; where train_step.py was written, it takes one
step from load() with a finite loss. What the float64 proof checks is the translation in memory;
this checks the files.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import numpy as np

from flaxport.translate.copies import copy_as, on_copy

# float32 rounding leaves ~1e-6 of max|torch|; a weight read into the wrong place is off by order 1
FLOAT32_RTOL = 1e-3


@dataclasses.dataclass(frozen=True)
class WrittenCheck:
    problem: str  # "" when the files run as proved, else one line saying what differs
    float32: float | None  # the largest |difference| of the eval outputs, where they were compared
    note: str = ""  # float32 outputs off where float64 shows the files right (a model amplifying rounding)


def check_written(t, module, directory) -> WrittenCheck:
    """Load `directory`'s model.py (written by t.save) and run it on t's example inputs against the
    torch module's float32 outputs, in eval mode, then in train mode."""
    import jax
    import torch

    from flaxport.translate.proof import (jax_arguments, jax_noise, leaves_like, ties_in_order, to_numpy,
                                         torch_noise, uninitialised_outputs)

    capture = t.plan.captures.get("eval") or next(iter(t.plan.captures.values()))

    def forward(torch_module):
        with torch_noise(capture) as (draws, masks), torch.no_grad(), ties_in_order():
            return torch_module(*t.example_args, **t.example_kwargs), draws, masks

    torch_out, draws, masks = on_copy(module, forward, training=False)
    # a Python number torch returns (.item(), a torch.Size) is an array in model.py's output
    expected = [to_numpy(a) for a in torch.utils._pytree.tree_leaves(torch_out)
                if torch.is_tensor(a) or isinstance(a, (int, float))]
    model_py = _import(directory, "model")
    model = model_py.load(str(directory))
    inputs = jax_arguments(t, None)
    model.eval()
    with jax.default_matmul_precision("highest"), jax_noise(draws, masks):
        got = [np.asarray(a) for a in leaves_like(_call(model, inputs), torch_out)]
    if len(got) != len(expected):
        return WrittenCheck(f"model.py returns {len(got)} arrays in eval mode, torch {len(expected)}", None)
    differences, unset, off = [], uninitialised_outputs(capture, len(expected)), ""
    for i, (a, b) in enumerate(zip(expected, got)):
        if a.shape != b.shape:
            return WrittenCheck(f"model.py's output {i} has shape {b.shape} in eval mode, torch's {a.shape}", None)
        if i in unset:  # torch.empty: only the shape means anything
            continue
        wide = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)  # float64 drops an imaginary part
        alike = _same_not_finite(wide, b)  # NaN where torch has NaN, the same inf: the op's answer
        differences.append(float(np.max(np.abs(np.where(alike, 0, wide) - np.where(alike, 0, b)), initial=0.0)))
        scale = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) if a.dtype != bool else 1.0
        if not off and not differences[-1] <= FLOAT32_RTOL * max(scale, 1.0):
            off = f"model.py's output {i} is off by {differences[-1]:.3g} in float32 (max |torch| {scale:.3g})"
    note = ""
    if off:
        agrees = _float64_agrees(t, module, model_py, directory, capture)
        if agrees is None:
            return WrittenCheck(off, _finite(max(differences)))
        note = f"{off}; in float64 the files agree with torch within {agrees:.2g}: the model amplifies rounding"
    float32 = max(differences, default=0.0)
    model.train()
    trained = [np.asarray(a) for a in jax.tree.leaves(_call(model, inputs))]
    if len(trained) != len(expected) or any(a.shape != b.shape for a, b in zip(trained, expected)):
        expected = [None] * len(trained)  # train mode's outputs differ in kind: each must be finite
    for a, b in zip(trained, expected):
        if np.issubdtype(a.dtype, np.inexact) and (~np.isfinite(a) & (True if b is None else np.isfinite(b))).any():
            return WrittenCheck("model.py's train-mode output is not finite where torch's eval-mode output is",
                                float32, note)
    if getattr(t, "train_step", None) is not None and os.path.exists(os.path.join(directory, "train_step.py")):
        del model  # the step loads its own: the weights once, not twice, beside its gradients
        return WrittenCheck(_first_step(t, model_py, directory), float32, note)
    return WrittenCheck("", float32, note)


def _float64_agrees(t, module, model_py, directory, capture) -> float | None:
    """The largest |torch - model.py| over the eval outputs with both in float64 (load()'s weights
    cast, torch in .double()) where every output is within the proof's tolerance, else None: float32
    outputs that differ while float64 agrees are rounding a model amplifies (a top-k over scores that
    a rounding reorders, a deep ReLU6 stack), not a file that computes something else."""
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    from flaxport.port.parity import compare
    from flaxport.translate.capture import cast_floating
    from flaxport.translate.proof import (ATOL, RTOL, jax_arguments, jax_noise, leaves_like, ties_in_order, to_numpy,
                                         torch_noise)

    args = [cast_floating(a, torch.float64) for a in t.example_args]
    kwargs = {k: cast_floating(v, torch.float64) for k, v in t.example_kwargs.items()}
    try:
        with torch_noise(capture) as (draws, masks), torch.no_grad(), ties_in_order():
            torch_out = copy_as(module, torch.float64).eval()(*args, **kwargs)
        expected = [to_numpy(a) for a in torch.utils._pytree.tree_leaves(torch_out)
                    if torch.is_tensor(a) or isinstance(a, (int, float))]
        with jax.enable_x64(True), jax.default_matmul_precision("highest"):
            model = model_py.load(str(directory))
            nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating)
                                           else a, nnx.state(model)))
            model.eval()
            with jax_noise(draws, masks):
                got = [np.asarray(a) for a in leaves_like(_call(model, jax_arguments(t, torch.float64)), torch_out)]
    except Exception:  # noqa: BLE001 - a model that cannot run in float64 leaves the float32 verdict standing
        return None
    if len(expected) != len(got) or any(a.shape != b.shape for a, b in zip(expected, got)):
        return None
    rows = [compare(a, b, ATOL, RTOL) for a, b in zip(expected, got)]
    return max((max_abs for max_abs, _, _ in rows), default=0.0) if all(ok for _, _, ok in rows) else None


def _first_step(t, model_py, directory) -> str:
    """train_step.py, imported from `directory`, takes one step from model.py's load() on the example
    batch as its docstring shows a user: "" when it runs and its loss is finite, else what happened."""
    from flaxport.errors import first_line

    train_step_py = _import(directory, "train_step")
    targets = t.train_step.targets
    batch = [np.asarray(x.detach().numpy()) for x in t.call_arguments]
    batch += [] if targets is None else [np.asarray(targets.detach().numpy())]
    try:
        train_step, state, _ = train_step_py.make_train_step(model_py.load(str(directory)))
        _, loss = train_step(state, *batch)
        loss = float(np.asarray(loss))
    except Exception as e:  # noqa: BLE001 - what the user would meet on the first call, in one line
        return f"train_step.py's first step fails: {type(e).__name__}: {first_line(e)}"
    return "" if math.isfinite(loss) else f"train_step.py's first step gives a loss of {loss}"


def _import(directory, name):
    """The module `name`.py written in `directory`, imported as a user's script imports it."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same_not_finite(a, b):
    """Where a and b are both NaN or the same infinity."""
    with np.errstate(invalid="ignore"):
        return (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))


def _finite(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _call(model, inputs):
    """model(*inputs) jitted as a user runs it (nnx.split / merge), its state (running statistics, rng
    counts) carried back into `model`."""
    import jax
    from flax import nnx

    from flaxport.translate.proof import FAST_COMPILE  # compiled once, run once: as the proof compiles

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def call(params, rest):
        m = nnx.merge(graphdef, params, rest)
        return m(*inputs), nnx.state(m, nnx.Not(nnx.Param))  # a jitted function's outputs are new arrays

    out, rest = jax.jit(call, compiler_options=FAST_COMPILE)(params, rest)
    nnx.update(model, rest)
    return out
