"""Pure GAN train and eval steps in Flax, following the PyTorch reference step by step.

One train step = the reference's g_step then d_step:
  G: loss MSE(D(G(z)), 1); one Adam step on G. D runs in train mode here, so its
     BatchNorm statistics move too (torch does the same); D's weights do not.
  D: one Adam step on MSE(D(real), 1), then one on MSE(D(fake.detach()), 0), each
     forward updating D's statistics.
The seed's JAX port wrote G's state into d_state and drew z of 32 rows for batches of
10; neither happens here (tests/test_gan_parity.py checks against torch).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import struct

from flaxport.harness.train_state import TrainState
from flaxport.workloads.gan import model


@struct.dataclass
class GANState:
    g: TrainState
    d: TrainState


def mse(pred, target):
    """torch.nn.MSELoss: mean squared error (optax.l2_loss is half of it)."""
    return jnp.mean(jnp.square(pred - target))


def adam(config, lr: float):
    # torch.optim.Adam: eps outside the sqrt, no weight decay. `optax.flatten` runs the
    # update on one concatenated vector: same numbers, far fewer ops per step.
    return optax.flatten(optax.adam(lr, b1=config.b1, b2=config.b2, eps=config.adam_eps))


def init_state(config, key) -> GANState:
    """Fresh G and D with torch's default init; BatchNorm stats at 0 / 1."""
    g_key, d_key = jax.random.split(key)
    G, D = model.generator(config), model.discriminator(config)
    g_vars = G.init(g_key, jnp.zeros((2, config.z_dim)), train=False)
    d_vars = D.init(d_key, jnp.zeros((2, 1)), train=False)
    return GANState(
        g=TrainState.create(apply_fn=G.apply, params=g_vars["params"], tx=adam(config, config.g_lr),
                            batch_stats=g_vars.get("batch_stats", {})),
        d=TrainState.create(apply_fn=D.apply, params=d_vars["params"], tx=adam(config, config.d_lr),
                            batch_stats=d_vars.get("batch_stats", {})),
    )


def g_step(state: GANState, z):
    """z (B, z_dim) -> (state, g_loss, fake (B, 1), g_grads)."""
    g, d = state.g, state.d

    def loss_fn(g_params):
        fake, g_stats = g.apply_train(g_params, z)
        validity, d_stats = d.apply_train(d.params, fake)
        return mse(validity, 1.0), (fake, g_stats, d_stats)

    (loss, (fake, g_stats, d_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(g.params)
    g = g.apply_gradients(grads=grads).replace(batch_stats=g_stats)
    d = d.replace(batch_stats=d_stats)
    return GANState(g=g, d=d), loss, fake, grads


def d_step(state: GANState, x, target: float):
    """One D update on x (B, 1) towards `target` -> (state, loss, d_grads)."""
    d = state.d

    def loss_fn(d_params):
        validity, d_stats = d.apply_train(d_params, x)
        return mse(validity, target), d_stats

    (loss, d_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(d.params)
    d = d.apply_gradients(grads=grads).replace(batch_stats=d_stats)
    return state.replace(d=d), loss, grads


def make_train_step(config):
    """train_step(state, batch {'x': (B, 1)}, key) -> (state, {'g_loss', 'd_loss'})."""

    def train_step(state: GANState, batch, key):
        real = batch["x"]
        z = jax.random.normal(key, (real.shape[0], config.z_dim))  # one z per data sample
        state, g_loss, fake, _ = g_step(state, z)
        state, d_loss_real, _ = d_step(state, real, 1.0)
        state, d_loss_fake, _ = d_step(state, jax.lax.stop_gradient(fake), 0.0)
        return state, {"g_loss": g_loss, "d_loss": (d_loss_real + d_loss_fake) / 2}

    return train_step


def generate(state: GANState, z):
    """Eval-mode samples (running statistics): z (n, z_dim) -> (n,)."""
    return state.g.apply_eval(z)[:, 0]


_generate = jax.jit(generate)


def sample(config, state: GANState, key, n: int):
    """n samples from G in eval mode, as a NumPy array (n,)."""
    z = jax.random.normal(key, (n, config.z_dim))
    return jax.device_get(_generate(state, z))
