"""Framework-neutral datasets: NumPy arrays (NHWC images, uint8 or float32), loaded once."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Dataset:
    """train/test/valid: {name: array (N, ...)}; `name` says which source was used.

    `valid` is for sources that publish a validation split (binarized MNIST); workloads
    train on `train` and report on `test`, so None elsewhere. `meta` holds small facts
    (source, counts, class names), never arrays.
    """

    name: str
    train: dict
    test: dict | None = None
    meta: dict = dataclasses.field(default_factory=dict)
    valid: dict | None = None
