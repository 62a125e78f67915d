"""torch <-> Flax key map for the GAN's G and D (model_torch.MLP <-> model.MLP).

Written out by hand, as the oracle the generic key map is tested against
(tests/test_port_parity.py): flaxport converts through `twin_parts` below, the twins
side by side for flaxport.port's map.

One module at a time: a torch state_dict of G *or* D <-> its Flax variables.

  torch (nn.Sequential index i)          Flax (submodule net_i)
  net.i.weight        (out, in) Linear   params/net_i/kernel  (in, out)   transposed
  net.i.bias          (out,)    Linear   params/net_i/bias    (out,)
  net.i.weight        (C,)      BN1d     params/net_i/scale   (C,)
  net.i.bias          (C,)      BN1d     params/net_i/bias    (C,)
  net.i.running_mean  (C,)      BN1d     batch_stats/net_i/mean (C,)
  net.i.running_var   (C,)      BN1d     batch_stats/net_i/var  (C,)
  net.i.num_batches_tracked ()  BN1d     dropped (only matters for momentum=None)

Going back, `num_batches_tracked` is recreated from the `num_batches_tracked`
argument (default 0). `torch_state_dicts(state)` carries the real count of a GANState:
G runs one train-mode forward per train step (= state.g.step), D one in g_step plus one
per d_step (= state.g.step + state.d.step).

This module imports only NumPy/JAX, never torch: torch tensors are read duck-typed
(`.detach().cpu().numpy()`), and going back the caller wraps with `torch.from_numpy`.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from flaxport.workloads.gan import step

_KEY = re.compile(r"^net\.(\d+)\.(weight|bias|running_mean|running_var|num_batches_tracked)$")
_BN_KEYS = ("weight", "bias", "running_mean", "running_var")
_BN_OPTIONAL = ("num_batches_tracked",)
_LINEAR_KEYS = ("weight", "bias")


def _to_numpy(v) -> np.ndarray:
    """A copy as NumPy (torch tensors via .detach().cpu(); later in-place updates don't leak)."""
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def _torch_key(path) -> str:
    """Flax path ('params', 'net_3', 'kernel') -> torch key 'net.3.weight'."""
    _, mod, name = path
    idx = mod[len("net_"):]
    name = {"kernel": "weight", "scale": "weight", "mean": "running_mean", "var": "running_var"}.get(name, name)
    return f"net.{idx}.{name}"


def torch_to_flax(state_dict, like=None) -> dict:
    """torch state_dict of one MLP (G or D) -> {"params": {...}, "batch_stats": {...}}.

    Values may be torch tensors or NumPy arrays; the result holds NumPy copies.
    Linear weight (out, in) becomes kernel (in, out); BatchNorm1d's four (C,) tensors
    become scale/bias/mean/var; num_batches_tracked (0-d) is dropped.

    Strict: raises ValueError naming the torch key for an unexpected key, a missing key
    of a layer (Linear needs weight+bias, BatchNorm1d weight/bias/running_mean/running_var),
    inconsistent shapes within a layer or between consecutive layers, and, when `like`
    (Flax variables of the target model, arrays or ShapeDtypeStructs) is given, any key or
    shape that differs from it.
    """
    layers: dict[int, dict[str, np.ndarray]] = {}
    for key, value in state_dict.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"unexpected key {key!r}")
        layers.setdefault(int(m.group(1)), {})[m.group(2)] = _to_numpy(value)

    params, stats = {}, {}
    width = None  # features coming out of the previous layer
    for i in sorted(layers):
        layer, name = layers[i], f"net_{i}"
        w = layer.get("weight")
        if w is not None:  # a Linear weight is (out, in), a BatchNorm1d weight (C,)
            is_bn = w.ndim == 1
        else:
            is_bn = any(k in layer for k in ("running_mean", "running_var", "num_batches_tracked"))
        need = _BN_KEYS if is_bn else _LINEAR_KEYS
        for k in need:
            if k not in layer:
                raise ValueError(f"missing key 'net.{i}.{k}'")
        for k in layer:
            if k not in need + (_BN_OPTIONAL if is_bn else ()):
                raise ValueError(f"unexpected key 'net.{i}.{k}'")
        if is_bn:
            c = layer["weight"].shape
            if len(c) != 1 or (width is not None and c[0] != width):
                raise ValueError(f"shape mismatch for 'net.{i}.weight': {c}, expected ({width},)")
            for k in _BN_KEYS[1:]:
                if layer[k].shape != c:
                    raise ValueError(f"shape mismatch for 'net.{i}.{k}': {layer[k].shape}, expected {c}")
            if "num_batches_tracked" in layer and layer["num_batches_tracked"].size != 1:
                raise ValueError(f"shape mismatch for 'net.{i}.num_batches_tracked': "
                                 f"{layer['num_batches_tracked'].shape}, expected ()")
            params[name] = {"scale": layer["weight"], "bias": layer["bias"]}
            stats[name] = {"mean": layer["running_mean"], "var": layer["running_var"]}
        else:
            if w.ndim != 2 or (width is not None and w.shape[1] != width):
                raise ValueError(f"shape mismatch for 'net.{i}.weight': {w.shape}, expected (out, {width})")
            if layer["bias"].shape != (w.shape[0],):
                raise ValueError(f"shape mismatch for 'net.{i}.bias': {layer['bias'].shape}, "
                                 f"expected ({w.shape[0]},)")
            params[name] = {"kernel": np.ascontiguousarray(w.T), "bias": layer["bias"]}
            width = w.shape[0]
    out = {"params": params, "batch_stats": stats}
    if like is not None:
        _check_like(out, like)
    return out


