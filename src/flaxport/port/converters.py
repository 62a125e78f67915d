"""Per-layer converters: where each tensor of a torch layer goes in its Flax twin, and how.

One registry serves the built-in layers and the user's own:

    from flaxport.port import Slot, register_converter

    register_converter(MyScale, lambda torch_layer, flax_layer: {"gamma": "scale"})
    register_converter(MyConv, lambda t, f: {"weight": Slot("kernel", permute=(2, 3, 1, 0)), "bias": "bias"},
                       flax_types=(MyFlaxConv,), channels_first=True)

A converter is a function (torch layer, Flax layer or None) -> {torch tensor name: Slot,
a Flax variable name, or DROP}, for the tensors the torch layer owns directly
(`named_parameters(recurse=False)` and persistent buffers). A Slot says the Flax
variable (name, collection) and the conversion: an axis permutation (and flip), or a
pair of functions `to_flax` / `to_torch` that are each other's inverse. `kind` names
the layer type for pairing layers by call order (default: the torch class name);
`flax_types` are the Flax classes that twin it; `channels_first` says the torch layer
works on (N, C, ...) data, which parity moves channels-last to compare.

The built-in table (the key map's conversions, docs in weights.py) is registered below
through the same function. The newest registration for a torch type wins.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from flaxport.errors import UserError

DROP = "<drop>"  # a torch tensor with no Flax slot that is kept aside (BatchNorm's num_batches_tracked)


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where one torch tensor goes in its Flax layer: variable `name` in `collection`.

    permute: axes, torch -> Flax (np.transpose), then `flip` of those Flax axes; or a
    `to_flax` function (torch array -> Flax array) with its inverse `to_torch`.
    """

    name: str
    collection: str = "params"
    permute: tuple | None = None
    flip: tuple = ()
    to_flax: Callable | None = None
    to_torch: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Converter:
    torch_types: tuple
    fn: Callable  # (torch layer, flax layer or None) -> {torch tensor name: Slot | str | DROP}
    kind: str
    flax_types: tuple = ()
    channels_first: bool = False
    builtin: bool = False

    @property
    def label(self) -> str:
        return "/".join(t.__name__ for t in self.torch_types)


# --------------------------------------------------------------------------- conversions
@dataclasses.dataclass(frozen=True)
class Permute:
    """torch array -> Flax array by an axis permutation, then a flip of some (Flax) axes."""

    axes: tuple
    flip: tuple = ()

    def to_flax(self, a):
        a = np.transpose(a, self.axes)
        return np.ascontiguousarray(np.flip(a, self.flip) if self.flip else a)

    def to_torch(self, a):
        a = np.flip(a, self.flip) if self.flip else a
        return np.ascontiguousarray(np.transpose(a, np.argsort(self.axes)))

    def flax_shape(self, shape):
        return tuple(shape[i] for i in self.axes)


@dataclasses.dataclass(frozen=True)
class FlattenedLinear:
    """Linear weight (O, C*prod(S)) read after a torch flatten of (C, *S), for a Flax flatten of (*S, C)."""

    feature_shape: tuple  # (C, *S), torch's order

    def to_flax(self, w):
        c, s = self.feature_shape[0], self.feature_shape[1:]
        n = len(s)
        w = w.reshape((w.shape[0], c) + s).transpose(tuple(range(2, n + 2)) + (1, 0))
        return np.ascontiguousarray(w.reshape(-1, w.shape[-1]))

    def to_torch(self, k):
        c, s = self.feature_shape[0], self.feature_shape[1:]
        n = len(s)
        k = k.reshape(s + (c, k.shape[-1])).transpose((n + 1, n) + tuple(range(n)))
        return np.ascontiguousarray(k.reshape(k.shape[0], -1))

    def flax_shape(self, shape):
        return (shape[1], shape[0])


@dataclasses.dataclass(frozen=True)
class Functions:
    """A user converter's own pair of functions; the Flax shape is found by converting zeros."""

    forward: Callable
    backward: Callable | None
    label: str

    def to_flax(self, a):
        return np.asarray(self.forward(np.asarray(a)))

    def to_torch(self, a):
        if self.backward is None:
            raise UserError(f"the converter for {self.label} has no to_torch: give its Slot one to map Flax arrays "
                            "(gradients, moments, trained weights) back to torch")
        return np.asarray(self.backward(np.asarray(a)))

    def flax_shape(self, shape):
        return tuple(np.shape(self.to_flax(np.zeros(shape))))


def identity(ndim: int) -> Permute:
    return Permute(tuple(range(ndim)))


def conversion(slot: Slot, ndim: int, label: str):
    """A Slot -> the object that converts one array both ways (Permute or Functions)."""
    if slot.to_flax is not None:
        return Functions(slot.to_flax, slot.to_torch, label)
    return Permute(tuple(slot.permute) if slot.permute is not None else tuple(range(ndim)), tuple(slot.flip))


# --------------------------------------------------------------------------- the registry
_REGISTRY: list = []  # newest first


