"""Images that are not digits: the 11th class of the DDIM quality classifier.

A classifier trained on digits alone labels anything with confidence (it gave one digit
p >= 0.9 for 88% of uniform-noise images, and for 96% of the coloured noise a barely
trained diffusion model draws), so its confidence would not tell a digit from noise.
Trained with this class beside the ten digits, it answers "not a digit" for noise, colour
fields, blobs and two digits laid over each other, and keeps its confidence for real digits.

Everything is NumPy from a seed: the same images on every machine and framework.
"""
from __future__ import annotations

import numpy as np

NOT_A_DIGIT = 10  # the label of these images
RECIPE = 1  # changes whenever `images` draws differently: cached classifiers are retrained
KINDS = ("colour noise", "uniform noise", "low-frequency noise", "two digits blended", "two digits overlaid",
         "flat colour", "shuffled digit")


def _upscale(small: np.ndarray, side: int) -> np.ndarray:
    """(h, w, c) -> (side, side, c), bilinear (the digits' own resampling)."""
    from flaxport.data.digits import upscale

    return np.moveaxis(upscale(np.moveaxis(small, -1, 0), side), 0, -1)


def images(n: int, digits_u8: np.ndarray, labels: np.ndarray, seed: int) -> np.ndarray:
    """n non-digits, uint8 (n, H, W, 3), the kinds of KINDS in turn, made from a seed and
    (for the digit-based kinds) the digit images uint8 (N, H, W, 3) with their labels (N,)."""
    rng = np.random.default_rng(seed)
    side = digits_u8.shape[1]
    digits = digits_u8.astype(np.float32) / 255.0
    mean = digits.mean(axis=(0, 1, 2))
    out = np.empty((n, side, side, 3), np.float32)
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        channels = 3 if rng.random() < 0.7 else 1  # colour, or grey replicated
        if kind == "colour noise":  # N(mean, s^2) clipped, s from faint to saturating
            scale = np.exp(rng.uniform(np.log(0.05), np.log(5.0)))
            x = mean + scale * rng.standard_normal((side, side, channels))
        elif kind == "uniform noise":
            lo, hi = np.sort(rng.uniform(0, 1, 2))
            x = rng.uniform(lo, hi + 0.05, (side, side, channels))
        elif kind == "low-frequency noise":  # blobs: coarse noise, smoothly enlarged
            coarse = int(rng.choice([2, 3, 4, 6, 8]))
            x = mean + np.exp(rng.uniform(np.log(0.2), np.log(3.0))) * _upscale(
                rng.standard_normal((coarse, coarse, channels)), side)
        elif kind in ("two digits blended", "two digits overlaid"):
            a = rng.integers(len(digits))
            b = rng.choice(np.flatnonzero(labels != labels[a]))
            shift = rng.integers(-side // 8, side // 8 + 1, 2)
            other = np.roll(digits[b], tuple(shift), axis=(0, 1))
            w = rng.uniform(0.35, 0.65)
            x = w * digits[a] + (1 - w) * other if kind == "two digits blended" else np.maximum(digits[a], other)
        elif kind == "flat colour":
            x = np.broadcast_to(rng.uniform(0, 1, channels), (side, side, channels))
        else:  # a digit's pixels in random places: its brightness, no shape
            flat = digits[rng.integers(len(digits))].reshape(-1, 3)
            x = flat[rng.permutation(len(flat))].reshape(side, side, 3)
        out[i] = np.clip(np.broadcast_to(x, (side, side, 3)), 0.0, 1.0)
    return np.rint(out * 255).astype(np.uint8)
