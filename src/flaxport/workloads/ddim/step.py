"""Pure DDIM train step and sampler in Flax, following keras-io's DiffusionModel.

train_step: images (uint8 NHWC) -> [0, 1] -> normalised with the training set's fixed
per-channel mean/std (keras's adapted Normalization layer); times t ~ U(0, 1) and noise
~ N(0, 1) per example; noisy = signal_rate(t) * images + noise_rate(t) * noise; the UNet
(train mode, BatchNorm on batch statistics) predicts the noise from (noisy, noise_rate^2).
Gradients come from the noise MAE alone (`loss`); the image MAE is reported only, as in
keras. AdamW, then an EMA of the weights *and* the BN statistics (keras averages all
`network.weights`), its decay 0.999 warmed up for short runs (schedule.ema_decay). The
seed's JAX port trained on noise + image loss and averaged params only; see config.py.

generate: deterministic DDIM (eta = 0) from given noise, with the EMA weights and the EMA
BN statistics in eval mode, denormalised and clipped to [0, 1].
"""
from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from flaxport.harness.train_state import TrainState
from flaxport.workloads.ddim import model
from flaxport.workloads.ddim.schedule import check_schedule, diffusion_schedule, ema_decay, sampling_times

NORM_EPS = 1e-7  # keras Normalization divides by max(sqrt(variance), epsilon())
# XLA compile options for code that runs once (init): compile time over run time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


class DDIMState(TrainState):
    """TrainState plus the EMA of the BatchNorm statistics (ema_params is the EMA of params)."""

    ema_batch_stats: Any = None

    def ema_variables(self) -> dict:
        """{'params', 'batch_stats'} of the EMA network: what sampling uses."""
        return {"params": self.ema_params, "batch_stats": self.ema_batch_stats}


def to_float(images_u8):
    """uint8 -> float32 in [0, 1], as x * float32(1/255) (what torch's x / 255 computes on CPU)."""
    return images_u8.astype(jnp.float32) * jnp.float32(1.0 / 255.0)


def data_stats(images_u8) -> dict:
    """{'norm_mean', 'norm_std'}: per-channel mean and (biased) std of images (N, H, W, C)
    in [0, 1], as keras's Normalization.adapt; for dataclasses.replace(config, **stats)."""
    x = np.asarray(images_u8, np.float64).reshape(-1, np.shape(images_u8)[-1]) / 255.0
    return {"norm_mean": tuple(float(v) for v in x.mean(0)), "norm_std": tuple(float(v) for v in x.std(0))}


def _norm(config, dtype):
    if len(config.norm_mean) != config.channels or len(config.norm_std) != config.channels:
        raise ValueError("the ddim config needs norm_mean and norm_std (per channel) from the training data: "
                         "dataclasses.replace(config, **step.data_stats(train_images))")
    mean = jnp.asarray(config.norm_mean, dtype)
    std = jnp.maximum(jnp.asarray(config.norm_std, dtype), NORM_EPS)
    return mean, std


def normalize(config, images):
    """Images (..., C) in [0, 1] -> zero mean, unit variance per channel (training set's stats)."""
    mean, std = _norm(config, images.dtype)
    return (images - mean) / std


def denormalize(config, images):
    """The inverse of normalize, clipped to [0, 1]."""
    mean, std = _norm(config, images.dtype)
    return jnp.clip(mean + images * std, 0.0, 1.0)


def optimizer(config):
    """keras AdamW: decoupled decay p -= lr * wd * p beside the Adam step (optax applies it
    to every leaf, biases included, as keras and torch do); optional warmup + cosine."""
    check_schedule(config)
    if config.lr_schedule == "constant":
        lr = config.lr
    else:
        lr = optax.warmup_cosine_decay_schedule(0.0, config.lr, config.warmup_steps, config.schedule_steps, 0.0)
    return optax.adamw(lr, b1=config.b1, b2=config.b2, eps=config.adam_eps, weight_decay=config.weight_decay)


