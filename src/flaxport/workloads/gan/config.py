"""GAN hyperparameters. `default` is the seed article's PyTorch reference, exactly."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
    variant: str = "default"
    # Models: Linear -> BatchNorm1d -> ReLU, last Linear to 1.
    z_dim: int = 512
    g_widths: tuple = (64, 32)
    d_widths: tuple = (32, 64)
    # nn.BatchNorm1d(64, 0.8): the 0.8 is eps (2nd positional), momentum stays torch's 0.1.
    bn_eps: float = 0.8
    bn_momentum: float = 0.1  # torch convention: weight of the new batch
    d_batchnorm: bool = True
    # Adam as torch.optim.Adam defaults, with the article's learning rates.
    g_lr: float = 5e-5
    d_lr: float = 1e-4
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    batch_size: int = 10
    epochs: int = 30
    # Data: N(mode, std) for each mode, n_per_mode samples each.
    modes: tuple = (0.0, 0.5)
    mode_std: float = 0.1
    n_per_mode: int = 10_000
    data_seed: int = 0
    n_eval: int = 10_000  # generated samples for W1/KS/mode share
    runner: str = "scan"
    scan_unroll: int = 1


VARIANTS = ("default", "smoke", "bench", "tuned")


def get_config(variant: str = "default") -> Config:
    base = Config()
    if variant == "default":
        return base
    if variant == "smoke":
        return dataclasses.replace(base, variant="smoke", n_per_mode=500, epochs=2, n_eval=2000)
    if variant == "bench":
        return dataclasses.replace(base, variant="bench", epochs=5)
    if variant == "tuned":
        # Filled in by the hyperparameter study; see README "Why the tuned config learns".
        return dataclasses.replace(base, variant="tuned")
    raise ValueError(variant)
