"""DDIM quality, shared by the twins: fixed evaluation draws, chunked sampling, KID.

Every draw here comes from NumPy with fixed seeds, so both twins (and every epoch, and a
resumed run, and `flaxport evaluate`) sample from the same noise and score the same held-
out noise and times: a converted model gives the same numbers in either framework.

Quality per evaluation:
  kid             KID (flaxport.metrics.kid) between config.kid_images samples (EMA
                  network, kid_diffusion_steps) and the held-out images, on the features
                  of features.classifier_features (cached in the data dir); lower is better
  val_loss        noise MAE of the EMA network (eval mode) on the held-out images, fixed
                  noise and times (keras's n_loss on its validation set)
  val_image_loss  the image MAE of the same forward pass (keras's i_loss)
  sample_seconds  wall time of the n_samples pictures (plot_diffusion_steps steps), the
                  JAX compile excluded: a timing, so it differs between calls
Imports neither torch nor jax at module level.
"""
from __future__ import annotations

import functools
import time

import numpy as np

KID_SEED, PICTURE_SEED, VAL_SEED = 1, 2, 3


def _normal(seed: int, n: int, config) -> np.ndarray:
    """float32 (n, H, W, C) ~ N(0, 1); the first k rows do not depend on n (NumPy fills in order)."""
    side = config.image_size
    return np.random.default_rng(seed).standard_normal((n, side, side, config.channels), np.float32)


def kid_noise(config) -> np.ndarray:
    """Initial noise (kid_images, H, W, C) of the KID samples."""
    return _normal(KID_SEED, config.kid_images, config)


def picture_noise(config) -> np.ndarray:
    """Initial noise (n_samples, H, W, C) of samples.png."""
    return _normal(PICTURE_SEED, config.n_samples, config)


def val_draws(config, n: int):
    """(noise (n, H, W, C), diffusion times (n, 1, 1, 1)) for the validation losses."""
    rng = np.random.default_rng(VAL_SEED)
    side = config.image_size
    noise = rng.standard_normal((n, side, side, config.channels), np.float32)
    return noise, rng.uniform(size=(n, 1, 1, 1)).astype(np.float32)


def in_chunks(fn, arrays, chunk: int) -> list:
    """fn(*chunks) over rows of `arrays` (same length N) in chunks of exactly `chunk` rows
    (the last zero-padded, so a jitted fn compiles once); its outputs, trimmed and
    concatenated, as NumPy arrays (one per output)."""
    n = len(arrays[0])
    outs = []
    for start in range(0, n, chunk):
        parts = [a[start:start + chunk] for a in arrays]
        short = chunk - len(parts[0])
        if short:
            parts = [np.concatenate([p, np.zeros((short, *p.shape[1:]), p.dtype)]) for p in parts]
        out = fn(*parts)
        out = out if isinstance(out, tuple) else (out,)
        outs.append([np.asarray(o)[:chunk - short] for o in out])
    return [np.concatenate(col) for col in zip(*outs)]


def timed(fn, *args):
    """(fn(*args) as NumPy arrays, wall seconds): the result is materialised inside the clock."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def extractor(cache_dir=None):
    """The KID feature extractor (one per process and cache dir; building it loads or trains
    the classifier). cache_dir None: the data dir ($FLAXPORT_DATA, else ~/.cache/flaxport)."""
    from flaxport.data.download import default_data_dir

    return _extractor(str(cache_dir or default_data_dir()))


@functools.lru_cache(maxsize=4)
def _extractor(cache_dir: str):
    from flaxport.workloads.ddim import features

    return features.classifier_features(cache_dir)


def kid_score(samples: np.ndarray, real_u8: np.ndarray) -> float:
    """KID of samples float (N, H, W, C) in [0, 1] against real uint8 images (M, H, W, C)."""
    from flaxport.errors import UserError
    from flaxport.metrics.kid import kid

    if len(real_u8) < 2 or len(samples) < 2:
        raise UserError(f"KID needs at least 2 held-out images and 2 samples, got {len(real_u8)} and {len(samples)}")
    real = np.asarray(real_u8, np.float32) * np.float32(1 / 255)
    # One pass over both sets: the extractor compiles once per batch shape.
    both = extractor()(np.concatenate([np.asarray(samples, np.float32), real]))
    return float(kid(both[:len(samples)], both[len(samples):])[0])


def summarize(kid: float, val_loss, val_image_loss, sample_seconds: float, pictures):
    """(quality, artifacts {'samples': (n_samples, H, W, C) float in [0, 1]}) from per-example
    validation losses (N,) and the picture samples."""
    quality = {"kid": kid, "val_loss": float(np.mean(val_loss)), "val_image_loss": float(np.mean(val_image_loss)),
               "sample_seconds": round(sample_seconds, 4)}
    return quality, {"samples": np.asarray(pictures, np.float32)}