def _check_like(variables, like) -> None:
    like = {c: like.get(c, {}) for c in ("params", "batch_stats")}
    got = {tuple(k.key for k in p): v for p, v in jax.tree_util.tree_leaves_with_path(variables)}
    want = {tuple(k.key for k in p): v for p, v in jax.tree_util.tree_leaves_with_path(like)}
    if missing := sorted(want.keys() - got.keys()):
        raise ValueError(f"missing key {_torch_key(missing[0])!r}")
    if unexpected := sorted(got.keys() - want.keys()):
        raise ValueError(f"unexpected key {_torch_key(unexpected[0])!r}")
    for path in sorted(want):
        if tuple(got[path].shape) != tuple(want[path].shape):
            shape = tuple(want[path].shape)
            if path[-1] == "kernel":
                shape = shape[::-1]  # report in torch's (out, in)
            raise ValueError(f"shape mismatch for {_torch_key(path)!r}: "
                             f"{tuple(got[path].shape)} (flax), expected {shape} (torch)")


def flax_to_torch(variables, num_batches_tracked: int = 0) -> dict:
    """Flax variables of one MLP -> {torch key: NumPy array}.

    kernel (in, out) becomes weight (out, in). `batch_stats` is optional: without it only
    the parameters are emitted (so a gradient tree converts too, e.g.
    `flax_to_torch({"params": grads})`); with it each BatchNorm also gets running_mean,
    running_var and num_batches_tracked (0-d int64, the given count).
    Load with `module.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})`.
    """
    params, stats = variables["params"], variables.get("batch_stats")
    out = {}
    for name in sorted(params, key=lambda n: int(n[len("net_"):])):
        p, prefix = params[name], "net." + name[len("net_"):]
        if "kernel" in p:
            out[f"{prefix}.weight"] = np.ascontiguousarray(np.array(p["kernel"]).T)
            out[f"{prefix}.bias"] = np.array(p["bias"])
        else:
            out[f"{prefix}.weight"] = np.array(p["scale"])
            out[f"{prefix}.bias"] = np.array(p["bias"])
            if stats is not None:
                out[f"{prefix}.running_mean"] = np.array(stats[name]["mean"])
                out[f"{prefix}.running_var"] = np.array(stats[name]["var"])
                out[f"{prefix}.num_batches_tracked"] = np.array(num_batches_tracked, dtype=np.int64)
    return out


def torch_state_dicts(state) -> dict:
    """GANState -> {"G": state_dict, "D": state_dict} (NumPy), counters carried (see top).

    The counters count steps taken in Flax: a state from `state_from_torch` starts at
    step 0 whatever the torch module's num_batches_tracked was.
    """
    g_steps = int(state.g.step)
    return {
        "G": flax_to_torch({"params": state.g.params, "batch_stats": state.g.batch_stats}, g_steps),
        "D": flax_to_torch({"params": state.d.params, "batch_stats": state.d.batch_stats},
                           g_steps + int(state.d.step)),
    }


def state_from_torch(config, torch_gan):
    """step_torch.TorchGAN -> step.GANState with its G/D weights and BatchNorm statistics.

    Optimizer states are fresh (Adam moments at zero, step 0): torch's Adam state is not
    carried over. Keys and shapes are checked against `step.init_state(config, ...)`
    (traced with jax.eval_shape only: nothing is initialised). Values keep the torch
    dtype (float64 modules need jax x64 enabled).
    """
    shapes = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))

    def port(ts, module):
        v = torch_to_flax(module.state_dict(), like=ts.variables())
        params = jax.tree.map(jnp.asarray, v["params"])
        stats = jax.tree.map(jnp.asarray, v["batch_stats"])
        return ts.replace(step=0, params=params, batch_stats=stats, opt_state=ts.tx.init(params))

    return step.GANState(g=port(shapes.g, torch_gan.G), d=port(shapes.d, torch_gan.D))


def twin_parts(config, torch_state=None) -> list:
    """[G, D] as flaxport.workloads.twins.Part: the torch twin's modules (`torch_state`'s, or fresh
    ones) beside the Flax modules, for the generic port tools (convert, parity)."""
    from flaxport.workloads.gan import model, model_torch
    from flaxport.workloads.twins import Part

    ts = torch_state
    g, d = (ts.G, ts.D) if ts is not None else (model_torch.generator(config), model_torch.discriminator(config))
    z = np.zeros((2, config.z_dim), np.float32)
    x = np.zeros((2, 1), np.float32)
    # G runs one train-mode forward per step (g.step); D one in the G step and one per D update.
    return [Part("G", "G.", g, model.generator(config), (z,), None, lambda s: s.g, lambda s, p: s.replace(g=p),
                 lambda s: int(s.g.step)),
            Part("D", "D.", d, model.discriminator(config), (x,), None, lambda s: s.d, lambda s, p: s.replace(d=p),
                 lambda s: int(s.g.step) + int(s.d.step))]
