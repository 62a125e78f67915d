"""The PyTorch twin of step.py: the seed article's g_step / d_step, plus eval sampling.

Mirrors step.py function for function. `TorchGAN` holds what the Flax GANState holds.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from flaxport.workloads.gan import model_torch, quality

criterion = nn.MSELoss()


@dataclasses.dataclass
class TorchGAN:
    G: nn.Module
    D: nn.Module
    g_opt: torch.optim.Optimizer
    d_opt: torch.optim.Optimizer
    set_to_none: bool = True

    def state_dict(self) -> dict:
        return {"G": self.G.state_dict(), "D": self.D.state_dict(),
                "g_opt": self.g_opt.state_dict(), "d_opt": self.d_opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.G.load_state_dict(sd["G"])
        self.D.load_state_dict(sd["D"])
        self.g_opt.load_state_dict(sd["g_opt"])
        self.d_opt.load_state_dict(sd["d_opt"])


def init_state(config, seed: int, fused: bool = False, set_to_none: bool = True) -> TorchGAN:
    """Models with torch's default init from `seed`; Adam (fused if asked) at the config's lrs."""
    torch.manual_seed(seed)
    G, D = model_torch.generator(config), model_torch.discriminator(config)
    G.train()
    D.train()
    kw = dict(betas=(config.b1, config.b2), eps=config.adam_eps, fused=fused or None)
    return TorchGAN(G, D, torch.optim.Adam(G.parameters(), lr=config.g_lr, **kw),
                    torch.optim.Adam(D.parameters(), lr=config.d_lr, **kw), set_to_none)


def g_step(ts: TorchGAN, z: torch.Tensor):
    """z (B, z_dim) -> (g_loss, fake (B, 1)); G's grads stay in .grad."""
    valid = torch.ones((len(z), 1))
    fake_data = ts.G(z)
    g_loss = criterion(ts.D(fake_data), valid)
    ts.g_opt.zero_grad(set_to_none=ts.set_to_none)
    g_loss.backward()
    ts.g_opt.step()
    return g_loss, fake_data


def d_step(ts: TorchGAN, real_data: torch.Tensor, fake_data: torch.Tensor, grads_out: list | None = None):
    """One D step on real -> 1, one on fake.detach() -> 0; returns their mean loss.

    grads_out, if given, receives D's gradients of each of the two steps.
    """
    valid = torch.ones((len(real_data), 1))
    fake = torch.zeros((len(fake_data), 1))
    d_loss_real = criterion(ts.D(real_data), valid)
    ts.d_opt.zero_grad(set_to_none=ts.set_to_none)
    d_loss_real.backward()
    if grads_out is not None:
        grads_out.append({k: p.grad.clone() for k, p in ts.D.named_parameters()})
    ts.d_opt.step()
    d_loss_fake = criterion(ts.D(fake_data.detach()), fake)
    ts.d_opt.zero_grad(set_to_none=ts.set_to_none)
    d_loss_fake.backward()
    if grads_out is not None:
        grads_out.append({k: p.grad.clone() for k, p in ts.D.named_parameters()})
    ts.d_opt.step()
    return (d_loss_real + d_loss_fake) / 2.0


def train_step(config, ts: TorchGAN, batch: dict, generator: torch.Generator) -> dict:
    """batch {'x': (B, 1) float32 tensor} -> {'g_loss', 'd_loss'} (0-d tensors, not synced)."""
    real = batch["x"]
    z = torch.randn((len(real), config.z_dim), generator=generator)
    g_loss, fake = g_step(ts, z)
    d_loss = d_step(ts, real, fake)
    return {"g_loss": g_loss.detach(), "d_loss": d_loss.detach()}


def compile_models(ts: TorchGAN) -> None:
    """torch.compile G and D in place (the `torch-compiled` variant); state_dict keys stay."""
    ts.G.compile()
    ts.D.compile()


@torch.no_grad()
def sample(config, ts: TorchGAN, seed: int, n: int) -> np.ndarray:
    """n eval-mode samples (running statistics) as NumPy (n,)."""
    z = torch.randn((n, config.z_dim), generator=torch.Generator().manual_seed(seed))
    ts.G.eval()
    try:
        return ts.G(z)[:, 0].numpy().copy()
    finally:
        ts.G.train()


def evaluate(config, ts: TorchGAN, data, seed: int):
    return quality.evaluate_samples(config, sample(config, ts, seed, config.n_eval), data)