def init_state(config, key) -> DDIMState:
    """Fresh UNet with keras's init; BN statistics 0 / 1; EMA = a copy of both."""
    net = model.unet(config)
    tx = optimizer(config)

    def create(key):
        variables = net.init(key, *model.dummy_inputs(config), train=False)
        params, stats = variables["params"], variables["batch_stats"]
        return DDIMState.create(apply_fn=net.apply, params=params, tx=tx, batch_stats=stats,
                                ema_params=params, ema_batch_stats=stats)

    # One compiled function, built without XLA's backend optimisations: it runs once, and
    # at the default level XLA:CPU spent 15-25 s compiling the ~60 threefry draws (4-8 s
    # without, shared 2-core CPU). Integer ops and exact float ops: the same values.
    if isinstance(key, jax.core.Tracer):  # under eval_shape / jit: the caller compiles
        return create(key)
    return jax.jit(create, compiler_options=FAST_COMPILE)(key)


def noisy_batch(config, images, noises, diffusion_times):
    """(noisy images, noise_rates, signal_rates): images, noises (B, H, W, C); times (B, 1, 1, 1)."""
    noise_rates, signal_rates = diffusion_schedule(diffusion_times, config.min_signal_rate, config.max_signal_rate)
    return signal_rates * images + noise_rates * noises, noise_rates, signal_rates


def loss_and_stats(config, state: DDIMState, params, images, noises, diffusion_times):
    """(noise MAE, (image MAE, new batch_stats)) for normalised images (B, H, W, C), the
    same-shaped noise and times (B, 1, 1, 1); differentiate with respect to `params`."""
    noisy, noise_rates, signal_rates = noisy_batch(config, images, noises, diffusion_times)
    pred_noises, stats = state.apply_train(params, noisy, noise_variances=noise_rates ** 2)
    pred_images = (noisy - noise_rates * pred_noises) / signal_rates
    noise_loss = jnp.mean(jnp.abs(pred_noises - noises))
    image_loss = jnp.mean(jnp.abs(pred_images - images))
    return noise_loss, (image_loss, stats)


def ema_update(decay, ema_tree, tree):
    """decay * ema + (1 - decay) * new, leaf by leaf (keras's ema_weight.assign)."""
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema_tree, tree)


def train_step_on(config, state: DDIMState, images, noises, diffusion_times, return_grads: bool = False):
    """One step from given draws: (state, {'loss' (noise MAE, trained), 'image_loss'})
    [+ the gradients, for parity tests]. AdamW, then the EMA of the new weights and stats."""
    (loss, (image_loss, stats)), grads = jax.value_and_grad(
        lambda p: loss_and_stats(config, state, p, images, noises, diffusion_times), has_aux=True)(state.params)
    decay = ema_decay(config, state.step)  # this update's index, counted from 0
    state = state.apply_gradients(grads=grads).replace(batch_stats=stats)
    state = state.replace(ema_params=ema_update(decay, state.ema_params, state.params),
                          ema_batch_stats=ema_update(decay, state.ema_batch_stats, stats))
    metrics = {"loss": loss, "image_loss": image_loss}
    return (state, metrics, grads) if return_grads else (state, metrics)


def draws(key, shape_nhwc, dtype=jnp.float32):
    """(noise (B, H, W, C) ~ N(0, 1), diffusion times (B, 1, 1, 1) ~ U(0, 1)) from one key."""
    k_noise, k_times = jax.random.split(key)
    noises = jax.random.normal(k_noise, shape_nhwc, dtype)
    times = jax.random.uniform(k_times, (shape_nhwc[0], 1, 1, 1), dtype)
    return noises, times


def make_train_step(config):
    """train_step(state, batch {'image': (B, H, W, C) uint8}, key) -> (state, {'loss', 'image_loss'})."""
    _norm(config, jnp.float32)  # fail now, not inside a trace, when the data stats are missing

    def train_step(state: DDIMState, batch, key):
        images = normalize(config, to_float(batch["image"]))
        noises, times = draws(key, images.shape, images.dtype)
        return train_step_on(config, state, images, noises, times)

    return train_step


def denoise(apply_fn, variables, noisy_images, noise_rates, signal_rates):
    """Eval-mode split of noisy images (N, H, W, C) into (pred_noises, pred_images)."""
    noise_variances = jnp.broadcast_to(noise_rates ** 2, (noisy_images.shape[0], 1, 1, 1))
    pred_noises = apply_fn(variables, noisy_images, noise_variances, train=False)
    pred_images = (noisy_images - noise_rates * pred_noises) / signal_rates
    return pred_noises, pred_images


