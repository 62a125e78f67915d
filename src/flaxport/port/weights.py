"""torch state_dict <-> Flax variables for any torch module and its hand-written Flax twin.

The map is driven by both trees (the HF / jformers approach, docs: porting pitfalls §9):

1. the Flax module is initialised abstractly (`jax.eval_shape`, nothing computed) on the
   example input, with a method interceptor recording every submodule's class and call
   order; a "layer" is a submodule that owns variables (params and/or batch_stats);
2. the torch module runs once on the same input (eval mode, no grad, flags restored) with
   forward hooks recording call order; a layer owns state_dict entries directly;
3. layers pair by name where the names agree (`block.conv1` = `block/conv1`, `net.0` =
   `net_0`), the rest by call order within a layer kind (linear, conv2, batchnorm, ...);
4. each pair's tensors are converted by kind and rank:

   torch                                  Flax
   Linear.weight (O, I)                   kernel (I, O)            .T
     after a flatten of (C, *S)           kernel (*S*C, O)         rows permuted (flatten_shapes)
   ConvNd.weight (O, I/g, *k)             kernel (*k, I/g, O)      permute(2.., 1, 0)
   ConvTransposeNd.weight (I, O, *k)      flaxport.nn: (*k, I, O)  permute(2.., 0, 1)
                                          nn.ConvTranspose: same, spatially flipped;
                                          transpose_kernel=True: (*k, O, I) permute(2.., 1, 0)
   BatchNorm weight/bias                  params scale/bias
   BatchNorm running_mean/var             batch_stats mean/var     (num_batches_tracked dropped)
   LayerNorm/GroupNorm weight/bias        scale/bias
   Embedding.weight (V, D)                embedding (V, D)
   LSTM/GRU weight_ih_l0 (G*H, I), ...    kernel_ih_l0 (I, G*H) .T; both biases kept (flaxport.nn.LSTM/GRU)

   The table is a registry of per-layer converters (port/converters.py); a layer type it does
   not know is one `register_converter(TorchType, fn)` away.

Strict: a torch tensor without a Flax slot, a Flax variable without a torch tensor, or a
shape that differs after conversion raises a PortError (a UserError) naming both paths.
Imports torch only inside functions that receive torch objects.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

import numpy as np

from flaxport.errors import UserError
from flaxport.port.converters import DROP, FlattenedLinear, Slot, conversion, converter_for, flax_converter_for


class PortError(UserError):
    """The torch module and the Flax module do not line up."""


class MissingKeyError(PortError):
    """A Flax variable (or an expected torch key) has no counterpart."""


class UnexpectedKeyError(PortError):
    """A torch tensor (or a Flax variable) has nowhere to go."""


class ShapeMismatchError(PortError):
    """A tensor's shape after conversion differs from its slot's."""


class UnsupportedLayerError(PortError):
    """A layer type the porter does not know how to convert."""


# Kinds whose torch layer works on (N, C, ...) data (a registered converter can add its own).
CHANNELS_FIRST_KINDS = {"conv1", "conv2", "conv3", "convt1", "convt2", "convt3", "batchnorm", "groupnorm", "pool"}


def _np(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def canonical(name: str) -> str:
    """Name used to pair layers: torch 'block.0.conv' and Flax 'block_0/conv' both -> 'block.0.conv'."""
    return re.sub(r"[._/]+", ".", name).lower()


# --------------------------------------------------------------------------- conversions
@dataclasses.dataclass(frozen=True)
class Leaf:
    """One tensor: torch key <-> Flax path ('params', 'fc1', 'kernel'), with its conversion."""

    torch_key: str
    flax_path: tuple
    convert: Any  # Permute or FlattenedLinear

    @property
    def flax_name(self) -> str:
        return "/".join(self.flax_path)


@dataclasses.dataclass
class LayerPair:
    torch_name: str
    flax_path: tuple  # module path, without the collection
    kind: str

    @property
    def flax_name(self) -> str:
        return "/".join(self.flax_path) or "<root>"


# --------------------------------------------------------------------------- layer discovery
def _torch_kind(module) -> str | None:
    """The kind of a torch layer: its converter's (linear, conv2, lstm, a user's, ...), 'pool' or
    'gelu' for the parameter-free layers parity pairs, else None."""
    from torch import nn

    conv = converter_for(module)
    if conv is not None:
        return conv.kind
    if isinstance(module, (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d)):
        return "pool"
    if isinstance(module, nn.GELU):
        return "gelu"
    return None


def _flax_kind(module, leaves: dict) -> tuple[str, str]:
    """(kind, convt variant) of a Flax layer from its class, else from its variables' names and ranks.

    leaves: {(collection, name): shape}. Variant for transposed convs: 'flaxport' (kernel
    (*k, I, O), flipped in the forward), 'flax' (nn.ConvTranspose: flipped kernel), 'flax_tk'
    (transpose_kernel=True: kernel (*k, O, I)).
    """
    from flax import linen as fnn

    from flaxport import nn as fp

    kernel = leaves.get(("params", "kernel"))
    rank = len(kernel) if kernel is not None else 0
    if isinstance(module, fp.ConvTransposeNd):
        return f"convt{rank - 2}", "flaxport"
    if isinstance(module, fnn.ConvTranspose):
        return f"convt{rank - 2}", "flax_tk" if module.transpose_kernel else "flax"
    registered = flax_converter_for(module)
    if registered is not None:
        return registered.kind, ""
    known = [((fnn.Conv, fp.Conv2d, fp.ConvNd), f"conv{rank - 2}"), ((fp.MaxPool, fp.AvgPool), "pool"),
             ((fp.GELU,), "gelu")]
    for classes, kind in known:
        if module is not None and isinstance(module, classes):
            return kind, ""
    names = {name for _, name in leaves}
    if ("params", "embedding") in leaves:
        return "embedding", ""
    if ("batch_stats", "mean") in leaves:
        return "batchnorm", ""
    if kernel is not None:
        return ("linear" if rank == 2 else f"conv{rank - 2}"), "flaxport"
    if names and names <= {"scale", "bias"}:
        return "norm", ""  # a LayerNorm or GroupNorm of unknown class
    return "", ""


def _compatible(torch_kind: str, flax_kind: str) -> bool:
    return torch_kind == flax_kind or (flax_kind == "norm" and torch_kind in ("layernorm", "groupnorm"))


def set_torch_mode(torch_module, train: bool):
    """torch_module (returned) with it and every submodule in train (or eval) mode, set directly:
    a module of yours may override train() with a signature of its own."""
    for module in torch_module.modules():
        module.training = train
    return torch_module


def mode_kwargs(flax_module, train: bool) -> dict:
    """Keyword arguments that put a Flax module in train/eval mode, by its __call__'s parameter names."""
    params = inspect.signature(flax_module.__call__).parameters
    for name, value in (("train", train), ("training", train), ("is_training", train),
                        ("deterministic", not train), ("use_running_average", not train)):
        if name in params:
            return {name: value}
    return {}


