"""torch <-> Flax key map for the VAE (model_torch.VAE <-> model.VAE).

Written out by hand, as the oracle the generic key map is tested against
(tests/test_port_parity.py): flaxport converts through `twin_parts` below, the twins
side by side for flaxport.port's map.

  torch                         Flax
  encoder.fc1.weight (500, 784)   params/encoder/fc1/kernel (784, 500)   transposed
  encoder.fc2_mean.*              params/encoder/fc2_mean/*
  encoder.fc2_logvar.*            params/encoder/fc2_logvar/*
  decoder.fc1.*, decoder.fc2.*    params/decoder/fc1/*, params/decoder/fc2/*
  *.bias (out,)                   */bias (out,)

Only Linear layers, so a weight is transposed and nothing else. The Keras twin
(model_keras.py) names its Dense layers enc_fc1, enc_fc2_mean, enc_fc2_logvar, dec_fc1,
dec_fc2; a Keras kernel is (in, out) like Flax's, so it carries over as is.
Imports NumPy/JAX only: Keras variables are read and assigned duck-typed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

LAYERS = (("encoder", "fc1"), ("encoder", "fc2_mean"), ("encoder", "fc2_logvar"), ("decoder", "fc1"),
          ("decoder", "fc2"))


KERAS_LAYERS = {"enc_fc1": ("encoder", "fc1"), "enc_fc2_mean": ("encoder", "fc2_mean"),
                "enc_fc2_logvar": ("encoder", "fc2_logvar"), "dec_fc1": ("decoder", "fc1"),
                "dec_fc2": ("decoder", "fc2")}


def _np(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.array(v, copy=True)


def torch_shapes(config) -> dict:
    p, h, l = config.image_size ** 2, config.hidden, config.latents
    dims = {("encoder", "fc1"): (p, h), ("encoder", "fc2_mean"): (h, l), ("encoder", "fc2_logvar"): (h, l),
            ("decoder", "fc1"): (l, h), ("decoder", "fc2"): (h, p)}
    out = {}
    for (part, layer), (fan_in, fan_out) in dims.items():
        out[f"{part}.{layer}.weight"] = (fan_out, fan_in)
        out[f"{part}.{layer}.bias"] = (fan_out,)
    return out


def torch_to_flax(config, state_dict) -> dict:
    """torch state_dict -> {"params": ...} (NumPy); strict on keys and shapes (ValueError naming the key)."""
    sd = {k: _np(v) for k, v in state_dict.items()}
    want = torch_shapes(config)
    if missing := sorted(want.keys() - sd.keys()):
        raise ValueError(f"missing key {missing[0]!r}")
    if extra := sorted(sd.keys() - want.keys()):
        raise ValueError(f"unexpected key {extra[0]!r}")
    for k, shape in want.items():
        if sd[k].shape != shape:
            raise ValueError(f"shape mismatch for {k!r}: {sd[k].shape}, expected {shape}")
    params: dict = {"encoder": {}, "decoder": {}}
    for part, layer in LAYERS:
        params[part][layer] = {"kernel": np.ascontiguousarray(sd[f"{part}.{layer}.weight"].T),
                               "bias": sd[f"{part}.{layer}.bias"]}
    return {"params": params}


def flax_to_torch(variables) -> dict:
    """{"params": ...} (or a gradient tree under "params") -> {torch key: NumPy array}."""
    p = jax.tree.map(np.asarray, variables["params"])
    out = {}
    for part, layer in LAYERS:
        out[f"{part}.{layer}.weight"] = np.ascontiguousarray(p[part][layer]["kernel"].T)
        out[f"{part}.{layer}.bias"] = p[part][layer]["bias"]
    return out


def state_from_torch(config, torch_vae):
    """step_torch.TorchVAE -> TrainState with its weights; Adam starts fresh."""
    from flaxport.workloads.vae import step

    shapes = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    params = jax.tree.map(jnp.asarray, torch_to_flax(config, torch_vae.model.state_dict())["params"])
    return shapes.replace(step=0, params=params, opt_state=shapes.tx.init(params))


def _keras_slot(variable):
    layer, name = variable.path.split("/")[-2:]
    if layer not in KERAS_LAYERS or name not in ("kernel", "bias"):
        raise ValueError(f"unexpected Keras variable {variable.path!r}")
    return KERAS_LAYERS[layer], name


def keras_to_flax(net) -> dict:
    """A built model_keras.VAE -> {"params": ...} (NumPy copies)."""
    params: dict = {"encoder": {}, "decoder": {}}
    for v in net.trainable_variables:
        (part, layer), name = _keras_slot(v)
        params[part].setdefault(layer, {})[name] = np.array(v.numpy(), copy=True)
    return {"params": params}


def flax_to_keras(variables, net) -> None:
    """Assign Flax params into a built model_keras.VAE in place; every variable, shapes checked."""
    p = jax.tree.map(np.asarray, variables["params"])
    for v in net.trainable_variables:
        (part, layer), name = _keras_slot(v)
        value = p[part][layer][name]
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"shape mismatch for {v.path!r}: {value.shape}, expected {tuple(v.shape)}")
        v.assign(value)


def twin_parts(config, torch_state=None) -> list:
    """[the VAE] as a flaxport.workloads.twins.Part: the torch twin (`torch_state`'s, or a fresh
    one) beside the Flax module, for the generic port tools (convert, parity)."""
    from flaxport.workloads.twins import Part, replace_whole, whole
    from flaxport.workloads.vae import model, model_torch

    net = torch_state.model if torch_state is not None else model_torch.VAE(config)
    x = np.zeros((2, config.image_size ** 2), np.float32)
    eps = np.zeros((2, config.latents), np.float32)
    return [Part("model", "", net, model.vae(config), (x, eps), None, whole, replace_whole, lambda s: 0)]
