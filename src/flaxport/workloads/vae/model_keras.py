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

LOG_2PI = math.log(2 * math.pi)


def _torch_uniform(fan_in: int, seed: int):
    bound = 1.0 / math.sqrt(fan_in)
    return keras.initializers.RandomUniform(-bound, bound, seed=seed)


def _dense(units, fan_in, name, seed, activation=None):
    # Seeded initializers: the init depends on `seed` alone, not on Keras's global RNG.
    return layers.Dense(units, activation=activation, kernel_initializer=_torch_uniform(fan_in, 2 * seed),
                        bias_initializer=_torch_uniform(fan_in, 2 * seed + 1), name=name)


class StepValue(keras.metrics.Metric):
    """The latest value, not a running mean: `fit` then reports every step's loss."""

    def __init__(self, name):
        super().__init__(name=name)
        self.latest = self.add_variable((), initializer="zeros", name="latest")

    def update_state(self, value):
        self.latest.assign(ops.cast(value, self.dtype))

    def result(self):
        return ops.convert_to_tensor(self.latest)

    def reset_state(self):
        self.latest.assign(0.0)


class VAE(keras.Model):
    """call((x (B, P), eps (B, L))) or call(x (B, P)) -> (logits (B, P), mean (B, L), logvar (B, L)).

    Given only x, the noise comes from the model's SeedGenerator, whose state is a
    variable: under `fit` on JAX it is threaded through the jitted step like the weights.
    """

    def __init__(self, hidden: int = 500, latents: int = 20, pixels: int = 784, seed: int = 0, **kwargs):
        # Fixed names: Keras numbers default ones per process (vae_1, ...), and the
        # checkpoint keys are variable paths.
        super().__init__(**{"name": "vae", **kwargs})
        self.hidden, self.latents, self.pixels = hidden, latents, pixels
        self.noise = keras.random.SeedGenerator(seed, name="noise")
        self.step_values = [StepValue("step_loss"), StepValue("step_bce"), StepValue("step_kl")]
        layer_seed = iter(range(5 * seed, 5 * seed + 5))
        self.enc_fc1 = _dense(hidden, pixels, "enc_fc1", next(layer_seed), "relu")
        self.enc_fc2_mean = _dense(latents, hidden, "enc_fc2_mean", next(layer_seed))
        self.enc_fc2_logvar = _dense(latents, hidden, "enc_fc2_logvar", next(layer_seed))
        self.dec_fc1 = _dense(hidden, latents, "dec_fc1", next(layer_seed), "relu")
        self.dec_fc2 = _dense(pixels, hidden, "dec_fc2", next(layer_seed))

    def encode(self, x):
        h = self.enc_fc1(x)
        return self.enc_fc2_mean(h), self.enc_fc2_logvar(h)

    def decode(self, z):
        return self.dec_fc2(self.dec_fc1(z))

    def call(self, inputs):
        if isinstance(inputs, (tuple, list)):
            x, eps = inputs
        else:
            x = inputs
            eps = keras.random.normal((ops.shape(x)[0], self.latents), seed=self.noise)
        mean, logvar = self.encode(x)
        return self.decode(mean + eps * ops.exp(0.5 * logvar)), mean, logvar

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """The negative ELBO of x (B, P) given call's outputs; `fit` differentiates this."""
        logits, mean, logvar = y_pred
        terms = loss_terms(logits, x, mean, logvar)
        for tracker, value in zip(self.step_values, terms):
            tracker.update_state(value)
        return terms[0]

    @property
    def metrics(self):
        return [*super().metrics, *self.step_values]


def vae(config, seed: int = 0) -> VAE:
    """A built VAE (variables exist) for the config."""
    net = VAE(config.hidden, config.latents, config.image_size ** 2, seed=seed)
    pixels = config.image_size ** 2
    net((ops.zeros((1, pixels)), ops.zeros((1, config.latents))))
    return net


def adam(config):
    """Keras's Adam with the twins' settings. Keras adds eps to sqrt(v) before the bias
    correction of v (torch and optax after it), so its eps acts sqrt(1 - b2^t) times
    smaller; at eps 1e-8 that moves nothing measurable here."""
    return keras.optimizers.Adam(learning_rate=config.lr, beta_1=config.b1, beta_2=config.b2,
                                 epsilon=config.adam_eps, name="adam")


def per_example(logits, x, mean, logvar):
    """(Bernoulli NLL summed over pixels, KL to N(0, I)), each (B,), with keras.ops: step.py's formula."""
    bce = ops.sum(ops.relu(logits) - logits * x + ops.log1p(ops.exp(-ops.abs(logits))), axis=-1)
    kl = -0.5 * ops.sum(1 + logvar - ops.square(mean) - ops.exp(logvar), axis=-1)
    return bce, kl


def loss_terms(logits, x, mean, logvar):
    """(mean negative ELBO, bce mean, kl mean)."""
    bce, kl = per_example(logits, x, mean, logvar)
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
