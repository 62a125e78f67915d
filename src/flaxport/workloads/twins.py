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
are the model's behind `ema_model.` (the record's ema_name). A torch file without them (a bare
state_dict) gives an EMA that starts at the weights themselves, as a fresh run's does.

Each workload declares its parts in its registry record (`twin_parts`, from its convert.py;
`part_names`, `ema_name`). Imports torch (through the twins) only when `parts` is called.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

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


def whole(state):
    """Part.get of a one-model workload: its state is the model's TrainState."""
    return state


def replace_whole(state, part_state):
    """Part.put of a one-model workload."""
    return part_state


def part_names(workload_name: str) -> tuple:
    """Names of the workload's models, e.g. ("G", "D"); more than one means prefixed flat keys."""
    return _record(workload_name).part_names


def ema_name(workload_name: str) -> str | None:
    """The torch twin's key of the model's EMA copy ("ema_model"), also the prefix of its flat
    keys; None for a workload without one."""
    return _record(workload_name).ema_name


def _record(workload_name: str):
    from flaxport.workloads import registry

    wl = registry.get(workload_name)
    if wl.twin_parts is None:
        raise UserError(f"the workload {workload_name!r} declares no torch twin parts to port")
    return wl


def parts(workload_name: str, config, torch_state=None) -> list:
    """[Part] of a workload (its record's twin_parts). torch_state: the twin's state
    (step_torch.init_state) whose modules to use; default: fresh modules (weights don't matter
    for a key map)."""
    wl = _record(workload_name)
    if torch_state is not None:
        return wl.twin_parts(config, torch_state)
    import torch

    with torch.random.fork_rng():  # building modules draws their init: leave torch's global generator alone
        return wl.twin_parts(config, None)
