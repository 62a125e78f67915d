"""1-D Gaussian mixture of the GAN seed article: N(0, 0.1) and N(0.5, 0.1), 10k each.

Always synthetic: drawn with NumPy from a fixed data seed, so every framework and every
run of a comparison trains on the very same 20k numbers.
"""
from __future__ import annotations

import numpy as np

from flaxport.data import Dataset


def sample(rng: np.random.Generator, modes, std: float, n_per_mode: int) -> np.ndarray:
    """(len(modes) * n_per_mode,) float32 samples, mode by mode."""
    return np.concatenate([rng.normal(m, std, n_per_mode) for m in modes]).astype(np.float32)


def load(modes=(0.0, 0.5), std=0.1, n_per_mode=10_000, data_seed=0) -> Dataset:
    """train {'x': (N, 1) float32}; test {'x': (N, 1)}: a fresh draw for quality metrics."""
    train = sample(np.random.default_rng(data_seed), modes, std, n_per_mode)
    test = sample(np.random.default_rng(data_seed + 1_000_003), modes, std, n_per_mode)
    return Dataset(
        name="mixture",
        train={"x": train[:, None]},
        test={"x": test[:, None]},
        meta={"modes": list(modes), "std": std},
    )
