"""Pure VAE train and eval steps in Flax (google/flax examples/vae, the seed's loss).

loss = mean over the batch of [ Bernoulli NLL of x under the decoder's logits, summed
over pixels ] + [ KL(q(z|x) || N(0, I)), summed over latents ]: the one-sample negative
ELBO in nats. The BCE is the stable form torch's BCEWithLogitsLoss uses,
max(l, 0) - l*x + log1p(exp(-|l|)); the seed's JAX port took log(-expm1(log_sigmoid(l))),
which loses precision for confident pixels.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxport.harness.train_state import TrainState
from flaxport.workloads.vae import model

LOG_2PI = math.log(2 * math.pi)


def flatten(images_u8):
    """uint8 (B, H, W, 1) in {0, 1} -> float32 (B, H*W)."""
    return images_u8.reshape(images_u8.shape[0], -1).astype(jnp.float32)


def bce_with_logits(logits, x):
    """Per-example Bernoulli NLL summed over pixels: (B, P), (B, P) -> (B,)."""
    return jnp.sum(jnp.maximum(logits, 0) - logits * x + jnp.log1p(jnp.exp(-jnp.abs(logits))), axis=-1)


def kl_divergence(mean, logvar):
    """KL(N(mean, exp(logvar)) || N(0, I)) per example: (B, L) -> (B,)."""
    return -0.5 * jnp.sum(1 + logvar - jnp.square(mean) - jnp.exp(logvar), axis=-1)


def loss_fn(apply_fn, params, x, eps):
    """(mean negative ELBO, {'bce', 'kl'} batch means) for x (B, P) and noise eps (B, L)."""
    logits, mean, logvar = apply_fn({"params": params}, x, eps)
    bce, kl = bce_with_logits(logits, x), kl_divergence(mean, logvar)
    return jnp.mean(bce + kl), {"bce": jnp.mean(bce), "kl": jnp.mean(kl)}


def adam(config):
    return optax.adam(config.lr, b1=config.b1, b2=config.b2, eps=config.adam_eps)


def init_state(config, key) -> TrainState:
    net = model.vae(config)
    pixels = config.image_size ** 2
    params = jax.jit(net.init)(key, jnp.zeros((2, pixels)), jnp.zeros((2, config.latents)))["params"]
    return TrainState.create(apply_fn=net.apply, params=params, tx=adam(config))


def make_train_step(config):
    """train_step(state, batch {'image': (B, H, W, 1) uint8}, key) -> (state, {'loss', 'bce', 'kl'})."""

    def train_step(state: TrainState, batch, key):
        x = flatten(batch["image"])
        eps = jax.random.normal(key, (x.shape[0], config.latents))
        (loss, parts), grads = jax.value_and_grad(
            lambda p: loss_fn(state.apply_fn, p, x, eps), has_aux=True)(state.params)
        return state.apply_gradients(grads=grads), {"loss": loss, **parts}

    return train_step


def log_weights(apply_fn, params, x, eps_k, posterior=None):
    """Importance log-weights log p(x, z_k) - log q(z_k | x): x (E, P), eps_k (E, K, L) -> (E, K).

    posterior: q's (mean, logvar) when the caller has them already."""
    if posterior is None:
        posterior = apply_fn({"params": params}, x, method=model.VAE.encode)
    mean, logvar = posterior
    z = mean[:, None] + eps_k * jnp.exp(0.5 * logvar)[:, None]
    logits = apply_fn({"params": params}, z, method=model.VAE.decode)
    log_px_z = -bce_with_logits(logits, x[:, None])
    log_pz = -0.5 * jnp.sum(jnp.square(z) + LOG_2PI, axis=-1)
    log_qz = -0.5 * jnp.sum(jnp.square(eps_k) + logvar[:, None] + LOG_2PI, axis=-1)
    return log_px_z + log_pz - log_qz


@jax.jit
def _eval_chunk(state: TrainState, x, eps1, eps_k):
    mean, logvar = state.apply_fn({"params": state.params}, x, method=model.VAE.encode)
    logits = state.apply_fn({"params": state.params}, model.reparameterize(mean, logvar, eps1),
                            method=model.VAE.decode)
    nelbo = bce_with_logits(logits, x) + kl_divergence(mean, logvar)
    return nelbo, log_weights(state.apply_fn, state.params, x, eps_k, (mean, logvar))


def evaluate_bounds(config, state: TrainState, images_u8, key):
    """(per-example one-sample negative ELBO (N,), log-weights (N, k)) as NumPy, in fixed chunks."""
    x_all = np.asarray(images_u8).reshape(len(images_u8), -1).astype(np.float32)
    nelbo, logw = [], []
    for i, start in enumerate(range(0, len(x_all), config.eval_batch)):
        x = x_all[start:start + config.eval_batch]
        n = len(x)
        if n < config.eval_batch:  # one shape for every call
            x = np.concatenate([x, np.zeros((config.eval_batch - n, x.shape[1]), x.dtype)])
        k1, k2 = jax.random.split(jax.random.fold_in(key, i))
        eps1 = jax.random.normal(k1, (config.eval_batch, config.latents))
        eps_k = jax.random.normal(k2, (config.eval_batch, config.iwae_k, config.latents))
        a, b = _eval_chunk(state, x, eps1, eps_k)
        nelbo.append(np.asarray(a)[:n])
        logw.append(np.asarray(b)[:n])
    return np.concatenate(nelbo), np.concatenate(logw)


@jax.jit
def _pictures(state: TrainState, x, z):
    mean, _ = state.apply_fn({"params": state.params}, x, method=model.VAE.encode)
    recon = jax.nn.sigmoid(state.apply_fn({"params": state.params}, mean, method=model.VAE.decode))
    samples = jax.nn.sigmoid(state.apply_fn({"params": state.params}, z, method=model.VAE.decode))
    return recon, samples


def pictures(config, state: TrainState, images_u8, key, n_recon: int = 16):
    """{'inputs', 'reconstructions' (posterior mean), 'samples' (prior)}: (n, H, W) float in [0, 1]."""
    side = config.image_size
    x = np.asarray(images_u8[:n_recon])
    x = x.reshape(len(x), -1).astype(np.float32)  # fewer than n_recon when the test split is smaller
    z = jax.random.normal(key, (config.n_samples, config.latents))
    recon, samples = _pictures(state, x, z)
    return {"inputs": x.reshape(-1, side, side), "reconstructions": np.asarray(recon).reshape(-1, side, side),
            "samples": np.asarray(samples).reshape(-1, side, side)}
