"""The KID feature extractor for DDIM: the cnn workload's classifier, trained on digits.

No pretrained Inception can be fetched where flaxport is tested, so KID is computed on
the 256 penultimate activations (fc2's input) of the cnn workload's classifier, trained
once on the embedded digits (default config, seed 0) and cached. The numbers compare
runs that share this classifier, not published KIDs; `flaxport.metrics.kid` says how to
plug in an Inception instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from flaxport.metrics.kid import FeatureExtractor, flax_features

CLASSIFIER_EPOCHS = 5
CLASSIFIER_SIDE = 32  # the cnn's input size; other sizes are resized to it


def _cache_file(cache_dir: Path, config) -> Path:
    import dataclasses

    recipe = json.dumps({**dataclasses.asdict(config), "epochs": CLASSIFIER_EPOCHS, "seed": 0}, sort_keys=True)
    return cache_dir / "features" / f"cnn-digits-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.npz"


def _train(config):
    """variables {'params', 'batch_stats'} of the cnn trained on digits (a few seconds)."""
    from flaxport.harness import loop
    from flaxport.workloads import registry

    cnn = registry.get("cnn")
    with tempfile.TemporaryDirectory() as work:
        result = loop.train(cnn, config, workdir=Path(work) / "cnn", epochs=CLASSIFIER_EPOCHS,
                            data=cnn.load_data(config), checkpoints=False, progress=False, quiet=True)
    return {"params": result.state.params, "batch_stats": result.state.batch_stats}


def _flat(tree) -> dict:
    import jax

    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def classifier_variables(cache_dir=None, with_scale: bool = False):
    """(cnn module, variables[, feature scale]): loaded from the cache, else trained and
    cached atomically. The scale (see classifier_features) is cached beside the weights."""
    import jax

    from flaxport.data.download import default_data_dir
    from flaxport.workloads.cnn import config as cnn_config
    from flaxport.workloads.cnn import model as cnn_model
    from flaxport.workloads.cnn import step as cnn_step

    config = cnn_config.get_config("default")
    path = _cache_file(Path(cache_dir) if cache_dir else default_data_dir(), config)
    shapes = jax.eval_shape(lambda: cnn_step.init_state(config, jax.random.key(0)))
    template = {"params": shapes.params, "batch_stats": shapes.batch_stats}
    keys = list(_flat(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), template)))
    net = cnn_model.cnn(config)
    try:
        with np.load(path, allow_pickle=False) as z:
            leaves = [z[k] for k in keys]
            scale = np.float32(z[_SCALE]) if _SCALE in z.files else None
        variables = jax.tree.unflatten(jax.tree.structure(template), leaves)
    except (OSError, KeyError, ValueError):  # absent, or a damaged cache: train again
        variables = _train(config)
        scale = _scale(_raw_features(net, variables))
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **_flat(variables), **{_SCALE: scale})
        os.replace(tmp, path)
    if not with_scale:
        return net, variables
    return net, variables, (_scale(_raw_features(net, variables)) if scale is None else scale)


_SCALE = "feature_scale"  # a cache file written before the scale was cached lacks it: computed then


def _raw_features(net, variables):
    """The unscaled FeatureExtractor: fc2's input for images in [0, 1], resized to 32x32."""
    import jax
    import jax.numpy as jnp

    def preprocess(x):
        if x.shape[-1] == 1:
            x = jnp.repeat(x, 3, axis=-1)
        if x.shape[1:3] != (CLASSIFIER_SIDE, CLASSIFIER_SIDE):
            x = jax.image.resize(x, (x.shape[0], CLASSIFIER_SIDE, CLASSIFIER_SIDE, x.shape[-1]), "linear",
                                 antialias=True)
        return x

    return flax_features(net.apply, variables, layer="fc2", take="input", preprocess=preprocess,
                         apply_kwargs={"train": False})


def _scale(raw) -> np.float32:
    """The RMS activation over the digits training images."""
    from flaxport.data import digits

    reference = raw(digits.load(size=CLASSIFIER_SIDE, channels=3).train["image"] / np.float32(255))
    return np.float32(np.sqrt(np.mean(np.square(reference))))


def classifier_features(cache_dir=None) -> FeatureExtractor:
    """images float (N, H, W, C) in [0, 1], C 1 or 3 -> features float32 (N, 256).

    Scaled by one fixed number, the RMS activation over the digits training images, so
    x.y / D is of order 1 as with Inception's pooled features: KID's cubic kernel grows as
    the sixth power of the feature scale, and raw ReLU activations of ~10 give KIDs of 1e6.
    """
    net, variables, scale = classifier_variables(cache_dir, with_scale=True)
    raw = _raw_features(net, variables)
    return lambda images: raw(images) / scale
