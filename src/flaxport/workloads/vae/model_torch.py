"""The seed article's PyTorch VAE: same layers, same names as model.py."""
from __future__ import annotations

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        pixels = config.image_size ** 2
        self.fc1 = nn.Linear(pixels, config.hidden)
        self.fc2_mean = nn.Linear(config.hidden, config.latents)
        self.fc2_logvar = nn.Linear(config.hidden, config.latents)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2_mean(h), self.fc2_logvar(h)


class Decoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.fc1 = nn.Linear(config.latents, config.hidden)
        self.fc2 = nn.Linear(config.hidden, config.image_size ** 2)

    def forward(self, z):
        return self.fc2(torch.relu(self.fc1(z)))


class VAE(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    def forward(self, x, eps):
        """x (B, 784), eps (B, latents) -> (logits, mean, logvar); the seed draws eps with
        randn_like inside, here the caller passes it so twins can share the noise."""
        mean, logvar = self.encoder(x)
        z = mean + eps * torch.exp(0.5 * logvar)
        return self.decoder(z), mean, logvar
