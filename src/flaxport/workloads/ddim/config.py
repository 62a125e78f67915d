"""DDIM hyperparameters, after the keras-io example "Denoising Diffusion Implicit Models"
(A. Béres, 2022), the reference the seed article (daigo0927/jax-ddim) ports.

Where the seed's JAX port deviates from keras (BatchNorm normaliser instead of fixed
dataset statistics, noise + image loss, 3x3 shortcut, BN eps 1e-5, EMA without the BN
statistics), both twins follow keras. keras's own settings are the `keras` variant (on
the digits) and the `flowers` variant (its data, Oxford Flowers 102 at 64x64).

The `default` variant departs from keras where its settings, made for ~25,000 steps on
a GPU, would leave a CPU user with noise: it has to draw recognisable digits within ~15
minutes on 2 CPU cores. With keras's settings on the digits (32x32, batch 64, 50 epochs
of 22 steps, constant EMA decay 0.999), 1,100 steps take ~15 minutes and the EMA
network is still one third the random initialisation (0.999^1100 = 0.33): its samples
are coloured noise. The default therefore
  - warms the EMA decay up (ema_warmup: min(0.999, (1 + t) / (10 + t)), as TF's
    ExponentialMovingAverage(num_updates=) and diffusers' EMA), so the EMA averages about
    the last tenth of any run and forgets the initialisation;
  - trains at 16x16: the digits are 8x8 scans, so 32x32 adds pixels but no detail, and
    an image costs a quarter as much to train on;
  - takes batches of 32 and lr 2e-3: as many images a second, twice the updates;
  - keeps keras's dataset_repetitions (5 passes an epoch) and its constant learning
    rate, and trains 25 epochs (5,600 steps).
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Config:
    # The values a string field may take; `--set` checks them before anything runs.
    CHOICES: ClassVar[dict] = {"data": ("digits", "flowers102"), "lr_schedule": ("constant", "warmup_cosine"),
                               "conv_impl": ("native", "im2col", "xla"), "runner": ("step", "scan"),
                               "sample_weights": ("ema", "online")}

    variant: str = "default"
    # Data: "digits" (embedded, 16x16x3 here, 32x32 in the `keras` variant) or "flowers102"
    # (64x64x3 in keras's example: the `flowers` variant; `--data flowers102` alone keeps
    # this config's side).
    data: str = "digits"
    image_size: int = 16
    channels: int = 3
    # keras's dataset_repetitions: an epoch passes over the training images this many times.
    dataset_repetitions: int = 5
    # keras `layers.Normalization().adapt(train)`: per-channel mean and std of the training
    # images in [0, 1]. Empty until set from the data (step.data_stats); the train step and
    # the sampler refuse to run without them, rather than normalise with made-up numbers.
    norm_mean: tuple = ()
    norm_std: tuple = ()
    # UNet: widths [32, 64, 96, 128], block_depth 2, sinusoidal embedding of the noise
    # variance with 32 dims, frequencies 1 .. 1000.
    widths: tuple = (32, 64, 96, 128)
    block_depth: int = 2
    embedding_dims: int = 32
    embedding_min_frequency: float = 1.0
    embedding_max_frequency: float = 1000.0
    # keras BatchNormalization(center=False, scale=False) defaults: momentum 0.99 (keras/
    # Flax convention: weight of the old average), i.e. torch momentum 0.01; eps 1e-3.
    bn_momentum: float = 0.01  # torch convention: weight of the new batch
    bn_eps: float = 1e-3
    # Continuous cosine schedule: signal rate from 0.95 (t = 0) down to 0.02 (t = 1).
    min_signal_rate: float = 0.02
    max_signal_rate: float = 0.95
    # keras AdamW(learning_rate=1e-3, weight_decay=1e-4), its other defaults: betas
    # (0.9, 0.999), epsilon 1e-7 (torch's AdamW defaults differ: wd 1e-2, eps 1e-8).
    # keras's batch is 64 and its lr 1e-3: see the module docstring.
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-7
    # "constant" (keras) or "warmup_cosine": linear 0 -> lr over warmup_steps, then cosine
    # to 0 at schedule_steps (the run's total steps; must be set for warmup_cosine).
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    schedule_steps: int = 0
    # EMA of the network's weights and BN statistics, used for sampling. keras decays by a
    # constant 0.999 (ema_warmup=False), made for Flowers' ~5,000+ steps; the default warms
    # the decay up as min(0.999, (1 + t) / (10 + t)) at update t (schedule.ema_decay).
    ema: float = 0.999
    ema_warmup: bool = True
    # keras trains 1 epoch in the file and says "at least 50"; the released model had 80.
    epochs: int = 25
    plot_diffusion_steps: int = 20  # DDIM steps of the sample pictures (`sample --steps`)
    # DDIM steps of the samples KID and the digit scores are measured on. keras takes 5 to
    # save time on Flowers; on the digits 5-step samples are visibly worse than the 20-step
    # pictures (KID 0.18 against 0.04 at the end of a default run), so KID would judge a
    # sampler nobody looks at: here they take the pictures' 20.
    kid_diffusion_steps: int = 20
    n_samples: int = 64  # images in samples.png (`sample --n`)
    # KID compares this many samples (fixed noise, EMA network) with the held-out images.
    # keras measures per validation batch; one set of 256 gives a steadier number per epoch.
    kid_images: int = 256
    # The network evaluation samples with: "ema" (keras) or "online", the trained weights
    # with their running BN statistics (to check what the EMA buys; see flaxport/cli/ema_check.py).
    sample_weights: str = "ema"
    # How the Flax convs run (flaxport.nn.conv2d). "native", flaxport's FFI kernels on CPU:
    # at 32x32, batch 64 a train step took 0.82-0.90 s against 1.50 s with "xla" and a
    # 20-step sample of 64 took 5.0 s against 10.0 s (2-core CPU). Of the pure-JAX forms,
    # "xla" beats im2col here (2.1 against 2.3 s a step, 9.5 against 25 s a sample), so it
    # is what "native" falls back to (no compiler, float64).
    conv_impl: str = "native"
    runner: str = "step"  # jit per step, as the seed article's loop


VARIANTS = ("default", "smoke", "quick", "bench", "keras", "flowers")

# keras-io's example, everything but the data: 64 a batch, lr 1e-3, a constant EMA decay.
KERAS = dict(batch_size=64, lr=1e-3, ema_warmup=False, epochs=50, kid_diffusion_steps=5)


def get_config(variant: str = "default") -> Config:
    base = Config()
    if variant == "default":
        return base
    if variant == "smoke":
        # Seconds, not minutes, for CLI tests: one stage pair of one block, a narrow
        # embedding, one pass an epoch in batches of 64; every sampler runs 5 steps, so one
        # compiled program serves KID and the pictures.
        return dataclasses.replace(base, variant="smoke", epochs=1, dataset_repetitions=1, batch_size=64,
                                   widths=(8, 16), block_depth=1, embedding_dims=8, n_samples=16,
                                   plot_diffusion_steps=5, kid_diffusion_steps=5, kid_images=64)
    if variant == "quick":
        # Recognisable digits in a minute or two: the digits at their own 8x8 (a step costs
        # a ninth of the default's), keras's UNet less its last stage; 1,344 steps.
        return dataclasses.replace(base, variant="quick", image_size=8, widths=(32, 64, 96), epochs=6)
    if variant == "bench":
        # The keras-sized train step for speed figures: 32x32 digits, batch 64, one pass an epoch.
        return dataclasses.replace(base, variant="bench", image_size=32, batch_size=64, dataset_repetitions=1,
                                   epochs=2)
    if variant == "keras":  # keras-io's settings on the digits, at 32x32: ~75 minutes on 2 cores
        return dataclasses.replace(base, variant="keras", image_size=32, **KERAS)
    if variant == "flowers":  # keras-io's own setting: Oxford Flowers 102 at 64x64
        return dataclasses.replace(base, variant="flowers", data="flowers102", image_size=64, **KERAS)
    raise ValueError(variant)


# What each field may hold, besides CHOICES (flaxport.workloads.validate applies both).
RULES = {
    "image_size": "size", "channels": (3,), "dataset_repetitions": "size", "ema_warmup": "flag", "norm_mean": "stats", "norm_std": "stats", "widths": "sizes",
    "block_depth": "size", "embedding_dims": "size", "embedding_min_frequency": "positive",
    "embedding_max_frequency": "positive", "bn_momentum": "fraction", "bn_eps": "nonnegative",
    "min_signal_rate": "fraction", "max_signal_rate": "fraction", "batch_size": "size", "lr": "nonnegative",
    "weight_decay": "nonnegative", "b1": "beta", "b2": "beta", "adam_eps": "nonnegative", "warmup_steps": "count",
    "schedule_steps": "count", "ema": "fraction", "epochs": "size", "plot_diffusion_steps": "size",
    "kid_diffusion_steps": "size", "n_samples": "size", "kid_images": "size",
}
CHECKS = (
    ("image_size", lambda c: c.image_size % 2 ** (len(c.widths) - 1) == 0,
     lambda c: f"{c.image_size} must be divisible by {2 ** (len(c.widths) - 1)} (the UNet halves it "
               f"{len(c.widths) - 1} times for widths {','.join(map(str, c.widths))})"),
    ("embedding_dims", lambda c: c.embedding_dims % 2 == 0, "must be even (sines and cosines, half each)"),
    ("max_signal_rate", lambda c: c.min_signal_rate < c.max_signal_rate, "must be above min_signal_rate"),
    ("norm_std", lambda c: all(s > 0 for s in c.norm_std) and len(c.norm_std) == len(c.norm_mean) in (0, c.channels),
     "and norm_mean must hold one value per channel (std > 0), or both none (taken from the data)"),
    ("schedule_steps", lambda c: c.lr_schedule != "warmup_cosine" or c.schedule_steps > c.warmup_steps,
     "must be above warmup_steps for lr_schedule=warmup_cosine (the run's total train steps)"),
    ("batch_size", lambda c: c.batch_size * (c.image_size // 2 ** (len(c.widths) - 1)) ** 2 >= 2,
     "times the innermost feature map's pixels must be at least 2 (BatchNorm needs 2 values per channel)"),
    ("kid_images", lambda c: c.kid_images >= 2, "must be at least 2 (KID compares sets of images)"),
)


def memory_estimate(config) -> list:
    """[(bytes, what)]: the train state, then peaks on top of it (lower bounds; float32)."""
    s, w = config.image_size, config.widths
    # 3x3 convs: down and up stages (block_depth blocks of two), the middle blocks.
    params = 9 * config.block_depth * (2 * sum(x * x for x in w[:-1]) * 2 + 2 * w[-1] ** 2)
    pixels = s * s * w[0]
    return [
        (20 * params, f"{params:.3g} parameters with their gradients, Adam moments and EMA"),
        (8 * config.block_depth * config.batch_size * pixels, f"a batch of {config.batch_size} at image_size={s}"),
        (4 * config.n_samples * pixels, f"n_samples={config.n_samples} samples at image_size={s}"),
        (4 * config.kid_images * pixels, f"kid_images={config.kid_images} samples at image_size={s}"),
        (1797 * s * s * config.channels, f"the images at image_size={s}"),
    ]
