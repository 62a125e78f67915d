"""CNN classifier hyperparameters. `default` is the seed article's PyTorch reference."""
from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Config:
    # The values a string field may take; `--set` checks them before anything runs.
    CHOICES: ClassVar[dict] = {"data": ("digits", "cifar10"), "conv_impl": ("native", "im2col", "xla"),
                               "runner": ("step", "scan")}
    # Fields `train --sweep` may vary inside one vectorised program.
    SWEEPABLE: ClassVar[tuple] = ("lr", "b1", "b2", "adam_eps", "bn_momentum")

    variant: str = "default"
    # Data: "digits" (embedded, the default) or "cifar10" (--data-dir). 32x32x3 either way.
    data: str = "digits"
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    # Conv 3x3 (padding=1) -> BatchNorm -> ReLU -> MaxPool 2, twice; Dense 256; Dense 10.
    conv_widths: tuple = (32, 64)
    hidden: int = 256
    # nn.BatchNorm2d defaults: eps 1e-5, momentum 0.1 in torch's convention (weight of the
    # new batch), i.e. Flax's momentum 0.9. The seed's JAX port passed momentum=0.1 to
    # flax.linen.BatchNorm, which keeps only 10% of the running average each step.
    bn_eps: float = 1e-5
    bn_momentum: float = 0.1
    # optim.Adam(lr=0.001) with torch's defaults; NLL loss on log_softmax.
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    batch_size: int = 32
    epochs: int = 5
    eval_batch: int = 500  # evaluation chunk: fixed, so eval compiles once
    # How the Flax convs run (flaxport.nn.conv2d): "native" (flaxport's FFI kernels on
    # CPU, else im2col/xla), "im2col" (patches @ kernel) or "xla" (the conv op).
    conv_impl: str = "native"
    # scan: one compiled epoch (docs/benchmarks.md, CNN).
    runner: str = "scan"


VARIANTS = ("default", "smoke", "bench")


def get_config(variant: str = "default") -> Config:
    base = Config()
    if variant == "default":
        return base
    if variant == "smoke":
        return dataclasses.replace(base, variant="smoke", epochs=1)
    if variant == "bench":
        return dataclasses.replace(base, variant="bench", epochs=3)
    raise ValueError(variant)


# What each field may hold, besides CHOICES (flaxport.workloads.validate applies both).
RULES = {
    "image_size": "size", "channels": (1, 3), "num_classes": "size", "conv_widths": "sizes", "hidden": "size",
    "bn_eps": "nonnegative", "bn_momentum": "fraction", "lr": "nonnegative", "b1": "beta", "b2": "beta",
    "adam_eps": "nonnegative", "batch_size": "size", "epochs": "size", "eval_batch": "size",
}
CHECKS = (
    ("image_size", lambda c: c.image_size >= 4, "must be at least 4 (two 2x2 max-pools halve it twice)"),
    ("num_classes", lambda c: c.num_classes >= 10, "must be at least 10 (digits and CIFAR-10 have 10 classes)"),
)


def memory_estimate(config) -> list:
    """[(bytes, what)]: the train state, then peaks on top of it (lower bounds; float32)."""
    s, widths = config.image_size, config.conv_widths
    cins = (config.channels, *widths[:-1])
    convs = sum(9 * cin * w + 5 * w for cin, w in zip(cins, widths))  # kernel, bias, BatchNorm
    flat = (s // 4) ** 2 * widths[-1]
    params = convs + flat * config.hidden + config.hidden + config.hidden * config.num_classes + config.num_classes
    return [
        (16 * params, f"{params:.3g} parameters with their gradients and Adam moments"),
        (1797 * s * s * config.channels, f"the images at image_size={s}"),
        (8 * config.batch_size * s * s * widths[0], f"a batch of {config.batch_size} at image_size={s}"),
        (4 * config.eval_batch * s * s * widths[0], f"an evaluation chunk of eval_batch={config.eval_batch}"),
    ]