@partial(jax.jit, static_argnums=(0, 3, 4))
def reverse_diffusion(config, variables, initial_noise, diffusion_steps: int, keep_path: bool = False):
    """keras's DDIM sampler: initial noise (N, H, W, C) -> normalised images (N, H, W, C),
    or with keep_path (steps + 1, N, H, W, C): the noisy images each step starts from (the
    initial noise first), then the final images.

    At each of the static `diffusion_steps` steps the network separates the current noisy
    images at t into noise and image, which are remixed at the next t. The first step
    treats pure noise as having signal rate min_signal_rate (keras's "important line").
    """
    apply_fn = model.unet(config).apply
    dtype = initial_noise.dtype
    times, next_times = (jnp.asarray(t, dtype) for t in sampling_times(diffusion_steps))
    schedule = partial(diffusion_schedule, min_signal_rate=config.min_signal_rate,
                       max_signal_rate=config.max_signal_rate)

    def body(carry, k):
        noisy, _ = carry
        noise_rates, signal_rates = schedule(times[k])
        pred_noises, pred_images = denoise(apply_fn, variables, noisy, noise_rates, signal_rates)
        next_noise_rates, next_signal_rates = schedule(next_times[k])
        remixed = next_signal_rates * pred_images + next_noise_rates * pred_noises
        return (remixed, pred_images), (noisy if keep_path else None)

    (_, pred_images), path = lax.scan(body, (initial_noise, jnp.zeros_like(initial_noise)),
                                      jnp.arange(diffusion_steps))
    return jnp.concatenate([path, pred_images[None]]) if keep_path else pred_images


def generate(config, variables, initial_noise, diffusion_steps: int, keep_path: bool = False):
    """Samples in [0, 1], (N, H, W, C), from initial noise (N, H, W, C) ~ N(0, 1); with
    keep_path the reverse process (steps + 1, N, H, W, C) in [0, 1], its last entry the samples.

    variables: the EMA network's {'params', 'batch_stats'} (DDIMState.ema_variables())."""
    return denormalize(config, reverse_diffusion(config, variables, initial_noise, diffusion_steps, keep_path))


@partial(jax.jit, static_argnums=0)
def val_losses(config, variables, images_u8, noises, diffusion_times):
    """Per-example (noise MAE, image MAE), (N,) each, of the network in eval mode (keras's
    test_step with the EMA network) on uint8 images (N, H, W, C), given noise and times."""
    images = normalize(config, to_float(images_u8))
    noisy, noise_rates, signal_rates = noisy_batch(config, images, noises, diffusion_times)
    pred_noises, pred_images = denoise(model.unet(config).apply, variables, noisy, noise_rates, signal_rates)
    return jnp.abs(pred_noises - noises).mean((1, 2, 3)), jnp.abs(pred_images - images).mean((1, 2, 3))


_SAMPLERS: dict = {}


def compiled_sampler(config, variables, diffusion_steps: int, n: int, keep_path: bool = False):
    """generate, compiled ahead of time for n images: f(variables, noise (n, H, W, C)) -> images
    (with keep_path: the reverse process, see generate).

    Kept per (config, steps, n) for the process, so an evaluation can time sampling apart
    from its compile, and later epochs reuse the executable. When the variables sit
    replicated on a mesh of several devices (a `--devices N` run), the noise is split along
    the batch over that mesh, so every device samples its share."""
    key = (config, diffusion_steps, n, keep_path)
    if key not in _SAMPLERS:
        side = config.image_size
        mesh = getattr(getattr(jax.tree.leaves(variables)[0], "sharding", None), "mesh", None)
        sharding = None
        if mesh is not None and mesh.size > 1 and n % mesh.size == 0:
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(mesh.axis_names))
        spec = jax.ShapeDtypeStruct((n, side, side, config.channels), jnp.float32, sharding=sharding)
        compiled = jax.jit(generate, static_argnums=(0, 3, 4)).lower(config, variables, spec, diffusion_steps,
                                                                     keep_path).compile()
        place = (lambda x: x) if sharding is None else (lambda x: jax.device_put(x, sharding))  # noqa: E731
        _SAMPLERS[key] = lambda v, noise: compiled(v, place(noise))
    return _SAMPLERS[key]
