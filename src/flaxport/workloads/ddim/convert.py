"""torch <-> Flax key map for the DDIM UNet (model_torch.UNet <-> model.UNet).

Written out by hand, as the oracle the generic key map is tested against
(tests/test_port_parity.py): flaxport converts through `twin_parts` below, the twins
side by side for flaxport.port's map.

  torch                          shape               Flax                              shape
  stem.weight / head.weight      (O, I, 1, 1)        params/stem|head/kernel           (1, 1, I, O)  permute(2, 3, 1, 0)
  B.shortcut.weight              (O, I, 1, 1)        params/B/shortcut/kernel          (1, 1, I, O)  (width changes only)
  B.conv1.weight, B.conv2.weight (O, I, 3, 3)        params/B/conv1|conv2/kernel       (3, 3, I, O)
  <conv>.bias                    (O,)                params/<conv>/bias                (O,)
  B.norm.running_mean / _var     (C,)                batch_stats/B/norm/mean / var     (C,)
  B.norm.num_batches_tracked     ()                  dropped (momentum is set, so torch never reads it)

B runs over model.block_names(config): down{i}_{j}, mid{j}, up{i}_{j}. The norms have no
weight/bias (affine=False, keras center=False, scale=False). The embedding's frequencies
are a float64 constant in both twins: no key on either side.

Imports only NumPy/JAX: torch tensors are read duck-typed (`.detach().cpu().numpy()`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flaxport.workloads.ddim import model, step


def _np(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def _convs(config):
    """[(torch/Flax path parts, cin, cout, kernel size)] of every conv."""
    out = [(("stem",), config.channels, config.widths[0], 1)]
    for name, cin, width in model.block_names(config):
        if cin != width:
            out.append(((name, "shortcut"), cin, width, 1))
        out.append(((name, "conv1"), cin, width, 3))
        out.append(((name, "conv2"), width, width, 3))
    out.append((("head",), config.widths[0], config.channels, 1))
    return out


def torch_shapes(config) -> dict:
    """{torch key: shape} of model_torch.UNet for this config (num_batches_tracked left out)."""
    shapes = {}
    for parts, cin, cout, k in _convs(config):
        shapes[".".join(parts) + ".weight"] = (cout, cin, k, k)
        shapes[".".join(parts) + ".bias"] = (cout,)
    for name, cin, _ in model.block_names(config):
        shapes[f"{name}.norm.running_mean"] = (cin,)
        shapes[f"{name}.norm.running_var"] = (cin,)
    return shapes


def _nest(tree: dict, parts: tuple, leaf) -> None:
    for p in parts[:-1]:
        tree = tree.setdefault(p, {})
    tree[parts[-1]] = leaf


def _get(tree: dict, parts: tuple):
    for p in parts:
        tree = tree[p]
    return np.asarray(tree)


def torch_to_flax(config, state_dict) -> dict:
    """torch state_dict of model_torch.UNet -> {"params", "batch_stats"} (NumPy copies).

    Strict: raises ValueError naming the torch key for a missing or unexpected key, or a
    shape that does not fit the config's model.
    """
    sd = {k: _np(v) for k, v in state_dict.items()}
    shapes = torch_shapes(config)
    if missing := sorted(shapes.keys() - sd.keys()):
        raise ValueError(f"missing key {missing[0]!r}")
    if extra := sorted(k for k in sd.keys() - shapes.keys() if not k.endswith(".norm.num_batches_tracked")):
        raise ValueError(f"unexpected key {extra[0]!r}")
    for k, shape in shapes.items():
        if sd[k].shape != shape:
            raise ValueError(f"shape mismatch for {k!r}: {sd[k].shape}, expected {shape}")
    params, stats = {}, {}
    for parts, *_ in _convs(config):
        key = ".".join(parts)
        _nest(params, parts + ("kernel",), np.ascontiguousarray(sd[key + ".weight"].transpose(2, 3, 1, 0)))
        _nest(params, parts + ("bias",), sd[key + ".bias"])
    for name, *_ in model.block_names(config):
        stats[name] = {"norm": {"mean": sd[f"{name}.norm.running_mean"], "var": sd[f"{name}.norm.running_var"]}}
    return {"params": params, "batch_stats": stats}


def flax_to_torch(config, variables, num_batches_tracked: int = 0) -> dict:
    """Flax variables -> {torch key: NumPy array}; without batch_stats only parameters
    (so a gradient tree converts too: `flax_to_torch(config, {"params": grads})`).

    Strict the other way too: a Flax leaf the key map does not know raises ValueError."""
    params, stats = variables["params"], variables.get("batch_stats")
    known = {parts + (leaf,) for parts, *_ in _convs(config) for leaf in ("kernel", "bias")}
    flat = {tuple(getattr(k, "key", k) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
    if extra := sorted(flat - known):
        raise ValueError(f"unexpected Flax parameter {'/'.join(extra[0])!r}")
    out = {}
    for parts, *_ in _convs(config):
        key = ".".join(parts)
        try:
            out[key + ".weight"] = np.ascontiguousarray(_get(params, parts + ("kernel",)).transpose(3, 2, 0, 1))
            out[key + ".bias"] = _get(params, parts + ("bias",))
        except KeyError:
            raise ValueError(f"missing Flax parameter {'/'.join(parts)!r}") from None
    if stats is not None:
        for name, *_ in model.block_names(config):
            try:
                out[f"{name}.norm.running_mean"] = _get(stats, (name, "norm", "mean"))
                out[f"{name}.norm.running_var"] = _get(stats, (name, "norm", "var"))
            except KeyError:
                raise ValueError(f"missing Flax batch_stats {name + '/norm'!r}") from None
            out[f"{name}.norm.num_batches_tracked"] = np.array(num_batches_tracked, dtype=np.int64)
    for k, shape in torch_shapes(config).items():
        if k in out and out[k].shape != shape:
            raise ValueError(f"shape mismatch for {k!r}: {out[k].shape}, expected {shape}")
    return out


def state_from_torch(config, torch_ddim) -> step.DDIMState:
    """step_torch.TorchDDIM -> DDIMState with its weights, BN statistics and EMA network.

    AdamW starts fresh (moments at zero, step 0). Values keep the torch dtype (float64
    modules need jax x64 enabled).
    """
    v = torch_to_flax(config, torch_ddim.model.state_dict())
    ema = torch_to_flax(config, torch_ddim.ema_model.state_dict())
    as_jax = lambda t: jax.tree.map(jnp.asarray, t)  # noqa: E731
    params, tx = as_jax(v["params"]), step.optimizer(config)
    # What init_state builds, without tracing an init: the tree is the converted one.
    return step.DDIMState(step=0, apply_fn=model.unet(config).apply, params=params, tx=tx,
                          opt_state=jax.jit(tx.init)(params), batch_stats=as_jax(v["batch_stats"]),
                          ema_params=as_jax(ema["params"]), ema_batch_stats=as_jax(ema["batch_stats"]))


def twin_parts(config, torch_state=None) -> list:
    """[the UNet] as a flaxport.workloads.twins.Part, with its EMA copy: the torch twin
    (`torch_state`'s, or a fresh one) beside the Flax module, for the generic port tools."""
    from flaxport.workloads.ddim import model_torch
    from flaxport.workloads.twins import Part, replace_whole, whole

    net = torch_state.model if torch_state is not None else model_torch.UNet(config)
    # Two inputs: noisy images (N, C, H, W) and noise variances (N, 1, 1, 1). Both are float
    # rank 4, so both go channels-last for Flax; moving axis 1 of an (N, 1, 1, 1) array to
    # the end leaves it as it is, which is the variance input the Flax UNet takes.
    x = np.zeros((2, config.channels, config.image_size, config.image_size), np.float32)
    variances = np.zeros((2, 1, 1, 1), np.float32)
    # One train-mode forward per step (the noise loss), so num_batches_tracked follows step.
    return [Part("model", "", net, model.unet(config), (x, variances), None, whole, replace_whole,
                 lambda s: int(s.step), ema=("ema_params", "ema_batch_stats"))]
