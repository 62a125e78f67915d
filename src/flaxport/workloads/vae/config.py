"""VAE hyperparameters: google/flax examples/vae and the seed article (Dense 500, 20 latents)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Config:
    CHOICES: ClassVar[dict] = {"data": ("digits", "binarized_mnist"), "runner": ("step", "scan")}
    # Fields `train --sweep` may vary inside one vectorised program.
    SWEEPABLE: ClassVar[tuple] = ("lr", "b1", "b2", "adam_eps")

    variant: str = "default"
    # Data: "digits" (embedded, binarized 28x28, the default) or "binarized_mnist" (--data-dir).
    data: str = "digits"
    image_size: int = 28
    hidden: int = 500
    latents: int = 20
    # Adam(1e-3) with torch's defaults, batch 128 (flax examples/vae; the seed's Keras
    # port used 1e-4, the others 1e-3).
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    batch_size: int = 128
    epochs: int = 10
    # Evaluation: one-sample negative ELBO and the importance-weighted bound with k samples.
    iwae_k: int = 50
    eval_batch: int = 500
    n_samples: int = 64  # pictures: samples from the prior
    runner: str = "scan"


VARIANTS = ("default", "smoke", "bench")


def get_config(variant: str = "default") -> Config:
    base = Config()
    if variant == "default":
        return base
    if variant == "smoke":
        return dataclasses.replace(base, variant="smoke", epochs=1, iwae_k=5)
    if variant == "bench":
        return dataclasses.replace(base, variant="bench", epochs=5, iwae_k=5)
    raise ValueError(variant)