def register_converter(torch_type, fn, *, flax_types=(), kind: str | None = None,
                       channels_first: bool = False) -> Converter:
    """Teach port_weights / check_parity / check_step a torch layer type -> the Converter.

    torch_type: a torch.nn.Module subclass (or a tuple of them); its instances that own
    tensors directly become layers. fn: (torch layer, Flax layer or None) -> {torch tensor
    name: Slot | Flax variable name | DROP}, or that dict itself when it does not depend on
    the layers. flax_types: Flax module classes that twin it (pairing by call order when the
    names differ). kind: the name pairing uses (default: the class name, lower case).
    channels_first: the layer works on (N, C, ...) tensors (parity compares it channels-last).
    """
    types = torch_type if isinstance(torch_type, tuple) else (torch_type,)
    if not types or not all(isinstance(t, type) for t in types):
        raise UserError(f"register_converter needs a torch layer class, got {torch_type!r}")
    func = fn if callable(fn) else (lambda t, f, table=dict(fn): table)
    conv = Converter(types, func, kind or types[0].__name__.lower(),
                     flax_types if isinstance(flax_types, tuple) else (flax_types,), channels_first)
    _REGISTRY.insert(0, conv)
    return conv


def unregister_converter(converter_or_type) -> None:
    """Remove a registration (the Converter register_converter returned, or every one of a torch type)."""
    _REGISTRY[:] = [c for c in _REGISTRY
                    if c is not converter_or_type and converter_or_type not in c.torch_types]


def converter_for(torch_module) -> Converter | None:
    _builtins()
    return next((c for c in _REGISTRY if isinstance(torch_module, c.torch_types)), None)


def flax_converter_for(flax_module) -> Converter | None:
    _builtins()
    if flax_module is None:
        return None
    return next((c for c in _REGISTRY if c.flax_types and isinstance(flax_module, c.flax_types)), None)


def channels_first_kind(kind: str | None) -> bool:
    _builtins()
    return kind == "pool" or any(c.channels_first and c.kind == kind for c in _REGISTRY)


# --------------------------------------------------------------------------- built-in layers
def _linear(t, f):
    return {"weight": Slot("kernel", permute=(1, 0)), "bias": "bias"}


def _conv(t, f):
    nd = t.weight.ndim
    return {"weight": Slot("kernel", permute=tuple(range(2, nd)) + (1, 0)), "bias": "bias"}


def _conv_transpose(t, f):
    """Three Flax conventions: flaxport.nn (*k, I, O); nn.ConvTranspose the same, spatially flipped;
    nn.ConvTranspose(transpose_kernel=True) (*k, O, I)."""
    from flax import linen as fnn

    from flaxport import nn as fp

    nd = t.weight.ndim
    spatial = tuple(range(2, nd))
    if isinstance(f, fnn.ConvTranspose) and f.transpose_kernel:
        kernel = Slot("kernel", permute=spatial + (1, 0))
    elif isinstance(f, fnn.ConvTranspose) and not isinstance(f, fp.ConvTransposeNd):
        kernel = Slot("kernel", permute=spatial + (0, 1), flip=tuple(range(nd - 2)))
    else:
        kernel = Slot("kernel", permute=spatial + (0, 1))
    return {"weight": kernel, "bias": "bias"}


def _batchnorm(t, f):
    return {"weight": "scale", "bias": "bias", "running_mean": Slot("mean", "batch_stats"),
            "running_var": Slot("var", "batch_stats"), "num_batches_tracked": DROP}


def _norm(t, f):
    return {"weight": "scale", "bias": "bias"}


def _embedding(t, f):
    return {"weight": "embedding"}


def _recurrent(t, f):
    """torch's weight_ih_l0 (G*H, I) -> kernel_ih_l0 (I, G*H); the two biases stay two."""
    if getattr(t, "proj_size", 0):
        raise UserError(f"torch nn.LSTM(proj_size={t.proj_size}) is not supported by flaxport.nn.LSTM: port the "
                        "projection as a Linear after an LSTM without it")
    out = {}
    for name, p in t.named_parameters(recurse=False):
        if name.startswith("weight"):
            out[name] = Slot("kernel" + name[len("weight"):], permute=(1, 0))
        else:
            out[name] = name
    return out


_BUILTINS_DONE = False


def _builtins():
    """Register the built-in table once, oldest first (so a user's registration wins)."""
    global _BUILTINS_DONE
    if _BUILTINS_DONE:
        return
    _BUILTINS_DONE = True
    from flax import linen as fnn
    from torch import nn

    from flaxport import nn as fp

    table: list[tuple[Any, Callable, str, tuple, bool]] = [
        (nn.Linear, _linear, "linear", (fnn.Dense, fp.Dense), False),
        (nn.Conv1d, _conv, "conv1", (), True), (nn.Conv2d, _conv, "conv2", (), True),
        (nn.Conv3d, _conv, "conv3", (), True),
        (nn.ConvTranspose1d, _conv_transpose, "convt1", (), True),
        (nn.ConvTranspose2d, _conv_transpose, "convt2", (), True),
        (nn.ConvTranspose3d, _conv_transpose, "convt3", (), True),
        (nn.modules.batchnorm._BatchNorm, _batchnorm, "batchnorm", (fnn.BatchNorm, fp.BatchNorm), True),
        (nn.LayerNorm, _norm, "layernorm", (fnn.LayerNorm, fp.LayerNorm), False),
        (nn.GroupNorm, _norm, "groupnorm", (fnn.GroupNorm, fp.GroupNorm), True),
        (nn.Embedding, _embedding, "embedding", (fnn.Embed,), False),
        (nn.LSTM, _recurrent, "lstm", (fp.LSTM,), False),
        (nn.GRU, _recurrent, "gru", (fp.GRU,), False),
    ]
    for torch_type, fn, kind, flax_types, cf in table:
        _REGISTRY.append(Converter((torch_type,), fn, kind, flax_types, cf, builtin=True))
