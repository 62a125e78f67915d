"""Random draws in a forward, replayed from torch into JAX so that a sampling model can be proved.

A forward that samples (`torch.randn_like(std)` in a VAE, `torch.rand(...) < p`) draws, in
its JAX twin, with `jax.random`, so the two cannot compute equal numbers. To prove the
rest of the computation, a check records each draw torch makes (in execution order) and,
while the JAX side is traced, `jax.random.normal/uniform/bernoulli/randint/exponential/
poisson` return those draws in the same order instead of fresh ones (NumPy constants, or
arrays a jitted step takes as arguments). What is replayed is the standard draw the JAX
expression starts from (for `x.normal_(mean, std)`: (out - mean) / std), so the twin's own
scaling and shifting is checked too. flaxport.translate writes its random ops this way.
"""
from __future__ import annotations

import contextlib

import numpy as np

# The ATen random ops (flaxport.translate's op table writes them) and the jax.random function
# each one's JAX form calls.
JAX_FUNCTION = {
    "randn": "normal", "randn_like": "normal", "normal": "normal", "normal_": "normal",
    "normal_functional": "normal",
    "rand": "uniform", "rand_like": "uniform", "uniform": "uniform", "uniform_": "uniform",
    "bernoulli": "bernoulli", "bernoulli_": "bernoulli",
    "randint": "randint", "randint_like": "randint",
    "exponential": "exponential", "exponential_": "exponential",
    "poisson": "poisson",
    "cauchy": "cauchy", "cauchy_": "cauchy", "log_normal": "normal", "log_normal_": "normal",
    "geometric": "geometric", "geometric_": "geometric",
}


class DrawMismatch(RuntimeError):
    """The JAX side drew other numbers (count, shape) than torch did."""


def op_name(func) -> str | None:
    """'randn_like' for aten.randn_like.default; None for an op that draws nothing."""
    name = getattr(func, "__name__", str(func)).split(".")[0]
    return name if name in JAX_FUNCTION else None


def standard_draw(name: str, args, kwargs, out) -> np.ndarray:
    """The draw the translation's jax.random call returns, from torch's output of op `name`."""
    import torch

    value = out.detach().cpu().numpy()
    if name in ("normal", "normal_", "normal_functional"):
        if name == "normal":  # normal(mean, std, ...): tensors or floats
            mean, std = args[0], args[1] if len(args) > 1 else kwargs.get("std", 1.0)
        else:  # normal_(self, mean=0, std=1)
            mean = args[1] if len(args) > 1 else kwargs.get("mean", 0.0)
            std = args[2] if len(args) > 2 else kwargs.get("std", 1.0)
        mean, std = (m.detach().cpu().numpy() if torch.is_tensor(m) else m for m in (mean, std))
        return (value - mean) / std
    if name.startswith("bernoulli"):
        return value != 0
    if name.startswith("exponential"):
        lambd = args[1] if len(args) > 1 else kwargs.get("lambd", 1.0)
        return value * lambd
    if name.startswith("cauchy"):  # cauchy_(self, median=0, sigma=1)
        median = args[1] if len(args) > 1 else kwargs.get("median", 0.0)
        sigma = args[2] if len(args) > 2 else kwargs.get("sigma", 1.0)
        return (value - median) / sigma
    if name.startswith("log_normal"):  # log_normal_(self, mean=1, std=2): exp of a normal draw
        mean = args[1] if len(args) > 1 else kwargs.get("mean", 1.0)
        std = args[2] if len(args) > 2 else kwargs.get("std", 2.0)
        return (np.log(value) - mean) / std
    return value


class Draws:
    """torch's draws in order: `outputs` (to give the fx interpreter the same values) and
    `standard` (what the translation's jax.random calls return in the replay)."""

    def __init__(self):
        self.outputs, self.standard = [], []

    def add(self, name, args, kwargs, out):
        self.outputs.append(out.detach().clone())
        self.standard.append(standard_draw(name, args, kwargs, out))


@contextlib.contextmanager
def torch_recording(draws: Draws):
    """Record every random op torch runs in the block into `draws`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = op_name(func.overloadpacket)
            if name is not None:
                draws.add(name, args, kwargs, out)
            return out

    with Record():
        yield


def torch_replay(draws: Draws):
    """A function for an fx Interpreter's call_function: random ops return the recorded outputs."""
    served = iter(draws.outputs)

    def call(target, args, kwargs, run):
        if op_name(getattr(target, "overloadpacket", target)) is None:
            return run(target, args, kwargs)
        fresh = run(target, args, kwargs)
        value = next(served, None)
        if value is None or tuple(value.shape) != tuple(fresh.shape):
            raise DrawMismatch("the captured graph draws other random numbers than the torch module")
        return value.to(fresh.dtype)

    return call


@contextlib.contextmanager
def jax_replay(standard):
    """jax.random's samplers return `standard` (Draws.standard, or those arrays traced) in order
    for the block, while the JAX side is traced."""
    import jax
    import jax.numpy as jnp

    if not len(standard):  # torch drew nothing: leave jax.random alone
        yield
        return
    served = iter(standard)
    saved = {name: getattr(jax.random, name) for name in set(JAX_FUNCTION.values())}

    def sampler(name):
        def draw(key, *args, **kwargs):
            fresh = jax.eval_shape(lambda k: saved[name](k, *args, **kwargs), key)
            value = next(served, None)
            if value is None:
                raise DrawMismatch(f"the JAX side draws more random numbers than torch (jax.random.{name})")
            if tuple(value.shape) != tuple(fresh.shape):
                raise DrawMismatch(f"jax.random.{name} draws shape {tuple(fresh.shape)} where torch drew "
                                    f"{tuple(value.shape)}")
            return jnp.asarray(value).astype(fresh.dtype)

        return draw

    for name in saved:
        setattr(jax.random, name, sampler(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(jax.random, name, fn)
    if next(served, None) is not None:
        raise DrawMismatch(f"the JAX side draws fewer random numbers than torch ({len(standard)})")
