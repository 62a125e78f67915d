"""Handwritten digits small enough to ship inside the package: the offline CNN/VAE dataset.

`digits_8x8.npz` is scikit-learn's bundled copy of the UCI "Optical Recognition of
Handwritten Digits" test set (optdigits.tes): 1797 greyscale 8x8 images, each pixel a
count 0..16 of set pixels in a 4x4 block of the original 32x32 bitmap; classes 0..9
(178, 182, 177, 183, 181, 182, 181, 179, 174, 180 images). It was written once from
`sklearn.datasets.load_digits()` (scikit-learn 1.9.1, BSD-3-Clause) as
images uint8 (1797, 8, 8) and labels uint8 (1797,), `np.savez_compressed`; scikit-learn
itself is not a dependency. tests/test_data.py pins the content hash.

Because these are tiny, `load` resamples them bilinearly (NumPy only, so the dataset is
byte-identical whichever framework consumes it) to the size a workload expects.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from flaxport.data import Dataset
from flaxport.errors import UserError

NPZ = Path(__file__).with_name("digits_8x8.npz")
CLASSES = [str(d) for d in range(10)]


def raw() -> tuple[np.ndarray, np.ndarray]:
    """The embedded data: images uint8 (1797, 8, 8) with values 0..16, labels int32 (1797,)."""
    try:
        with np.load(NPZ) as z:
            return z["images"], z["labels"].astype(np.int32)
    except (OSError, KeyError, ValueError) as e:
        # Only a broken install gets here (package data left out or damaged).
        raise UserError(f"digits: cannot read the embedded {NPZ} ({type(e).__name__}: {e}); reinstall flaxport") from e


def _weights(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float64 triangle-kernel weights with half-pixel centres.

    The same construction as `jax.image.scale_and_translate` (which `jax.image.resize`
    uses): sample centres at (i + 0.5) * n_in / n_out - 0.5; weights renormalised over the
    pixels that exist, which for upsampling is exactly bilinear with edge clamping
    (PIL, torch `align_corners=False`); when shrinking the kernel widens by the scale
    (antialiasing), as in jax and PIL.
    """
    scale = n_out / n_in
    kernel_scale = max(1.0 / scale, 1.0)
    centres = (np.arange(n_out) + 0.5) / scale - 0.5
    dist = np.abs(centres[:, None] - np.arange(n_in)[None, :]) / kernel_scale
    w = np.maximum(0.0, 1.0 - dist)
    total = w.sum(axis=1, keepdims=True)
    return w / np.where(total > 0, total, 1.0)


def upscale(images, size) -> np.ndarray:
    """Bilinear resampling of images (N, h, w) (any real dtype) to float32 (N, size, size).

    `size` is an int or an (height, width) pair. Matches `jax.image.resize(x, shape,
    'linear')` to float32 rounding (computed in float64); for upsampling that is also
    PIL's and torch's `interpolate(mode='bilinear', align_corners=False)`.
    """
    x = np.asarray(images, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"upscale expects images (N, h, w), got shape {x.shape}")
    out_h, out_w = (size, size) if np.isscalar(size) else size
    if out_h < 1 or out_w < 1:
        raise ValueError(f"upscale: size must be positive, got {size}")
    wh = _weights(x.shape[1], int(out_h))
    ww = _weights(x.shape[2], int(out_w))
    # Separable: rows then columns, one matrix product each.
    return np.einsum("ih,nhw,jw->nij", wh, x, ww, optimize=True).astype(np.float32)


