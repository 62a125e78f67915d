"""Kernel Inception Distance (Binkowski et al., "Demystifying MMD GANs", ICLR 2018).

KID is the unbiased estimate of the squared maximum mean discrepancy between two sets
of image features under the cubic polynomial kernel k(x, y) = (x.y / d + 1)^3, d the
feature width -- the kernel of the paper and of keras-io's DDIM example. Unlike FID it
is unbiased in the sample size, so small sets give fair (if noisy) numbers; being
unbiased, two samples of one distribution give values scattered around 0, slightly
negative ones included. Computed in NumPy float64: the three kernel means are O(1)
numbers whose small difference is the answer, too little for float32 to carry.

Features come from a pluggable extractor (`FeatureExtractor`: images -> (N, D)). The
paper and keras-io use ImageNet InceptionV3 (keras-io: images resized to 75x75, global
average pooled, D = 2048). No pretrained Inception ships with flaxport or can be fetched
where its tests run, so the DDIM workload takes the penultimate layer of a classifier
it trains itself (`flax_features`); such numbers compare runs that share that classifier,
not published KIDs. To use Inception, pass any callable of the same shape, e.g. with
Keras 3:

    inc = keras.applications.InceptionV3(include_top=False, weights="imagenet",
                                         pooling="avg", input_shape=(75, 75, 3))
    def inception(images):  # float [0, 1] (N, H, W, 3) -> (N, 2048)
        x = keras.ops.image.resize(images * 255.0, (75, 75), antialias=True)
        return keras.ops.convert_to_numpy(inc(keras.applications.inception_v3.preprocess_input(x)))
"""
from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

SUBSET_SIZE = 1000  # the paper's (and torch-fidelity's, clean-fid's) subset size and count
N_SUBSETS = 100


class FeatureExtractor(Protocol):
    """images float32 (N, H, W, C) NHWC in [0, 1] -> features (N, D), one row per image."""

    def __call__(self, images: np.ndarray) -> np.ndarray: ...


