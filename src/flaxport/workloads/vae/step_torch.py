"""The PyTorch twin of step.py: the seed article's train_step and final_loss, plus eval.

The seed summed the loss over the batch (`BCEWithLogitsLoss(reduction='sum')`); here it
is the mean over the batch, as in its Flax port and google/flax examples/vae, so the
three twins take the same Adam steps (with a sum, Adam's eps weighs 128x less).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import nn

from flaxport.workloads.vae import model_torch, quality

LOG_2PI = math.log(2 * math.pi)


@dataclasses.dataclass
class TorchVAE:
    model: nn.Module
    opt: torch.optim.Optimizer
    set_to_none: bool = True

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])


def init_state(config, seed: int, fused: bool = False, set_to_none: bool = True) -> TorchVAE:
    torch.manual_seed(seed)
    net = model_torch.VAE(config)
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, betas=(config.b1, config.b2), eps=config.adam_eps,
                           fused=fused or None)
    return TorchVAE(net, opt, set_to_none)


def flatten(images_u8: torch.Tensor) -> torch.Tensor:
    return images_u8.reshape(len(images_u8), -1).float()


def per_example(logits, x, mean, logvar):
    """(Bernoulli NLL summed over pixels, KL to N(0, I)), each (B,)."""
    bce = nn.functional.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(-1)
    kl = -0.5 * torch.sum(1 + logvar - mean.pow(2) - logvar.exp(), dim=-1)
    return bce, kl


def final_loss(logits, x, mean, logvar):
    """(mean negative ELBO, bce mean, kl mean): per-example sums, averaged over the batch."""
    bce, kl = per_example(logits, x, mean, logvar)
    return (bce + kl).mean(), bce.mean(), kl.mean()


def step(ts: TorchVAE, x: torch.Tensor, eps: torch.Tensor):
    """One Adam step on x (B, P) float with noise eps (B, L); grads stay in .grad."""
    logits, mean, logvar = ts.model(x, eps)
    loss, bce, kl = final_loss(logits, x, mean, logvar)
    ts.opt.zero_grad(set_to_none=ts.set_to_none)
    loss.backward()
    ts.opt.step()
    return loss, bce, kl


def train_step(config, ts: TorchVAE, batch: dict, generator: torch.Generator) -> dict:
    x = flatten(batch["image"])
    eps = torch.randn((len(x), config.latents), generator=generator)
    loss, bce, kl = step(ts, x, eps)
    return {"loss": loss.detach(), "bce": bce.detach(), "kl": kl.detach()}


def compile_models(ts: TorchVAE) -> None:
    ts.model.compile()


@torch.no_grad()
def log_weights(net, x, eps_k, posterior=None):
    """Importance log-weights: x (E, P), eps_k (E, K, L) -> (E, K); posterior: (mean, logvar) if known."""
    mean, logvar = posterior if posterior is not None else net.encoder(x)
    z = mean[:, None] + eps_k * torch.exp(0.5 * logvar)[:, None]
    logits = net.decoder(z)
    xk = x[:, None].expand_as(logits)
    log_px_z = -nn.functional.binary_cross_entropy_with_logits(logits, xk, reduction="none").sum(-1)
    log_pz = -0.5 * torch.sum(z.square() + LOG_2PI, dim=-1)
    log_qz = -0.5 * torch.sum(eps_k.square() + logvar[:, None] + LOG_2PI, dim=-1)
    return log_px_z + log_pz - log_qz


@torch.no_grad()
def evaluate(config, ts: TorchVAE, data, seed: int):
    gen = torch.Generator().manual_seed(seed)
    images = data.test["image"]
    nelbo, logw = [], []
    for start in range(0, len(images), config.eval_batch):
        x = flatten(torch.from_numpy(np.ascontiguousarray(images[start:start + config.eval_batch])))
        eps1 = torch.randn((len(x), config.latents), generator=gen)
        eps_k = torch.randn((len(x), config.iwae_k, config.latents), generator=gen)
        mean, logvar = ts.model.encoder(x)
        logits = ts.model.decoder(mean + eps1 * torch.exp(0.5 * logvar))
        bce, kl = per_example(logits, x, mean, logvar)
        nelbo.append((bce + kl).numpy())
        logw.append(log_weights(ts.model, x, eps_k, (mean, logvar)).numpy())
    side = config.image_size
    x = flatten(torch.from_numpy(np.ascontiguousarray(images[:16])))
    mean, _ = ts.model.encoder(x)
    z = torch.randn((config.n_samples, config.latents), generator=gen)
    artifacts = {"inputs": x.numpy().reshape(-1, side, side),
                 "reconstructions": torch.sigmoid(ts.model.decoder(mean)).numpy().reshape(-1, side, side),
                 "samples": torch.sigmoid(ts.model.decoder(z)).numpy().reshape(-1, side, side)}
    return quality.summarize(config, np.concatenate(nelbo), np.concatenate(logw), artifacts)
