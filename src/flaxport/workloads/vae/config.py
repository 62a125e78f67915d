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


# What each field may hold, besides CHOICES (flaxport.workloads.validate applies both).
RULES = {
    "image_size": "size", "hidden": "size", "latents": "size", "lr": "nonnegative", "b1": "beta", "b2": "beta",
    "adam_eps": "nonnegative", "batch_size": "size", "epochs": "size", "iwae_k": "size", "eval_batch": "size",
    "n_samples": "size",
}


def memory_estimate(config) -> list:
    """[(bytes, what)]: the train state, then peaks on top of it (lower bounds; float32)."""
    d, h, z = config.image_size ** 2, config.hidden, config.latents
    params = d * h + h + h * 2 * z + 2 * z + z * h + h + h * d + d
    return [
        (16 * params, f"{params:.3g} parameters with their gradients and Adam moments"),
        (4 * config.eval_batch * config.iwae_k * (d + z),
         f"evaluation: iwae_k={config.iwae_k} importance samples x eval_batch={config.eval_batch} images"),
        (8 * config.batch_size * (d + h), f"a batch of {config.batch_size}"),
        (4 * config.n_samples * (d + h), f"n_samples={config.n_samples} samples"),
        (1797 * d, f"the images at image_size={config.image_size}"),
    ]
