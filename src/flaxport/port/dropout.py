"""Dropout in train-mode checks: the same masks on both sides, or none.

torch draws its masks from its global generator, JAX from explicit keys, so two correct
twins never drop the same units (docs/porting.md, entry 23). For a check, torch's
dropout functions (F.dropout, dropout1d/2d/3d, through nn.Dropout* or called directly)
are intercepted with a TorchFunctionMode: each call draws its keep-mask from a NumPy
generator and records it, scaled by 1/(1-p); the Flax side's `nn.Dropout` (Linen) or
`nnx.Dropout` calls, intercepted in the same order, multiply by the same arrays (moved
channels-last where the Flax side is). mode='off' makes every dropout the identity on
both sides instead. Dropout drawn inside a torch kernel (nn.LSTM / nn.GRU between layers)
cannot be intercepted: it is turned off on both sides, and the report says so.
"""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from flaxport.errors import UserError

MODES = ("equal", "off")


class DropoutMismatchError(UserError):
    """The two sides apply dropout a different number of times, or to other shapes."""


@dataclasses.dataclass
class DropoutLog:
    """What the torch side drew in one forward: [(scaled mask in torch layout, p, function name)]."""

    masks: list = dataclasses.field(default_factory=list)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UserError(f"dropout={mode!r}: use 'equal' (the same masks on both sides) or 'off'")
    return mode


def _dropout_functions():
    import torch.nn.functional as F

    return {F.dropout: 0, F.dropout1d: 1, F.dropout2d: 2, F.dropout3d: 3}


def _alpha_functions():
    import torch.nn.functional as F

    return {F.alpha_dropout, F.feature_alpha_dropout}


@contextlib.contextmanager
def torch_dropout(mode: str, rng: np.random.Generator, log: DropoutLog):
    """Within: torch's dropout functions use recorded masks from `rng` (mode 'equal') or none ('off')."""
    import torch
    from torch.overrides import TorchFunctionMode

    import torch.nn.functional as F

    functions = _dropout_functions()
    alpha = _alpha_functions()

    def dropout(func, args, kwargs):
        # torch's signature, bound by hand: `func` may be another tool's wrapper of it
        bound = dict(zip(("input", "p", "training", "inplace"), args), **kwargs)
        x, p, training = bound["input"], float(bound.get("p", 0.5)), bound.get("training", True)
        if not training or p == 0.0 or mode == "off":
            return x
        nd = functions[func]
        if nd == 0:
            shape = tuple(x.shape)
        else:  # whole channels: (N, C, 1...) batched, (C, 1...) unbatched
            lead = x.ndim - nd
            shape = tuple(x.shape[:lead]) + (1,) * nd
        keep = rng.random(shape) >= p
        scaled = (keep / (1.0 - p)).astype(torch.empty((), dtype=x.dtype).numpy().dtype)
        log.masks.append((scaled, p, func.__name__))
        return x * torch.from_numpy(scaled).to(x.device)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in alpha and _is_live(func, args, kwargs):
                raise UserError(f"{func.__name__} in train mode cannot be matched between frameworks: check in eval "
                                "mode, or replace it while checking")
            if func is F.scaled_dot_product_attention:
                return _attention(func, args, kwargs, mode, rng, log)
            if func is F.multi_head_attention_forward:
                # torch's Python attention calls dropout / scaled_dot_product_attention inside, where this
                # mode is off while it handles the outer call: those two are replaced for the call instead
                drop, sdpa = F.dropout, F.scaled_dot_product_attention
                inner = {"dropout": lambda *a, **k: dropout(drop, a, k),
                         "scaled_dot_product_attention": lambda *a, **k: _attention(sdpa, a, k, mode, rng, log)}
                with _replaced(F, inner):
                    return func(*args, **kwargs)
            if func not in functions:
                return func(*args, **kwargs)
            return dropout(func, args, kwargs)

    with Mode():
        yield log


