"""The Keras 3 twin of step.py: training through Keras's own `fit`, plus eval.

A Keras user trains with `compile` + `fit`; on the JAX backend `fit` jits one train
step (jit_compile defaults to on there) and feeds it NumPy batches. That is what this
twin times: Keras at its ordinary best, not JAX with Keras layers. The loss is
model_keras.VAE.compute_loss, the same formula as step.py and step_torch.py.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from flaxport.workloads.vae import model_keras, quality

keras = model_keras.keras
ops = model_keras.ops


@dataclasses.dataclass
class KerasVAE:
    model: model_keras.VAE

    def variables(self) -> list:
        """Every variable a resumed run needs: weights, noise state, Adam's moments and step."""
        return [*self.model.variables, *self.model.optimizer.variables]

    def state_dict(self) -> dict:
        return {_key(i, v): np.array(ops.convert_to_numpy(v.value), copy=True)
                for i, v in enumerate(self.variables())}

    def load_state_dict(self, sd: dict) -> None:
        want = {_key(i, v): v for i, v in enumerate(self.variables())}
        if sorted(want) != sorted(sd):
            missing, extra = sorted(set(want) - set(sd)), sorted(set(sd) - set(want))
            raise ValueError(f"keras state does not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
        for k, v in want.items():
            if tuple(sd[k].shape) != tuple(v.shape):
                raise ValueError(f"shape mismatch for {k}: {sd[k].shape}, expected {tuple(v.shape)}")
            v.assign(sd[k])


def _key(i: int, v) -> str:
    # Keras paths repeat across the model and its optimizer (e.g. "adam/iteration" vs a
    # layer's), so the position keeps them apart and pins the order.
    return f"{i:03d}:{v.path}"


def init_state(config, seed: int) -> KerasVAE:
    net = model_keras.vae(config, seed=seed)
    net.compile(optimizer=model_keras.adam(config))
    net.optimizer.build(net.trainable_variables)  # its variables exist before a resume assigns them
    return KerasVAE(net)


def flatten(images_u8: np.ndarray) -> np.ndarray:
    return images_u8.reshape(len(images_u8), -1).astype(np.float32)


class _StepLog(keras.callbacks.Callback):
    """Collects every step's loss terms; safe to run on Keras's async callback thread,
    so `fit` never waits for it."""

    async_safe = True

    def __init__(self, steps: int, on_step=None):
        super().__init__()
        self.rows = [None] * steps
        self.on_step = on_step

    def on_train_batch_end(self, batch, logs=None):
        self.rows[batch] = (logs["step_loss"], logs["step_bce"], logs["step_kl"])
        if self.on_step is not None:
            self.on_step(1)


def train_epoch(config, ks: KerasVAE, arrays: dict, noise_seed: int, on_step=None) -> dict:
    """One `fit` epoch over arrays {'image': (N, H, W, 1) uint8}, N a multiple of the batch, in order.

    noise_seed seeds the model's SeedGenerator for this epoch, so a resumed run draws the
    same noise. Returns {'loss', 'bce', 'kl'}: (steps,) NumPy arrays.
    """
    images_u8 = arrays["image"]
    steps = len(images_u8) // config.batch_size
    ks.model.noise.state.assign(np.array([noise_seed % 2**31, 0], dtype=ks.model.noise.state.dtype))
    log = _StepLog(steps, on_step)
    ks.model.fit(flatten(images_u8), batch_size=config.batch_size, epochs=1, shuffle=False, verbose=0,
                 callbacks=[log])
    rows = np.array(log.rows, dtype=np.float64)
    return {"loss": rows[:, 0], "bce": rows[:, 1], "kl": rows[:, 2]}


def log_weights(net, x, eps_k, posterior=None):
    """Importance log-weights: x (E, P), eps_k (E, K, L) -> (E, K); posterior: (mean, logvar) if known."""
    mean, logvar = posterior if posterior is not None else net.encode(x)
    z = mean[:, None] + eps_k * ops.exp(0.5 * logvar)[:, None]
    logits = net.decode(z)
    xk = ops.broadcast_to(x[:, None], ops.shape(logits))
    log_px_z = -model_keras.per_example(logits, xk, mean, logvar)[0]
    log_pz = -0.5 * ops.sum(ops.square(z) + model_keras.LOG_2PI, axis=-1)
    log_qz = -0.5 * ops.sum(ops.square(eps_k) + logvar[:, None] + model_keras.LOG_2PI, axis=-1)
    return log_px_z + log_pz - log_qz


def evaluate(config, ks: KerasVAE, data, seed: int):
    """(quality, artifacts) as step.py's and step_torch.py's, computed with keras.ops."""
    rng = np.random.default_rng(seed)
    net = ks.model
    images = data.test["image"]
    nelbo, logw = [], []
    for start in range(0, len(images), config.eval_batch):
        x = ops.convert_to_tensor(flatten(images[start:start + config.eval_batch]))
        eps1 = ops.convert_to_tensor(rng.standard_normal((len(x), config.latents), dtype=np.float32))
        eps_k = ops.convert_to_tensor(rng.standard_normal((len(x), config.iwae_k, config.latents), dtype=np.float32))
        mean, logvar = net.encode(x)
        logits = net.decode(mean + eps1 * ops.exp(0.5 * logvar))
        bce, kl = model_keras.per_example(logits, x, mean, logvar)
        nelbo.append(ops.convert_to_numpy(bce + kl))
        logw.append(ops.convert_to_numpy(log_weights(net, x, eps_k, (mean, logvar))))
    side = config.image_size
    x = flatten(images[:16])
    mean, _ = net.encode(ops.convert_to_tensor(x))
    z = ops.convert_to_tensor(rng.standard_normal((config.n_samples, config.latents), dtype=np.float32))
    artifacts = {"inputs": x.reshape(-1, side, side),
                 "reconstructions": ops.convert_to_numpy(ops.sigmoid(net.decode(mean))).reshape(-1, side, side),
                 "samples": ops.convert_to_numpy(ops.sigmoid(net.decode(z))).reshape(-1, side, side)}
    return quality.summarize(config, np.concatenate(nelbo), np.concatenate(logw), artifacts)
