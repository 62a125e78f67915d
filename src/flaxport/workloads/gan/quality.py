"""How well a 1-D sampler matches the two-mode mixture (framework-neutral, NumPy/SciPy)."""
from __future__ import annotations

import numpy as np
from scipy import stats


def quality(samples: np.ndarray, reference: np.ndarray, modes) -> dict:
    """samples (n,), reference (m,) -> w1, ks, mode_share (share nearest each mode).

    w1: Wasserstein-1 distance; ks: two-sample Kolmogorov-Smirnov statistic;
    mode_share: list, one share per mode, summing to 1 (a perfect sampler: 0.5 / 0.5).
    Non-finite samples (a diverged G) give w1 = ks = inf.
    """
    samples = np.asarray(samples, np.float64).ravel()
    reference = np.asarray(reference, np.float64).ravel()
    modes = np.asarray(modes, np.float64)
    if not np.isfinite(samples).all():
        return {"w1": float("inf"), "ks": 1.0, "mode_share": [float("nan")] * len(modes)}
    nearest = np.argmin(np.abs(samples[:, None] - modes[None, :]), axis=1)
    share = np.bincount(nearest, minlength=len(modes)) / len(samples)
    return {
        "w1": float(stats.wasserstein_distance(samples, reference)),
        "ks": float(stats.ks_2samp(samples, reference).statistic),
        "mode_share": [round(float(s), 4) for s in share],
    }


def evaluate_samples(config, samples, data) -> tuple[dict, dict]:
    """(quality, artifacts) for generated samples against the held-out mixture draw."""
    return quality(samples, data.test["x"][:, 0], config.modes), {"samples": np.asarray(samples)}
