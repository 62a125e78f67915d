"""Framework-neutral datasets: NumPy arrays (NHWC images, uint8 or float32), loaded once."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Dataset:
    """train/test: {name: array (N, ...)}; `name` says which source was used."""

    name: str
    train: dict
    test: dict | None = None
    meta: dict = dataclasses.field(default_factory=dict)
