"""The seed article's VAE in Keras 3, the third twin. Backend: $KERAS_BACKEND, else jax.

Same layers as model.py and model_torch.py. Keras's Dense kernel is (in, out) like
Flax's, so weights carry over untransposed (convert.py). Init is torch's law,
U(+-1/sqrt(fan_in)) for kernel and bias, so all three twins start alike; Keras's own
default is glorot_uniform and zero bias.

What the seed's Keras port got wrong, and this twin does not: it took `log(logits)`
as the log-probability (the log of an unbounded logit, NaN for negative ones) where
`log_sigmoid(logits)` was meant, and it trained with Adam(1e-4) while the others used 1e-3.
"""
from __future__ import annotations

import math
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported; keras.json may say tensorflow

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402


def _torch_uniform(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)
    return keras.initializers.RandomUniform(-bound, bound)


def _dense(units, fan_in, name, activation=None):
    return layers.Dense(units, activation=activation, kernel_initializer=_torch_uniform(fan_in),
                        bias_initializer=_torch_uniform(fan_in), name=name)


class VAE(keras.Model):
    """call((x (B, P), eps (B, L))) -> (logits (B, P), mean (B, L), logvar (B, L))."""

    def __init__(self, hidden: int = 500, latents: int = 20, pixels: int = 784, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.latents, self.pixels = hidden, latents, pixels
        self.enc_fc1 = _dense(hidden, pixels, "enc_fc1", "relu")
        self.enc_fc2_mean = _dense(latents, hidden, "enc_fc2_mean")
        self.enc_fc2_logvar = _dense(latents, hidden, "enc_fc2_logvar")
        self.dec_fc1 = _dense(hidden, latents, "dec_fc1", "relu")
        self.dec_fc2 = _dense(pixels, hidden, "dec_fc2")

    def encode(self, x):
        h = self.enc_fc1(x)
        return self.enc_fc2_mean(h), self.enc_fc2_logvar(h)

    def decode(self, z):
        return self.dec_fc2(self.dec_fc1(z))

    def call(self, inputs):
        x, eps = inputs
        mean, logvar = self.encode(x)
        return self.decode(mean + eps * ops.exp(0.5 * logvar)), mean, logvar


def vae(config) -> VAE:
    """A built VAE (variables exist) for the config."""
    net = VAE(config.hidden, config.latents, config.image_size ** 2)
    pixels = config.image_size ** 2
    net((ops.zeros((1, pixels)), ops.zeros((1, config.latents))))
    return net


def loss_terms(logits, x, mean, logvar):
    """(mean negative ELBO, bce mean, kl mean) with keras.ops: the same formula as step.py."""
    bce = ops.sum(ops.relu(logits) - logits * x + ops.log1p(ops.exp(-ops.abs(logits))), axis=-1)
    kl = -0.5 * ops.sum(1 + logvar - ops.square(mean) - ops.exp(logvar), axis=-1)
    return ops.mean(bce + kl), ops.mean(bce), ops.mean(kl)


def loss_and_grads(net: VAE, x, eps):
    """(loss, {layer.kernel|bias: gradient as NumPy}) on whichever backend Keras runs.

    Keras has no backend-neutral gradient call: JAX differentiates a stateless call,
    torch runs autograd on the variables' tensors, TensorFlow records a tape.
    """
    import numpy as np

    backend = keras.backend.backend()
    variables = net.trainable_variables
    if backend == "jax":
        import jax

        def f(values):
            (logits, mean, logvar), _ = net.stateless_call(values, [v.value for v in net.non_trainable_variables],
                                                          (x, eps))
            return loss_terms(logits, x, mean, logvar)[0]

        loss, grads = jax.value_and_grad(f)([v.value for v in variables])
    elif backend == "torch":
        import torch

        x_t, eps_t = torch.as_tensor(x), torch.as_tensor(eps)
        logits, mean, logvar = net((x_t, eps_t))
        loss = loss_terms(logits, x_t, mean, logvar)[0]
        grads = torch.autograd.grad(loss, [v.value for v in variables])
        loss, grads = loss.detach(), [g.detach() for g in grads]
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits, mean, logvar = net((x, eps))
            loss = loss_terms(logits, x, mean, logvar)[0]
        grads = tape.gradient(loss, [v.value for v in variables])
    else:
        raise ValueError(f"keras backend {backend!r} is not supported")
    names = [f"{v.path.split('/')[-2]}.{v.path.split('/')[-1]}" for v in variables]
    return float(keras.ops.convert_to_numpy(loss)), {n: np.asarray(keras.ops.convert_to_numpy(g))
                                                     for n, g in zip(names, grads)}
