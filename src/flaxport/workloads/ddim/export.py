"""The DDIM sampler as a `jax.export` artifact: weights inside, nothing of flaxport needed.

    exported = jax.export.deserialize(open(path, "rb").read())
    images = exported.call(noise)  # float32 (n, H, W, 3) ~ N(0, 1) -> float32 in [0, 1]

The EMA network's weights and BN statistics are closed over, so they are constants of the
StableHLO module; the step count, n, the schedule and the normalisation are fixed at export
time. JAX guarantees such artifacts load in later JAX versions (its export compatibility
window), so a trained model outlives this package's code.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from flaxport.workloads.ddim import step


def ema_variables(config, framework: str, state) -> dict:
    """{'params', 'batch_stats'} of the EMA network of a restored run, Flax layout: a jax
    DDIMState's own, or a torch TorchDDIM's ema_model through the twins' key map."""
    if framework == "torch":
        from flaxport.workloads.twins import parts

        key_map = parts("ddim", config, state)[0].key_map()
        return jax.tree.map(jnp.asarray, key_map.to_flax(state.ema_model.state_dict()))
    return state.ema_variables()


def export_sampler(config, variables, n: int, diffusion_steps: int) -> jax.export.Exported:
    """step.generate for noise float32 (n, H, W, C), with `variables` baked in as constants.

    The convs are XLA's own: an artifact that called flaxport's FFI kernels could not run
    where flaxport is not installed."""
    if config.conv_impl == "native":
        config = dataclasses.replace(config, conv_impl="xla")
    variables = jax.tree.map(jnp.asarray, variables)
    side = config.image_size

    def sample(noise):
        return step.generate(config, variables, noise, diffusion_steps)

    spec = jax.ShapeDtypeStruct((n, side, side, config.channels), jnp.float32)
    return jax.export.export(jax.jit(sample))(spec)