def _is_live(func, args, kwargs) -> bool:
    """Whether a dropout call drops anything (training on, p above 0)."""
    import inspect

    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    return bool(bound.arguments["training"]) and float(bound.arguments["p"]) > 0.0


@contextlib.contextmanager
def _replaced(module, names: dict):
    saved = {name: getattr(module, name) for name in names}
    for name, fn in names.items():
        setattr(module, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(module, name, fn)


def silence_recurrent_dropout(torch_module) -> list:
    """Turn off the between-layer dropout of torch RNNs in train mode (torch draws it inside its
    kernel); -> notes naming each one. Call on a copy."""
    import torch

    notes = []
    for name, m in torch_module.named_modules():
        if isinstance(m, torch.nn.RNNBase) and m.dropout and m.training:
            notes.append(f"{type(m).__name__} {name or '<root>'!r}: its between-layer dropout p={m.dropout} is off on "
                         "both sides (torch draws it inside its kernel)")
            m.dropout = 0.0
    return notes


def fit_mask(mask, shape, channels_first: bool, index: int):
    """A torch-layout mask (as an array) in the shape the Flax input broadcasts it to."""
    import jax.numpy as jnp

    candidates = [mask]
    if mask.ndim >= 3:
        moved = jnp.moveaxis(mask, 1, -1)
        candidates = [moved, mask] if channels_first else [mask, moved]
    for c in candidates:
        try:
            if np.broadcast_shapes(tuple(c.shape), tuple(shape)) == tuple(shape):
                return c
        except ValueError:
            continue
    raise DropoutMismatchError(f"dropout call {index + 1}: torch's mask {tuple(mask.shape)} does not fit the Flax "
                               f"input {tuple(shape)}")


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _attention(func, args, kwargs, mode, rng, log):
    """F.scaled_dot_product_attention with its dropout_p off (mode 'off') or drawn from `rng` and
    logged like a dropout call on the attention weights (N, ..., L, S) ('equal'), in torch's math form."""
    import math

    import torch

    a = {**dict(zip(_SDPA_ARGS, args)), **kwargs}
    p = float(a.get("dropout_p", 0.0))
    if p == 0.0:
        return func(*args, **kwargs)
    if mode == "off":
        return func(**{**a, "dropout_p": 0.0})
    q, k, v = a["query"], a["key"], a["value"]
    if a.get("enable_gqa"):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), -3)
        v = v.repeat_interleave(q.size(-3) // v.size(-3), -3)
    scale = a.get("scale") or 1.0 / math.sqrt(q.size(-1))
    w = q @ k.transpose(-2, -1) * scale
    if a.get("is_causal"):
        w = w.masked_fill(~torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).tril(), float("-inf"))
    mask = a.get("attn_mask")
    if mask is not None:
        w = w.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else w + mask
    w = torch.softmax(w, dim=-1)
    if mode == "given":  # `rng` is the scaled mask itself (graph_replay)
        return (w * torch.from_numpy(rng).to(w.device)) @ v
    keep = rng.random(tuple(w.shape)) >= p
    scaled = (keep / (1.0 - p)).astype(torch.empty((), dtype=w.dtype).numpy().dtype)
    log.masks.append((scaled, p, "scaled_dot_product_attention"))
    return (w * torch.from_numpy(scaled).to(w.device)) @ v


def graph_replay(masks):
    """A function for an fx Interpreter's call_function: the captured graph's dropout ops
    (aten.dropout / feature_dropout in train, scaled_dot_product_attention's dropout_p) take
    `masks` (a DropoutLog's, in order) instead of drawing."""
    import torch

    aten = torch.ops.aten
    served = iter(m for m, _, _ in masks)

    def call(target, args, kwargs, run):
        if target in (aten.dropout.default, aten.feature_dropout.default):
            x, p, train = (list(args) + [kwargs.get("p"), kwargs.get("train")])[:3]
            if not train or not p:
                return run(target, args, kwargs)
            mask = next(served, None)
            if mask is None:
                raise DropoutMismatchError("the captured graph applies dropout more often than the torch module")
            return x * torch.from_numpy(mask)
        if target is aten.scaled_dot_product_attention.default:
            a = {**dict(zip(_SDPA_ARGS, args)), **kwargs}
            if float(a.get("dropout_p") or 0.0):
                mask = next(served, None)
                if mask is None:
                    raise DropoutMismatchError("the captured graph applies dropout more often than the torch module")
                return _attention(None, args, kwargs, "given", mask, DropoutLog())
        return run(target, args, kwargs)

    return call


