"""DDIM quality, shared by the twins: fixed evaluation draws, chunked sampling, KID.

Every draw here comes from NumPy with fixed seeds, so both twins (and every epoch, and a
resumed run, and `flaxport evaluate`) sample from the same noise and score the same held-
out noise and times: a converted model gives the same numbers in either framework.

Quality per evaluation:
  kid             KID (flaxport.metrics.kid) between config.kid_images samples (EMA
                  network, kid_diffusion_steps) and the held-out images, on the features
                  of features.classifier_features (cached in the data dir); lower is better
  kid_floor       what real data scores on the same features: the root mean square KID of
                  config.kid_images training images against the held-out ones (over 100
                  draws); read kid as a multiple of it
  digit_confident_share  (digits only) share of the KID samples to which the same
                  classifier gives one digit a probability >= 0.9: samples a reader would
                  call a digit. The classifier has an 11th class, "not a digit" (junk.py),
                  so noise scores 0
  digit_classes_covered  (digits only) how many of the 10 digits hold at least 3% of the
                  KID samples (by the classifier's label): 10 when no digit is left out
  val_loss        noise MAE of the EMA network (eval mode) on the held-out images, fixed
                  noise and times (keras's n_loss on its validation set)
  val_image_loss  the image MAE of the same forward pass (keras's i_loss)
  sample_seconds  wall time of the n_samples pictures (plot_diffusion_steps steps), the
                  JAX compile excluded: a timing, so it differs between calls
Imports neither torch nor jax at module level.
"""
from __future__ import annotations

import functools
import hashlib
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


DIFFUSION_ROWS = 6  # samples shown along the reverse process in diffusion.png


def path_sampler(sample_path):
    """x (n, H, W, C) -> (images (n, H, W, C), path (n, steps + 1, H, W, C)) for in_chunks,
    from a sampler of the reverse process (steps + 1, n, H, W, C) whose last entry is the images."""
    def draw(x):
        path = np.asarray(sample_path(x))
        return path[-1], np.swapaxes(path, 0, 1)

    return draw


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


def _as_float(images_u8) -> np.ndarray:
    return np.asarray(images_u8, np.float32) * np.float32(1 / 255)


def kid_score(samples: np.ndarray, real_u8: np.ndarray) -> float:
    """KID of samples float (N, H, W, C) in [0, 1] against real uint8 images (M, H, W, C)."""
    from flaxport.errors import UserError
    from flaxport.metrics.kid import kid

    if len(real_u8) < 2 or len(samples) < 2:
        raise UserError(f"KID needs at least 2 held-out images and 2 samples, got {len(real_u8)} and {len(samples)}")
    # One pass over both sets: the extractor compiles once per batch shape.
    both = extractor()(np.concatenate([np.asarray(samples, np.float32), _as_float(real_u8)]))
    return float(kid(both[:len(samples)], both[len(samples):])[0])


FLOOR_DRAWS = 100
_FLOORS: dict = {}  # (train digest, test digest, n_images) -> kid_floor


def kid_floor(train_u8: np.ndarray, test_u8: np.ndarray, n_images: int) -> float:
    """What real data scores: the root mean square of the KIDs of FLOOR_DRAWS draws of
    n_images training images (without replacement; seed 0) against all the held-out
    images (uint8 (N, H, W, C)), the samples' KID measured on real images. Being
    unbiased, real data's KID is 0 on average, so this is the size of its scatter (plus
    any bias of the classifier towards the images it was trained on): the level below
    which a KID says nothing. Computed once per process and data."""
    from flaxport.metrics.kid import mmd2_unbiased

    key = (hashlib.sha1(np.ascontiguousarray(train_u8)).hexdigest(),
           hashlib.sha1(np.ascontiguousarray(test_u8)).hexdigest(), n_images)
    if key not in _FLOORS:
        n = min(n_images, len(train_u8))
        if n < 2 or len(test_u8) < 2:
            return float("nan")
        features = extractor()
        train, test = (np.asarray(features(_as_float(x)), np.float64) for x in (train_u8, test_u8))
        rng = np.random.default_rng(0)
        kids = [mmd2_unbiased(train[rng.choice(len(train), n, replace=False)], test) for _ in range(FLOOR_DRAWS)]
        _FLOORS[key] = float(np.sqrt(np.mean(np.square(kids))))
    return _FLOORS[key]


CONFIDENT_P = 0.9  # a sample is a recognisable digit when one class gets this probability
CLASS_SHARE = 0.03  # a digit is covered when this share of the samples is labelled with it


def digit_scores(samples: np.ndarray, cache_dir=None) -> dict:
    """{'digit_confident_share', 'digit_classes_covered'} of samples float (N, H, W, C) in [0, 1],
    from the KID classifier's probabilities (see the module docstring)."""
    from flaxport.data.download import default_data_dir
    from flaxport.workloads.ddim.junk import NOT_A_DIGIT

    probabilities = _probabilities(str(cache_dir or default_data_dir()))(samples)
    labels = probabilities.argmax(axis=1)  # NOT_A_DIGIT counts for no digit
    shares = np.bincount(labels, minlength=NOT_A_DIGIT + 1)[:NOT_A_DIGIT] / len(labels)
    return {"digit_confident_share": float(np.mean(probabilities[:, :NOT_A_DIGIT].max(axis=1) >= CONFIDENT_P)),
            "digit_classes_covered": int(np.sum(shares >= CLASS_SHARE))}


@functools.lru_cache(maxsize=4)
def _probabilities(cache_dir: str):
    from flaxport.workloads.ddim import features

    return features.classifier_probabilities(cache_dir)


def sample_scores(config, samples: np.ndarray, data) -> dict:
    """kid, kid_floor and, on digits, the digit scores of the KID samples (N, H, W, C) in [0, 1]."""
    unique = data.train["image"][:data.meta.get("n_unique_train")]  # without the repetitions
    scores = {"kid": kid_score(samples, data.test["image"]),
              "kid_floor": kid_floor(unique, data.test["image"], config.kid_images)}
    if config.data == "digits":
        scores.update(digit_scores(samples))
    return scores


def summarize(scores: dict, val_loss, val_image_loss, sample_seconds: float, pictures, path, about: dict):
    """(quality, artifacts) from sample_scores's dict, per-example validation losses (N,),
    the picture samples (n_samples, H, W, C) in [0, 1] and their reverse process
    (n_samples, steps + 1, H, W, C) (path_sampler). artifacts: 'samples', 'diffusion' (the
    first DIFFUSION_ROWS paths) and 'about' ({'framework', 'steps', 'weights'}: what
    plots.py writes in the titles)."""
    quality = {**scores, "val_loss": float(np.mean(val_loss)), "val_image_loss": float(np.mean(val_image_loss)),
               "sample_seconds": round(sample_seconds, 4)}
    artifacts = {"samples": np.asarray(pictures, np.float32),
                 "diffusion": np.asarray(path[:DIFFUSION_ROWS], np.float32), "about": about}
    return quality, artifacts