def to_flax_input(x, channels_first: bool):
    """A torch-layout input (tensor or array) -> NumPy for Flax: float (N, C, *S) -> (N, *S, C) if channels_first."""
    a = _np(x)
    if channels_first and a.ndim in (3, 4, 5) and np.issubdtype(a.dtype, np.floating):
        a = np.moveaxis(a, 1, -1)
    return a


def to_torch_input(x):
    """A tensor as is; an array as a tensor (NumPy copy)."""
    if hasattr(x, "detach"):
        return x
    import torch

    return torch.from_numpy(np.array(x))


def as_tuple(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def input_channels_first(torch_module, inputs, input_layout: str) -> bool:
    """Whether the inputs are channels-first: 'channels_first', 'channels_last', or 'auto'
    (a float input of rank 4 or 5 is; one of rank 3 is when the torch module has a 1-d conv)."""
    if input_layout in ("channels_first", "channels_last"):
        return input_layout == "channels_first"
    if input_layout != "auto":
        raise PortError(f"input_layout {input_layout!r}: use 'auto', 'channels_first' or 'channels_last'")
    ranks = {np.ndim(_np(x)) for x in as_tuple(inputs)}
    if ranks & {4, 5}:
        return True
    if 3 in ranks:
        return any(_torch_kind(m) in ("conv1", "convt1") for m in torch_module.modules())
    return False


def split_rngs(flax_kwargs, default_key) -> tuple[dict, dict]:
    """(flax_kwargs without 'rngs', the rngs for apply/init): a user's `rngs` (a dict of keys,
    one key, or an int seed) over {'params': default_key, 'dropout': default_key}."""
    import jax

    kwargs = dict(flax_kwargs or {})
    rngs = {"params": default_key, "dropout": default_key}
    given = kwargs.pop("rngs", None)
    if isinstance(given, int):
        given = jax.random.key(given)
    if isinstance(given, dict):
        rngs.update(given)
    elif given is not None:
        rngs.update({"params": given, "dropout": given})
    return kwargs, rngs


def flax_layers(flax_module, flax_inputs, flax_kwargs) -> tuple[dict, dict]:
    """({module path: module instance} in first-call order, abstract variables) of an abstract init."""
    import jax
    from flax import linen as fnn

    calls: dict = {}

    def record(next_fun, args, kwargs, context):
        calls.setdefault(tuple(context.module.path), context.module)
        return next_fun(*args, **kwargs)

    kwargs, rngs = split_rngs(flax_kwargs, jax.random.key(0))
    with fnn.intercept_methods(record):
        shapes = jax.eval_shape(lambda: flax_module.init(rngs, *flax_inputs, **kwargs))
    return calls, dict(shapes)


def torch_call_order(torch_module, torch_inputs, torch_kwargs) -> list:
    """Names of torch submodules in first-call order (one forward in eval mode, no grad)."""
    import torch

    order: list = []
    names = {id(m): n for n, m in torch_module.named_modules()}
    handles = [m.register_forward_pre_hook(lambda mod, args: order.append(names[id(mod)]))
               for m in torch_module.modules()]
    modes = {m: m.training for m in torch_module.modules()}
    try:
        set_torch_mode(torch_module, False)
        with torch.no_grad():
            torch_module(*torch_inputs, **torch_kwargs)
    finally:
        for h in handles:
            h.remove()
        for m, mode in modes.items():
            m.training = mode
    return list(dict.fromkeys(order))


# --------------------------------------------------------------------------- the key map
@dataclasses.dataclass
class KeyMap:
    """The pairing of one torch module with one Flax module; converts both ways, strictly."""

    leaves: list  # [Leaf], in torch state_dict order
    pairs: list  # [LayerPair], in torch call order
    dropped: dict  # {torch key: its value at build time} (num_batches_tracked)
    torch_keys: list  # full torch state_dict key order
    flax_shapes: dict  # {flax path tuple: shape}
    input_channels_first: bool = False

    def to_flax(self, state_dict) -> dict:
        """torch state_dict (tensors or arrays) -> {'params': ..., 'batch_stats': ...} of NumPy copies."""
        sd = dict(state_dict)
        want = {leaf.torch_key for leaf in self.leaves}
        missing = [k for k in self.torch_keys if k in want and k not in sd]
        if missing:
            leaf = next(l for l in self.leaves if l.torch_key == missing[0])
            raise MissingKeyError(f"torch state_dict lacks {missing[0]!r} (for Flax {leaf.flax_name!r})")
        extra = [k for k in sd if k not in want and k not in self.dropped]
        if extra:
            raise UnexpectedKeyError(f"torch state_dict has {extra[0]!r}, which no Flax variable takes")
        out: dict = {}
        for leaf in self.leaves:
            a = _np(sd[leaf.torch_key])
            want_shape = self.flax_shapes[leaf.flax_path]
            try:
                v = leaf.convert.to_flax(a)
            except ValueError:
                v = None
            if v is None or tuple(v.shape) != tuple(want_shape):
                raise ShapeMismatchError(
                    f"shape mismatch: torch {leaf.torch_key!r} {tuple(a.shape)} -> "
                    f"{None if v is None else tuple(v.shape)}, but Flax {leaf.flax_name!r} is {tuple(want_shape)}")
            node = out
            for part in leaf.flax_path[:-1]:
                node = node.setdefault(part, {})
            node[leaf.flax_path[-1]] = v
        return out

    def params_to_flax(self, tensors) -> dict:
        """{torch parameter name: array} (every parameter; gradients, moments) -> the 'params' tree, NumPy."""
        out: dict = {}
        for leaf in self.leaves:
            if leaf.flax_path[0] != "params":
                continue
            if leaf.torch_key not in tensors:
                raise MissingKeyError(f"no {leaf.torch_key!r} among the torch tensors (for Flax {leaf.flax_name!r})")
            node = out
            for part in leaf.flax_path[1:-1]:
                node = node.setdefault(part, {})
            node[leaf.flax_path[-1]] = leaf.convert.to_flax(_np(tensors[leaf.torch_key]))
        return out

    def to_torch(self, variables, num_batches_tracked=None) -> dict:
        """Flax variables -> {torch key: NumPy array}, in the torch module's state_dict order.

        A tree with only 'params' (a gradient, say) converts the parameters only. Otherwise
        every torch key is produced; num_batches_tracked is `num_batches_tracked` if given,
        else the torch module's value when the map was built.
        """
        flat = _flatten(variables)
        params_only = "batch_stats" not in variables and any(l.flax_path[0] == "batch_stats" for l in self.leaves)
        used = [l for l in self.leaves if not (params_only and l.flax_path[0] != "params")]
        for leaf in used:
            if leaf.flax_path not in flat:
                raise MissingKeyError(f"Flax variables lack {leaf.flax_name!r} (for torch {leaf.torch_key!r})")
        known = {l.flax_path for l in self.leaves}
        if extra := [p for p in flat if p not in known]:
            raise UnexpectedKeyError(f"Flax variables have {'/'.join(extra[0])!r}, which no torch tensor takes")
        by_key = {}
        for leaf in used:
            a = np.asarray(flat[leaf.flax_path])
            if tuple(a.shape) != tuple(self.flax_shapes[leaf.flax_path]):
                raise ShapeMismatchError(f"shape mismatch: Flax {leaf.flax_name!r} {tuple(a.shape)}, expected "
                                         f"{tuple(self.flax_shapes[leaf.flax_path])} (torch {leaf.torch_key!r})")
            by_key[leaf.torch_key] = leaf.convert.to_torch(a)
        if not params_only:
            for k, v in self.dropped.items():
                by_key[k] = v if num_batches_tracked is None else np.array(num_batches_tracked, dtype=v.dtype)
        return {k: by_key[k] for k in self.torch_keys if k in by_key}


def _flatten(tree, prefix=()) -> dict:
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict) or hasattr(v, "items"):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def build_key_map(torch_module, flax_module, example_input, *, flatten_shapes=None, input_layout="auto",
                  flax_kwargs=None, torch_kwargs=None) -> KeyMap:
    """Pair the layers of `torch_module` and `flax_module` (see the module docstring) -> KeyMap.

    example_input: an array or tuple of arrays in torch layout (what torch_module takes);
    Flax gets them channels-last (see `input_channels_first`). flax_kwargs default to the
    eval-mode flag of the Flax __call__ (train=False, deterministic=True, ...).
    flatten_shapes: {torch Linear name: (C, *S)} for a Linear reading a flattened (C, *S) map.
    """
    inputs = as_tuple(example_input)
    cf = input_channels_first(torch_module, inputs, input_layout)
    fkw = {**mode_kwargs(flax_module, False), **(flax_kwargs or {})}
    calls, shapes = flax_layers(flax_module, [to_flax_input(x, cf) for x in inputs], fkw)
    shapes.pop("intermediates", None)
    if other := sorted(set(shapes) - {"params", "batch_stats"}):
        raise PortError(f"Flax collection {other[0]!r} is not supported (only params and batch_stats)")
    flat = {p: tuple(s.shape) for p, s in _flatten(shapes).items()}

    # Flax layers: module path -> {(collection, leaf name): shape}, in first-call order.
    flax_leaves: dict = {}
    for path, shape in flat.items():
        flax_leaves.setdefault(path[1:-1], {})[(path[0], path[-1])] = shape
    order = {p: i for i, p in enumerate(calls)}
    flax_paths = sorted(flax_leaves, key=lambda p: order.get(p, len(order)))
    flax_info = {p: _flax_kind(calls.get(p), flax_leaves[p]) for p in flax_paths}  # kind "": pairs by name only

    # torch layers: owner module name -> [state_dict keys], in first-call order.
    sd = torch_module.state_dict()
    mods = dict(torch_module.named_modules())
    torch_owned: dict = {}
    for k in sd:
        owner, _, _ = k.rpartition(".")
        torch_owned.setdefault(owner, []).append(k)
    called = {n: i for i, n in enumerate(torch_call_order(torch_module, [to_torch_input(x) for x in inputs],
                                                          torch_kwargs or {}))}
    reg = {n: i for i, n in enumerate(mods)}
    torch_names = sorted(torch_owned, key=lambda n: (called.get(n, len(called)), reg.get(n, 0)))
    torch_kinds = {}
    for n in torch_names:
        torch_kinds[n] = _torch_kind(mods[n])
        if torch_kinds[n] in (None, "pool", "gelu"):
            cls = type(mods[n])
            raise UnsupportedLayerError(f"torch layer {n!r} ({cls.__name__}, tensor {torch_owned[n][0]!r}) is not a "
                                        f"type flaxport.port converts: register one with flaxport.port."
                                        f"register_converter({cls.__name__}, fn) (docs/porting.md)")

    # Pair: by name, then by call order within a kind.
    pairs, flax_left = [], list(flax_paths)
    by_canon = {canonical("/".join(p)): p for p in flax_paths}
    torch_left = []
    for n in torch_names:
        p = by_canon.get(canonical(n))
        if p is not None and p in flax_left:
            fk = flax_info[p][0]
            if fk and not _compatible(torch_kinds[n], fk):
                raise PortError(f"torch {n!r} is {type(mods[n]).__name__} ({torch_kinds[n]}) but the Flax layer "
                                f"of the same name {'/'.join(p)!r} is {type(calls.get(p)).__name__} ({fk or '?'})")
            pairs.append(LayerPair(n, p, torch_kinds[n]))
            flax_left.remove(p)
        else:
            torch_left.append(n)
    for n in torch_left:
        p = next((p for p in flax_left if _compatible(torch_kinds[n], flax_info[p][0])), None)
        if p is None:
            raise UnexpectedKeyError(f"torch {torch_owned[n][0]!r} ({type(mods[n]).__name__} {n!r}) has no Flax "
                                     f"counterpart: no unpaired Flax layer of kind {torch_kinds[n]!r} is left "
                                     f"(unpaired Flax layers: {['/'.join(q) for q in flax_left]})")
        pairs.append(LayerPair(n, p, torch_kinds[n]))
        flax_left.remove(p)
    if flax_left:
        p = flax_left[0]
        leaf = next(iter(flax_leaves[p]))
        if not flax_info[p][0]:
            raise UnsupportedLayerError(f"Flax layer {'/'.join(p)!r} ({type(calls.get(p)).__name__}, variables "
                                        f"{sorted('/'.join(t) for t in flax_leaves[p])}) is not a type flaxport.port "
                                        "converts: name it as its torch layer, or register_converter(TorchType, fn, "
                                        f"flax_types=({type(calls.get(p)).__name__},))")
        raise MissingKeyError(f"Flax {'/'.join((leaf[0],) + p + (leaf[1],))!r} ({type(calls.get(p)).__name__}) "
                              f"has no torch counterpart: every torch layer is paired already")
    pairs.sort(key=lambda pr: torch_names.index(pr.torch_name))

    flatten_shapes = dict(flatten_shapes or {})
    for name in flatten_shapes:
        if name not in mods or _torch_kind(mods[name]) != "linear":
            raise PortError(f"flatten_shapes names {name!r}, which is not a torch Linear layer")
    leaves, dropped = [], {}
    for pair in pairs:
        n, p = pair.torch_name, pair.flax_path
        table = _converter_table(mods[n], calls.get(p), n)
        label = f"the converter for {type(mods[n]).__name__}"
        covered = set()
        for key in torch_owned[n]:
            leaf_name = key.rpartition(".")[2]
            slot = table.get(leaf_name)
            if slot == DROP:
                dropped[key] = _np(sd[key])
                continue
            slot = Slot(slot) if isinstance(slot, str) else slot
            target = (slot.collection, slot.name) if slot is not None else None
            if target is None or target not in flax_leaves[p]:
                want = "/".join(target[:1] + p + target[1:]) if target else "?"
                raise UnexpectedKeyError(f"torch {key!r} has no counterpart: Flax layer {pair.flax_name!r} has no "
                                         f"{want!r} (its variables: {sorted('/'.join(t) for t in flax_leaves[p])})")
            conv = conversion(slot, sd[key].ndim, label)
            if n in flatten_shapes and leaf_name == "weight":
                conv = FlattenedLinear(tuple(flatten_shapes[n]))
            covered.add(target)
            leaves.append(Leaf(key, (target[0],) + p + (target[1],), conv))
        for target in flax_leaves[p]:
            if target not in covered:
                raise MissingKeyError(f"Flax {'/'.join((target[0],) + p + (target[1],))!r} has no torch "
                                      f"counterpart in layer {n!r} (its tensors: {torch_owned[n]})")
    km = KeyMap(leaves=leaves, pairs=pairs, dropped=dropped, torch_keys=list(sd), flax_shapes=flat,
                input_channels_first=cf)
    for leaf in leaves:  # shape check now, so errors come at build time
        t_shape = tuple(sd[leaf.torch_key].shape)
        try:
            got = leaf.convert.flax_shape(t_shape)
        except Exception as e:  # a user's to_flax that fails on an array of the tensor's shape
            raise PortError(f"{getattr(leaf.convert, 'label', 'the converter')} failed on torch {leaf.torch_key!r} {t_shape}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        if isinstance(leaf.convert, FlattenedLinear):
            c_s = leaf.convert.feature_shape
            if int(np.prod(c_s)) != t_shape[1]:
                raise ShapeMismatchError(f"flatten_shapes[{leaf.torch_key.rpartition('.')[0]!r}] = {c_s} has "
                                         f"{int(np.prod(c_s))} features, torch {leaf.torch_key!r} reads {t_shape[1]}")
        if got != flat[leaf.flax_path]:
            by = f" by {leaf.convert.label}" if hasattr(leaf.convert, "label") else ""
            raise ShapeMismatchError(f"shape mismatch: torch {leaf.torch_key!r} {t_shape} -> {got}{by}, but Flax "
                                     f"{leaf.flax_name!r} is {flat[leaf.flax_path]}")
    return km


def _converter_table(torch_layer, flax_layer, name) -> dict:
    """The layer's converter's {torch tensor name: Slot | str | DROP}, its failures as one-line PortErrors."""
    conv = converter_for(torch_layer)
    try:
        table = conv.fn(torch_layer, flax_layer)
    except UserError:
        raise
    except Exception as e:
        raise PortError(f"the converter for {type(torch_layer).__name__} failed on torch layer {name!r}: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    if not isinstance(table, dict):
        raise PortError(f"the converter for {type(torch_layer).__name__} returned {type(table).__name__}, not a "
                        "dict {torch tensor name: Slot or Flax variable name}")
    return table


# --------------------------------------------------------------------------- public API
def port_weights(torch_module, flax_module, example_input, *, flatten_shapes=None, input_layout="auto",
                 flax_kwargs=None, torch_kwargs=None) -> dict:
    """torch_module's weights as Flax variables for `flax_module` -> {'params', 'batch_stats'?} of NumPy arrays.

    example_input: array/tensor or tuple of them, torch layout (e.g. images (N, C, H, W));
    the Flax module is initialised abstractly on them converted to channels-last.
    flatten_shapes: {torch Linear name: (C, *S)} for a Linear after a flatten of a (C, *S)
    feature map (its rows are permuted to Flax's (*S, C) flatten order).
    Raises PortError (MissingKeyError, UnexpectedKeyError, ShapeMismatchError, ...) naming
    the torch key and the Flax path.
    """
    km = build_key_map(torch_module, flax_module, example_input, flatten_shapes=flatten_shapes,
                       input_layout=input_layout, flax_kwargs=flax_kwargs, torch_kwargs=torch_kwargs)
    return km.to_flax(torch_module.state_dict())


def to_torch_state_dict(variables, torch_module, flax_module, example_input, *, flatten_shapes=None,
                        key_map: KeyMap | None = None, num_batches_tracked=None, input_layout="auto",
                        flax_kwargs=None, torch_kwargs=None) -> dict:
    """Flax variables -> an OrderedDict of torch tensors that `torch_module.load_state_dict` takes (strict).

    The inverse of port_weights (same arguments); bit-exact both ways. num_batches_tracked
    defaults to the torch module's current counters. Pass `key_map` to skip rebuilding it.
    """
    import collections

    import torch

    km = key_map or build_key_map(torch_module, flax_module, example_input, flatten_shapes=flatten_shapes,
                                  input_layout=input_layout, flax_kwargs=flax_kwargs, torch_kwargs=torch_kwargs)
    return collections.OrderedDict((k, torch.from_numpy(np.array(v)))
                                   for k, v in km.to_torch(variables, num_batches_tracked).items())

