"""The seed article's VAE in Flax (google/flax examples/vae): MLP encoder and decoder.

encoder: fc1 500 -> relu -> (fc2_mean, fc2_logvar) 20 each
decoder: fc1 500 -> relu -> fc2 784 logits (Bernoulli)
Layer names and order match model_torch.py; Dense uses torch's default init so the
twins start from the same law.
"""
from __future__ import annotations

import jax.numpy as jnp
from flax import linen as nn

from flaxport.nn import Dense


class Encoder(nn.Module):
    hidden: int = 500
    latents: int = 20

    @nn.compact
    def __call__(self, x):
        """x (B, 784) in {0, 1} -> (mean, logvar), each (B, latents)."""
        h = nn.relu(Dense(self.hidden, name="fc1")(x))
        return Dense(self.latents, name="fc2_mean")(h), Dense(self.latents, name="fc2_logvar")(h)


class Decoder(nn.Module):
    hidden: int = 500
    pixels: int = 784

    @nn.compact
    def __call__(self, z):
        """z (..., latents) -> Bernoulli logits (..., pixels)."""
        h = nn.relu(Dense(self.hidden, name="fc1")(z))
        return Dense(self.pixels, name="fc2")(h)


def reparameterize(mean, logvar, eps):
    """z = mean + eps * exp(logvar / 2); eps ~ N(0, I) comes from the caller's key."""
    return mean + eps * jnp.exp(0.5 * logvar)


class VAE(nn.Module):
    hidden: int = 500
    latents: int = 20
    pixels: int = 784

    def setup(self):
        self.encoder = Encoder(self.hidden, self.latents)
        self.decoder = Decoder(self.hidden, self.pixels)

    def __call__(self, x, eps):
        """x (B, 784), eps (B, latents) -> (logits (B, 784), mean, logvar)."""
        mean, logvar = self.encoder(x)
        return self.decoder(reparameterize(mean, logvar, eps)), mean, logvar

    def encode(self, x):
        return self.encoder(x)

    def decode(self, z):
        return self.decoder(z)


def vae(config) -> VAE:
    return VAE(hidden=config.hidden, latents=config.latents, pixels=config.image_size ** 2)


def train_flops(config) -> int:
    """Model FLOPs of one train step: 2 x multiply-adds of the five Linear layers, forward
    plus backward (twice the forward), less the encoder's input gradient (x is data)."""
    p, h, l = config.image_size ** 2, config.hidden, config.latents
    forward = 2 * config.batch_size * (p * h + 2 * h * l + l * h + h * p)
    return 3 * forward - 2 * config.batch_size * p * h
