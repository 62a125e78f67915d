"""Pure CNN train and eval steps in Flax, following the seed's PyTorch `step`.

train_step: forward in train mode (BatchNorm on batch statistics, running averages
updated), NLL loss on the log-probabilities, one Adam step. The seed's JAX port
returned `batch_stats` beside the state; here they live in it, so one state goes in
and one comes out.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from flaxport.harness.train_state import TrainState
from flaxport.workloads.cnn import model


def to_float(images_u8):
    """uint8 NHWC -> float32 in [0, 1], the seed's `preprocessing` (x / 255).

    As x * float32(1/255), which is what XLA compiles `x / 255` into on CPU (a multiply by
    the reciprocal, up to 1 ulp from torch's true division); the torch twin multiplies
    the same way, so both twins see the same bits.
    """
    return images_u8.astype(jnp.float32) * jnp.float32(1.0 / 255.0)


def nll(logp, labels):
    """torch.nn.NLLLoss (mean): logp (B, K), labels (B,) int."""
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None].astype(jnp.int32), axis=1))


def adam(config):
    # torch.optim.Adam: eps outside the sqrt, no weight decay.
    return optax.adam(config.lr, b1=config.b1, b2=config.b2, eps=config.adam_eps)


def init_state(config, key) -> TrainState:
    """Fresh CNN with torch's default init; BatchNorm statistics at 0 / 1."""
    net = model.cnn(config)
    # Jitted: run eagerly, init compiles each of its ~60 small ops apart (~5 s on CPU).
    variables = jax.jit(partial(net.init, train=False))(key, model.dummy_input(config, 2))
    return TrainState.create(apply_fn=net.apply, params=variables["params"], tx=adam(config),
                             batch_stats=variables["batch_stats"])


def loss_and_stats(state: TrainState, params, images, labels):
    """(loss, new batch_stats) for float images (B, H, W, C) and labels (B,)."""
    logp, stats = state.apply_train(params, images)
    return nll(logp, labels), stats


def make_train_step(config):
    """train_step(state, batch {'image': (B,H,W,C) uint8, 'label': (B,)}, key) -> (state, {'loss'})."""

    def train_step(state: TrainState, batch, key):
        del key  # no randomness in this step (no dropout, no augmentation)
        images = to_float(batch["image"])
        (loss, stats), grads = jax.value_and_grad(partial(loss_and_stats, state), has_aux=True)(
            state.params, images, batch["label"])
        state = state.apply_gradients(grads=grads).replace(batch_stats=stats)
        return state, {"loss": loss}

    return train_step


@jax.jit
def _eval_chunk(state: TrainState, images_u8, labels, valid):
    """Summed NLL, correct count and predictions of one padded chunk (eval mode)."""
    logp = state.apply_eval(to_float(images_u8))
    picked = -jnp.take_along_axis(logp, labels[:, None], axis=1)[:, 0]
    pred = jnp.argmax(logp, axis=-1)
    return jnp.sum(jnp.where(valid, picked, 0.0)), jnp.sum(valid & (pred == labels)), pred


def predict(config, state: TrainState, images_u8, labels):
    """(mean NLL, accuracy, predictions (N,)) over a test set in fixed-size chunks."""
    n, chunk = len(labels), config.eval_batch
    loss_sum, correct, preds = 0.0, 0, []
    for start in range(0, n, chunk):
        x, y = images_u8[start:start + chunk], labels[start:start + chunk]
        pad = chunk - len(y)  # pad the last chunk so every call has one shape
        valid = np.arange(chunk) < len(y)
        if pad:
            x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
            y = np.concatenate([y, np.zeros((pad,), y.dtype)])
        s, c, p = _eval_chunk(state, x, y.astype(np.int32), valid)
        loss_sum += float(s)
        correct += int(c)
        preds.append(np.asarray(p)[: chunk - pad])
    return loss_sum / n, correct / n, np.concatenate(preds)