def stratified_split(labels, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train_idx, test_idx): sorted int64 index arrays into `labels` (N,) that partition 0..N-1.

    Each class, in ascending label order, is shuffled by one `np.random.default_rng(seed)`
    and its first round(test_fraction * count) members go to test, so every class keeps
    the same share and the split depends only on (labels, test_fraction, seed).
    """
    labels = np.asarray(labels)
    if not 0.0 <= test_fraction <= 1.0:
        raise UserError(f"digits: test_fraction must be in [0, 1], got {test_fraction}")
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        n_test = int(round(test_fraction * len(members)))
        test.append(rng.permutation(members)[:n_test])
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    train_mask = np.ones(len(labels), bool)
    train_mask[test_idx] = False
    return np.flatnonzero(train_mask), test_idx.astype(np.int64)


def to_pixels(images, size, channels: int) -> np.ndarray:
    """8x8 counts (N, 8, 8) in 0..16 -> uint8 (N, size, size, channels) in 0..255, grey replicated."""
    # Scale after resampling so rounding happens once, on the final pixel grid (at the
    # native size the weights are the identity, so 8x8 stays exact).
    up = upscale(images, size).astype(np.float64)
    pixels = np.clip(np.rint(up * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    return np.ascontiguousarray(np.repeat(pixels[..., None], channels, axis=-1))


def load(size: int = 32, channels: int = 3, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The digits as NHWC uint8 images of size x size x channels, stratified train/test.

    train/test: {"image": uint8 (N, size, size, channels), "label": int32 (N,)};
    with the defaults 1438 train and 359 test images. meta: classes, source, n_train, n_test.
    """
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise UserError(f"digits: image size must be a positive integer, got {size!r}")
    if not isinstance(channels, (int, np.integer)) or channels < 1:
        raise UserError(f"digits: channels must be a positive integer, got {channels!r}")
    images, labels = raw()
    pixels = to_pixels(images, int(size), int(channels))
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    how = "no resampling" if size == 8 else f"bilinear to {size}x{size}"
    return Dataset(
        name="digits",
        train={"image": pixels[train_idx], "label": labels[train_idx]},
        test={"image": pixels[test_idx], "label": labels[test_idx]},
        meta={
            "classes": list(CLASSES),
            "source": f"scikit-learn 8x8 digits (embedded), {how}",
            "n_train": int(len(train_idx)),
            "n_test": int(len(test_idx)),
            "seed": seed,
        },
    )


def binarized(size: int = 28, threshold: float = 0.5, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The digits as 0/1 images for a Bernoulli VAE: the offline stand-in for binarized MNIST.

    Each 8x8 image is resampled bilinearly to size x size (`upscale`), scaled to [0, 1]
    (value / 16) and set to 1 where strictly above `threshold`. The split is `load`'s
    (same seed, same test_fraction, so the same images on each side).
    train/test: {"image": uint8 (N, size, size, 1) of 0/1, "label": int32 (N,)}; with the
    defaults 1438 train and 359 test images. meta: classes, source, n_train, n_test, seed, threshold.
    """
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise UserError(f"digits: image size must be a positive integer, got {size!r}")
    if not isinstance(threshold, (int, float, np.floating, np.integer)) or not 0.0 <= threshold < 1.0:
        raise UserError(f"digits: threshold must be a number in [0, 1), got {threshold!r}")
    images, labels = raw()
    # Dividing by 16 (a power of two) is exact: thresholding adds no rounding of its own.
    grey = upscale(images, int(size)).astype(np.float64) / 16.0
    bits = np.ascontiguousarray((grey > threshold).astype(np.uint8)[..., None])
    train_idx, test_idx = stratified_split(labels, test_fraction, seed)
    how = "no resampling" if size == 8 else f"bilinear to {size}x{size}"
    return Dataset(
        name="digits",
        train={"image": bits[train_idx], "label": labels[train_idx]},
        test={"image": bits[test_idx], "label": labels[test_idx]},
        meta={
            "classes": list(CLASSES),
            "source": f"scikit-learn 8x8 digits (embedded), {how}, binarized at {threshold:g}",
            "n_train": int(len(train_idx)),
            "n_test": int(len(test_idx)),
            "seed": seed,
            "threshold": float(threshold),
        },
    )
