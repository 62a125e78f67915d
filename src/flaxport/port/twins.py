"""The torch/Flax module pairs of the registered workloads, for `flaxport.port`'s generic tools.

A workload's train state holds one or more models (the GAN: G and D; cnn, vae, ddim: one).
Each is a `Part`: its torch twin module, its Flax module, an example input in torch
layout (what the key map traces: only shapes matter), the flatten geometry of a Linear
after a conv stack, and where its TrainState sits inside the workload's state.

Flat torch keys: a one-model workload uses the module's own state_dict keys
(`conv1.weight`); a several-model one prefixes them with the part's name (`G.net.0.weight`),
so one .pt or .safetensors file holds the whole workload.

EMA (ddim): the Flax state holds a second copy of the network, the exponential moving
average of the weights and BatchNorm statistics that samples (`ema_params`,
`ema_batch_stats`); the torch twin holds it as a second module, `TorchDDIM.ema_model`.
It is the same architecture, so the part's one key map converts it too; its flat keys
are the model's behind `ema_model.` (EMA_NAMES). A torch file without them (a bare
state_dict) gives an EMA that starts at the weights themselves, as a fresh run's does.

Imports torch (through the twins) only when `parts` is called.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from flaxport.errors import UserError


@dataclasses.dataclass
class Part:
    """One model of a workload: torch twin <-> Flax module, and its place in the Flax state."""

    name: str  # "model", or "G" / "D"
    prefix: str  # flat-key prefix: "" for a one-model workload, else "G." / "D."
    torch_module: Any  # torch.nn.Module
    flax_module: Any  # flax.linen.Module
    example: tuple  # NumPy inputs in torch layout, e.g. ((2, 3, 32, 32) float32,)
    flatten_shapes: dict | None  # {torch Linear name: (C, *S)} for port_weights
    get: Callable  # workload state -> this part's TrainState
    put: Callable  # (workload state, TrainState) -> workload state
    forwards: Callable  # workload state -> train-mode forwards run so far (num_batches_tracked)
    ema: tuple = ()  # (params field, batch_stats field) of the EMA copy in the TrainState; () if none

    def key_map(self, flax_module=None):
        """flaxport.port.KeyMap of this pair (`flax_module` replaces the Flax side, e.g. a wrong port)."""
        from flaxport.port.weights import build_key_map

        return build_key_map(self.torch_module, flax_module or self.flax_module, self.example,
                             flatten_shapes=self.flatten_shapes)


def _whole(state):
    return state


def _replace_whole(state, part_state):
    return part_state


def _gan(config, ts):
    from flaxport.workloads.gan import model, model_torch

    g, d = (ts.G, ts.D) if ts is not None else (model_torch.generator(config), model_torch.discriminator(config))
    z = np.zeros((2, config.z_dim), np.float32)
    x = np.zeros((2, 1), np.float32)
    # G runs one train-mode forward per step (g.step); D one in the G step and one per D update.
    return [Part("G", "G.", g, model.generator(config), (z,), None, lambda s: s.g, lambda s, p: s.replace(g=p),
                 lambda s: int(s.g.step)),
            Part("D", "D.", d, model.discriminator(config), (x,), None, lambda s: s.d, lambda s, p: s.replace(d=p),
                 lambda s: int(s.g.step) + int(s.d.step))]


def _cnn(config, ts):
    from flaxport.workloads.cnn import model, model_torch

    net = ts.model if ts is not None else model_torch.CNN(config)
    x = np.zeros((2, config.channels, config.image_size, config.image_size), np.float32)
    return [Part("model", "", net, model.cnn(config), (x,), {"fc1": model.flat_geometry(config)}, _whole,
                 _replace_whole, lambda s: int(s.step))]


def _vae(config, ts):
    from flaxport.workloads.vae import model, model_torch

    net = ts.model if ts is not None else model_torch.VAE(config)
    x = np.zeros((2, config.image_size ** 2), np.float32)
    eps = np.zeros((2, config.latents), np.float32)
    return [Part("model", "", net, model.vae(config), (x, eps), None, _whole, _replace_whole, lambda s: 0)]


def _ddim(config, ts):
    from flaxport.workloads.ddim import model, model_torch

    net = ts.model if ts is not None else model_torch.UNet(config)
    # Two inputs: noisy images (N, C, H, W) and noise variances (N, 1, 1, 1). Both are float
    # rank 4, so both go channels-last for Flax; moving axis 1 of an (N, 1, 1, 1) array to
    # the end leaves it as it is, which is the variance input the Flax UNet takes.
    x = np.zeros((2, config.channels, config.image_size, config.image_size), np.float32)
    variances = np.zeros((2, 1, 1, 1), np.float32)
    # One train-mode forward per step (the noise loss), so num_batches_tracked follows step.
    return [Part("model", "", net, model.unet(config), (x, variances), None, _whole, _replace_whole,
                 lambda s: int(s.step), ema=("ema_params", "ema_batch_stats"))]


_PARTS = {"gan": _gan, "cnn": _cnn, "vae": _vae, "ddim": _ddim}
# Part names without building anything: the keys of the torch twin's state_dict() that hold models.
PART_NAMES = {"gan": ("G", "D"), "cnn": ("model",), "vae": ("model",), "ddim": ("model",)}
# The torch twin's state_dict() key of the EMA copy of the (one) model, for workloads that keep one.
EMA_NAMES = {"ddim": "ema_model"}


def part_names(workload_name: str) -> tuple:
    """Names of the workload's models, e.g. ("G", "D"); more than one means prefixed flat keys."""
    _check(workload_name)
    return PART_NAMES[workload_name]


def ema_name(workload_name: str) -> str | None:
    """The torch twin's key of the model's EMA copy ("ema_model"), also the prefix of its flat
    keys; None for a workload without one."""
    _check(workload_name)
    return EMA_NAMES.get(workload_name)


def _check(workload_name: str) -> None:
    if workload_name not in _PARTS:
        raise UserError(f"flaxport.port knows no torch twin of {workload_name!r}; it ports {', '.join(_PARTS)}")


def parts(workload_name: str, config, torch_state=None) -> list:
    """[Part] of a workload. torch_state: the twin's state (step_torch.init_state) whose
    modules to use; default: fresh modules (weights don't matter for a key map)."""
    _check(workload_name)
    if torch_state is not None:
        return _PARTS[workload_name](config, torch_state)
    import torch

    with torch.random.fork_rng():  # building modules draws their init: leave torch's global generator alone
        return _PARTS[workload_name](config, None)