def _features(x, name: str) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or len(x) < 2 or x.shape[1] < 1:
        raise ValueError(f"kid: {name} must be features (N, D) with N >= 2, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"kid: {name} holds NaN or inf")
    return x


def polynomial_kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(m, D), (n, D) -> (m, n) matrix of (x_i . y_j / D + 1)^3."""
    t = x @ y.T / x.shape[1] + 1.0
    return t * t * t  # two multiplies; ** 3 goes through pow, several times slower


def mmd2_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased MMD^2 of samples x (m, D) and y (n, D), m, n >= 2 (sizes may differ).

    mean_{i != j} k(x_i, x_j) + mean_{i != j} k(y_i, y_j) - 2 mean_{i, j} k(x_i, y_j):
    the within-set means leave out the diagonal (a point against itself), which is what
    removes the bias.
    """
    m, n = len(x), len(y)
    kxx, kyy = polynomial_kernel(x, x), polynomial_kernel(y, y)
    within_x = (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
    within_y = (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
    return float(within_x + within_y - 2.0 * polynomial_kernel(x, y).mean())


def kid(features_a, features_b, *, subset_size: int | None = None, n_subsets: int = N_SUBSETS,
        seed: int = 0) -> tuple[float, float]:
    """(mean, std) of KID between features_a (N_a, D) and features_b (N_b, D).

    subset_size None: when neither set exceeds SUBSET_SIZE rows, one estimate on the
    whole sets, std 0.0 (exactly symmetric in a, b); otherwise as subset_size =
    min(SUBSET_SIZE, N_a, N_b). An int s: n_subsets times, draw s rows of each set without
    replacement (np.random.default_rng(seed), a's rows first) and take the mean and the
    std (ddof 0) of the per-subset estimates, as the paper's code does. keras-io's
    per-batch KID averaged over the validation set is close to subset_size=batch size.
    """
    a, b = _features(features_a, "features_a"), _features(features_b, "features_b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"kid: feature widths differ: {a.shape[1]} and {b.shape[1]}")
    if subset_size is None:
        if max(len(a), len(b)) <= SUBSET_SIZE:
            return mmd2_unbiased(a, b), 0.0
        subset_size = min(SUBSET_SIZE, len(a), len(b))
    if not 2 <= subset_size <= min(len(a), len(b)):
        raise ValueError(f"kid: subset_size must be in 2..{min(len(a), len(b))} (the smaller set), got {subset_size}")
    if n_subsets < 1:
        raise ValueError(f"kid: n_subsets must be >= 1, got {n_subsets}")
    rng = np.random.default_rng(seed)
    estimates = []
    for _ in range(n_subsets):
        ia = rng.choice(len(a), subset_size, replace=False)
        ib = rng.choice(len(b), subset_size, replace=False)
        estimates.append(mmd2_unbiased(a[ia], b[ib]))
    return float(np.mean(estimates)), float(np.std(estimates))


def kid_images(extractor: FeatureExtractor, images_a, images_b, **kwargs) -> tuple[float, float]:
    """KID of two image sets, each float (N, H, W, C) in [0, 1], through `extractor`; kwargs go to `kid`."""
    return kid(extractor(images_a), extractor(images_b), **kwargs)


def flax_features(apply_fn: Callable, variables, *, layer: str | None = None, take: str = "input",
                  batch_size: int = 256, preprocess: Callable | None = None,
                  apply_kwargs: dict | None = None) -> FeatureExtractor:
    """A FeatureExtractor from a Flax (linen) classifier: the activations at one of its layers.

    apply_fn(variables, images, **apply_kwargs) runs the model (usually `model.apply`;
    pass e.g. apply_kwargs={"train": False} so BatchNorm uses its running statistics).
    layer None takes the input of the last nn.Dense the model calls -- for a classifier
    ending in a Dense head, its penultimate activations. Otherwise `layer` names a
    submodule by its path, '/'-joined ("Dense_0", "block/conv"), and `take` says whether
    its "input" (first argument) or "output" is the feature; a module called more than
    once gives its last call. preprocess (jnp, inside jit) maps the [0, 1] images to what
    the model expects (its normalisation, its input size via jax.image.resize). Returns a
    callable images (N, H, W, C) -> float32 (N, D), each example's activations flattened;
    it runs jitted in batches of batch_size, the last padded with zeros so one shape
    compiles once (harmless in inference mode, where examples do not interact).
    """
    import jax
    import jax.numpy as jnp
    import flax.linen as nn

    if take not in ("input", "output"):
        raise ValueError(f"flax_features: take must be 'input' or 'output', got {take!r}")
    kwargs = dict(apply_kwargs or {})

    def capture(variables, x):
        hits, called = [], []

        def interceptor(next_fun, args, kw, ctx):
            out = next_fun(*args, **kw)
            path = "/".join(ctx.module.path)
            if ctx.method_name == "__call__" and path:
                called.append(path)
                if (path == layer) if layer is not None else isinstance(ctx.module, nn.Dense):
                    hits.append(out if take == "output" else (args[0] if args else next(iter(kw.values()))))
            return out

        if preprocess is not None:
            x = preprocess(x)
        with nn.intercept_methods(interceptor):
            apply_fn(variables, x, **kwargs)
        if not hits:
            what = f"no submodule '{layer}' was called" if layer is not None else "the model called no nn.Dense"
            raise ValueError(f"flax_features: {what}; called: {', '.join(dict.fromkeys(called)) or 'nothing'}")
        return hits[-1].reshape(x.shape[0], -1).astype(jnp.float32)

    run = jax.jit(capture)

    def extract(images) -> np.ndarray:
        images = np.asarray(images, np.float32)
        if images.ndim != 4:
            raise ValueError(f"flax_features: images must be (N, H, W, C), got shape {images.shape}")
        size = max(1, min(batch_size, len(images)))  # a small set is not padded up to a whole batch
        out = []
        for start in range(0, len(images), size):
            chunk = images[start:start + size]
            pad = size - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
            out.append(np.asarray(run(variables, chunk))[: size - pad])
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    return extract
