"""torch <-> Flax key map for the CNN (model_torch.CNN <-> model.CNN).

Written out by hand, as the oracle the generic key map is tested against
(tests/test_port_parity.py): flaxport converts through `twin_parts` below, the twins
side by side for flaxport.port's map.

  torch                       shape            Flax                        shape
  convK.weight                (O, I, 3, 3)     params/convK/kernel         (3, 3, I, O)   permute(2, 3, 1, 0)
  convK.bias                  (O,)             params/convK/bias           (O,)
  bnK.weight / bnK.bias       (C,)             params/bnK/scale / bias     (C,)
  bnK.running_mean / _var     (C,)             batch_stats/bnK/mean / var  (C,)
  bnK.num_batches_tracked     ()               dropped (only matters for momentum=None)
  fc1.weight                  (256, C*H*W)     params/fc1/kernel           (H*W*C, 256)   rows permuted
  fc2.weight                  (10, 256)        params/fc2/kernel           (256, 10)      transposed
  fcK.bias                    (out,)           params/fcK/bias             (out,)

fc1 is the one that silently breaks a port: torch flattens NCHW activations in (c, h, w)
order, Flax flattens NHWC in (h, w, c) order. Copying `fc1.weight.T` as is gives a model
that runs, with the right shapes, and computes something else (tests/test_cnn_parity.py
shows the logits then differ by O(1)). The rows are permuted here instead.

Imports only NumPy/JAX: torch tensors are read duck-typed (`.detach().cpu().numpy()`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from flaxport.workloads.cnn import model, step


def _np(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def _fc1_to_flax(w, c, h, wd):
    """torch fc1.weight (out, C*H*W) -> Flax kernel (H*W*C, out)."""
    out = w.shape[0]
    return np.ascontiguousarray(w.reshape(out, c, h, wd).transpose(2, 3, 1, 0).reshape(h * wd * c, out))


def _fc1_to_torch(k, c, h, wd):
    """Flax fc1 kernel (H*W*C, out) -> torch weight (out, C*H*W)."""
    out = k.shape[1]
    return np.ascontiguousarray(k.reshape(h, wd, c, out).transpose(3, 2, 0, 1).reshape(out, c * h * wd))


def torch_to_flax(config, state_dict) -> dict:
    """torch state_dict of model_torch.CNN -> {"params", "batch_stats"} (NumPy copies).

    Strict: raises ValueError naming the torch key for a missing or unexpected key, or a
    shape that does not fit the config's model.
    """
    sd = {k: _np(v) for k, v in state_dict.items()}
    expected = set(torch_shapes(config))
    if missing := sorted(expected - sd.keys()):
        raise ValueError(f"missing key {missing[0]!r}")
    extra = sorted(k for k in sd.keys() - expected if not k.endswith("num_batches_tracked"))
    if extra:
        raise ValueError(f"unexpected key {extra[0]!r}")
    for k, shape in torch_shapes(config).items():
        if sd[k].shape != shape:
            raise ValueError(f"shape mismatch for {k!r}: {sd[k].shape}, expected {shape}")
    params, stats = {}, {}
    for i in range(1, len(config.conv_widths) + 1):
        params[f"conv{i}"] = {"kernel": np.ascontiguousarray(sd[f"conv{i}.weight"].transpose(2, 3, 1, 0)),
                              "bias": sd[f"conv{i}.bias"]}
        params[f"bn{i}"] = {"scale": sd[f"bn{i}.weight"], "bias": sd[f"bn{i}.bias"]}
        stats[f"bn{i}"] = {"mean": sd[f"bn{i}.running_mean"], "var": sd[f"bn{i}.running_var"]}
    params["fc1"] = {"kernel": _fc1_to_flax(sd["fc1.weight"], *model.flat_geometry(config)), "bias": sd["fc1.bias"]}
    params["fc2"] = {"kernel": np.ascontiguousarray(sd["fc2.weight"].T), "bias": sd["fc2.bias"]}
    return {"params": params, "batch_stats": stats}


def flax_to_torch(config, variables, num_batches_tracked: int = 0) -> dict:
    """Flax variables -> {torch key: NumPy array}; without batch_stats only parameters
    (so a gradient tree converts too: `flax_to_torch(config, {"params": grads})`)."""
    params, stats = variables["params"], variables.get("batch_stats")
    p = jax.tree.map(np.asarray, params)
    out = {}
    for i in range(1, len(config.conv_widths) + 1):
        out[f"conv{i}.weight"] = np.ascontiguousarray(p[f"conv{i}"]["kernel"].transpose(3, 2, 0, 1))
        out[f"conv{i}.bias"] = p[f"conv{i}"]["bias"]
        out[f"bn{i}.weight"] = p[f"bn{i}"]["scale"]
        out[f"bn{i}.bias"] = p[f"bn{i}"]["bias"]
        if stats is not None:
            out[f"bn{i}.running_mean"] = np.asarray(stats[f"bn{i}"]["mean"])
            out[f"bn{i}.running_var"] = np.asarray(stats[f"bn{i}"]["var"])
            out[f"bn{i}.num_batches_tracked"] = np.array(num_batches_tracked, dtype=np.int64)
    out["fc1.weight"] = _fc1_to_torch(p["fc1"]["kernel"], *model.flat_geometry(config))
    out["fc1.bias"] = p["fc1"]["bias"]
    out["fc2.weight"] = np.ascontiguousarray(p["fc2"]["kernel"].T)
    out["fc2.bias"] = p["fc2"]["bias"]
    return out


def torch_shapes(config) -> dict:
    """{torch key: shape} of model_torch.CNN for this config (num_batches_tracked left out)."""
    shapes, cin = {}, config.channels
    for i, cout in enumerate(config.conv_widths, start=1):
        shapes[f"conv{i}.weight"] = (cout, cin, 3, 3)
        shapes[f"conv{i}.bias"] = (cout,)
        for k in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"bn{i}.{k}"] = (cout,)
        cin = cout
    shapes["fc1.weight"] = (config.hidden, model.flat_features(config))
    shapes["fc1.bias"] = (config.hidden,)
    shapes["fc2.weight"] = (config.num_classes, config.hidden)
    shapes["fc2.bias"] = (config.num_classes,)
    return shapes


def state_from_torch(config, torch_cnn):
    """step_torch.TorchCNN -> TrainState with its weights and BatchNorm statistics.

    Adam starts fresh (moments at zero, step 0). Values keep the torch dtype (float64
    modules need jax x64 enabled).
    """
    v = torch_to_flax(config, torch_cnn.model.state_dict())
    shapes = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    params = jax.tree.map(jnp.asarray, v["params"])
    return shapes.replace(step=0, params=params, batch_stats=jax.tree.map(jnp.asarray, v["batch_stats"]),
                          opt_state=shapes.tx.init(params))


def twin_parts(config, torch_state=None) -> list:
    """[the CNN] as a flaxport.workloads.twins.Part: the torch twin (`torch_state`'s, or a fresh
    one) beside the Flax module, for the generic port tools (convert, parity)."""
    from flaxport.workloads.cnn import model_torch
    from flaxport.workloads.twins import Part, replace_whole, whole

    net = torch_state.model if torch_state is not None else model_torch.CNN(config)
    x = np.zeros((2, config.channels, config.image_size, config.image_size), np.float32)
    return [Part("model", "", net, model.cnn(config), (x,), {"fc1": model.flat_geometry(config)}, whole,
                 replace_whole, lambda s: int(s.step))]
