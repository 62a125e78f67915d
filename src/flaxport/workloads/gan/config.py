"""GAN hyperparameters. `default` is the seed article's PyTorch reference, exactly."""
from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Config:
    # Fields `train --sweep` may vary inside one vectorised program (no shape depends on them;
    # bn_eps is a static argument of the BatchNorm's custom gradient, so it cannot be traced).
    SWEEPABLE: ClassVar[tuple] = ("g_lr", "d_lr", "b1", "b2", "adam_eps", "bn_momentum")

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


VARIANTS = ("default", "smoke", "bench", "tuned", "quick")


def get_config(variant: str = "default") -> Config:
    base = Config()
    if variant == "default":
        return base
    if variant == "smoke":
        return dataclasses.replace(base, variant="smoke", n_per_mode=500, epochs=2, n_eval=2000)
    if variant == "bench":
        return dataclasses.replace(base, variant="bench", epochs=5)
    if variant == "tuned":
        # Same Linear -> BatchNorm -> ReLU MLPs and widths; only training settings change.
        # Seeds 0-2, both twins: final W1 0.004-0.013, mode shares 0.48-0.52 (default: W1
        # 0.03-0.47, one mode taking up to 98% of samples).
        return dataclasses.replace(
            base,
            variant="tuned",
            # D sees all-real and all-fake batches separately, so BatchNorm after its first
            # Linear(1, 32) removes the batch mean (and, with a small eps, the scale): D cannot
            # tell G that its samples sit in the wrong place. With BN in D, seed 0 ended with the
            # whole distribution shifted by -0.1 (W1 0.13); without it, all seeds W1 < 0.015.
            d_batchnorm=False,
            # 256 instead of 10: G's BatchNorm statistics of a batch of 10 are noisy, and the
            # eval-mode running stats then differ from what G trained with (seed 1: W1 0.074
            # in train mode, 0.101 in eval mode); with the settings below batch 10 gave final
            # W1 0.05-0.12 (eps 1e-5) or 0.02-0.05 (eps 0.8). 256 also quiets the gradients.
            batch_size=256,
            # The 0.8 eps only damped BatchNorm's noisy batch-of-10 variance; at batch 256 it
            # doesn't matter (0.8 gave final W1 0.009-0.015 too), so torch's default is used.
            bn_eps=1e-5,
            # beta1 0.5 (the usual GAN setting) damps G/D oscillation; with 0.9, seeds 1 and 2
            # oscillated (last-10-epoch W1 up to 0.089 and 0.050).
            b1=0.5,
            # D learns 4x faster than G (two-time-scale rule): D tracks G so the
            # mode positions stay put; D at 2e-4 with G at 5e-5 spiked to W1 0.106 on seed 1.
            g_lr=1e-4,
            d_lr=4e-4,
            # 200 epochs x 78 steps = 15.6k steps: W1 stays < 0.03 from epoch 21-37 on (both
            # twins, seeds 0-2; <= 0.023 from epoch 100); the rest leaves margin. About 1 min
            # per seed in either twin on 2 CPU cores.
            epochs=200,
        )
    if variant == "quick":
        # `tuned` in seconds, for `make demo`: batch 64 and twice the learning rates (the same 4x
        # D/G ratio). 20 epochs x 312 steps: seeds 0-2 of both twins end at W1 0.012-0.015,
        # mode shares 0.48-0.52; W1 first under 0.03 at epoch 5-12. Less margin than `tuned`
        # (single epochs up to W1 0.034 after that), in a third of its steps on 4x smaller batches.
        return dataclasses.replace(get_config("tuned"), variant="quick", batch_size=64, g_lr=2e-4, d_lr=8e-4,
                                   epochs=20)
    raise ValueError(variant)


# What each field may hold (flaxport.workloads.validate applies it to --set and config.json).
RULES = {
    "z_dim": "size", "g_widths": "sizes", "d_widths": "sizes", "bn_eps": "nonnegative", "bn_momentum": "fraction",
    "d_batchnorm": "flag", "g_lr": "nonnegative", "d_lr": "nonnegative", "b1": "beta", "b2": "beta",
    "adam_eps": "nonnegative", "batch_size": "size", "epochs": "size", "modes": "values", "mode_std": "nonnegative",
    "n_per_mode": "size", "data_seed": "seed", "n_eval": "size", "runner": ("step", "scan"),
}
CHECKS = (
    ("batch_size", lambda c: c.batch_size >= 2, "must be at least 2 (BatchNorm needs 2 values per channel to train)"),
)


def memory_estimate(config) -> list:
    """[(bytes, what)]: the train state, then peaks on top of it (lower bounds; float32)."""
    def mlp(n_in, widths):
        dims = [n_in, *widths, 1]
        return sum(a * b + b for a, b in zip(dims, dims[1:])) + 4 * sum(widths)  # + BatchNorm

    params = mlp(config.z_dim, config.g_widths) + mlp(1, config.d_widths)
    widest = max(config.g_widths or (1,))
    return [
        (16 * params, f"{params:.3g} parameters with their gradients and Adam moments"),
        (4 * config.n_per_mode * len(config.modes), f"n_per_mode={config.n_per_mode} samples per mode"),
        (4 * config.n_eval * (config.z_dim + widest), f"n_eval={config.n_eval} generated samples of z_dim={config.z_dim}"),
        (8 * config.batch_size * (config.z_dim + sum(config.g_widths)), f"a batch of {config.batch_size}"),
    ]