class FlaxMasks:
    """The Flax side's dropout calls, in order, take the torch side's masks (traced arrays)."""

    def __init__(self, masks, mode: str, channels_first: bool):
        self.masks, self.mode, self.cf, self.used = list(masks), mode, channels_first, 0

    def apply(self, x, rate: float, recurrent: bool):
        if self.mode == "off" or recurrent or rate == 0.0:
            return x
        if self.used >= len(self.masks):
            raise DropoutMismatchError(f"the Flax model applies dropout more often than torch does in one forward "
                                       f"(torch: {len(self.masks)} calls): they must drop in the same places")
        mask = fit_mask(self.masks[self.used], x.shape, self.cf, self.used)
        self.used += 1
        return x * mask.astype(x.dtype)

    def finish(self):
        if self.mode == "equal" and self.used != len(self.masks):
            raise DropoutMismatchError(f"torch applies dropout {len(self.masks)} times in one forward, the Flax model "
                                       f"{self.used}: they must drop in the same places")

    @contextlib.contextmanager
    def linen(self):
        """Intercept flax.linen.Dropout calls (those inside flaxport.nn.LSTM/GRU are off)."""
        from flax import linen as fnn

        from flaxport.nn.recurrent import Recurrent

        def intercept(next_fun, args, kwargs, context):
            mod = context.module
            if not (isinstance(mod, fnn.Dropout) and context.method_name == "__call__"):
                return next_fun(*args, **kwargs)
            det = kwargs.get("deterministic", args[1] if len(args) > 1 else None)
            det = fnn.merge_param("deterministic", mod.deterministic, det)
            if det:
                return args[0] if args else kwargs["inputs"]
            x = args[0] if args else kwargs["inputs"]
            return self.apply(x, float(mod.rate), isinstance(mod.parent, Recurrent))

        with fnn.intercept_methods(intercept):
            yield self

    @contextlib.contextmanager
    def nnx(self, recurrent=()):
        """Replace nnx.Dropout.__call__ for the duration (a trace). recurrent: the NNX classes of
        torch RNNs (a translation's LSTM / GRU): dropout inside their calls is the between-layer
        dropout, off as silence_recurrent_dropout turns it off in torch."""
        from flax import nnx

        original = nnx.Dropout.__call__
        masks = self
        depth = [0]

        def call(mod, inputs, *, deterministic=None, rngs=None):
            det = deterministic if deterministic is not None else mod.deterministic
            if det:
                return inputs
            return masks.apply(inputs, float(mod.rate), depth[0] > 0)

        def counted(method):
            def inside(*args, **kwargs):
                depth[0] += 1
                try:
                    return method(*args, **kwargs)
                finally:
                    depth[0] -= 1
            return inside

        patched = [(cls, cls.__dict__["__call__"]) for cls in recurrent if "__call__" in cls.__dict__]
        nnx.Dropout.__call__ = call
        for cls, method in patched:
            cls.__call__ = counted(method)
        try:
            yield self
        finally:
            nnx.Dropout.__call__ = original
            for cls, method in patched:
                cls.__call__ = method


def describe(mode: str, counts: list, notes: list) -> str:
    """One line for a report: how dropout was handled."""
    if mode == "off":
        text = "off on both sides (dropout='off')"
    elif not any(counts):
        text = "none drawn (no dropout in train mode)"
    else:
        text = (f"masks made equal (torch's masks given to the Flax side; {max(counts)} call"
                f"{'s' if max(counts) != 1 else ''} a forward)")
    return text + "".join(f"; {n}" for n in notes)
