"""VAE quality, shared by the twins: test negative ELBO and the importance-weighted bound."""
from __future__ import annotations

import math

import numpy as np


def iwae_nats(log_w: np.ndarray) -> float:
    """-mean_x log (1/k sum_k w_k) from log-weights (N, k), in float64: the IWAE bound (nats).

    k = 1 is the one-sample ELBO; it tightens towards -log p(x) as k grows (Burda et al. 2016).
    """
    log_w = np.asarray(log_w, np.float64)
    m = log_w.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(log_w - m).sum(axis=1))
    return float(-(lse - math.log(log_w.shape[1])).mean())


def summarize(config, nelbo, log_w, artifacts):
    """(quality {'nelbo_nats', 'iwae_nats', 'iwae_k'}, artifacts)."""
    return {"nelbo_nats": round(float(np.mean(nelbo)), 4), "iwae_nats": round(iwae_nats(log_w), 4),
            "iwae_k": int(np.asarray(log_w).shape[1])}, artifacts
