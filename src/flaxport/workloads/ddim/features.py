"""The DDIM quality classifier: the cnn workload's network, trained on digits and non-digits.

No pretrained Inception can be fetched where flaxport is tested, so KID is computed on
the 256 penultimate activations (fc2's input) of the cnn workload's classifier (default
config, seed 0, 11 classes), trained once on the embedded digits plus junk.py's
non-digits (the 11th class) and cached. Its probabilities give the digit scores
(quality.digit_scores). The numbers compare runs that share this classifier, not
published KIDs; `flaxport.metrics.kid` says how to plug in an Inception instead.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from flaxport.metrics.kid import FeatureExtractor, flax_features
from flaxport.workloads.ddim import junk

CLASSIFIER_EPOCHS = 2
CLASSIFIER_SIDE = 32  # the cnn's input size; other sizes are resized to it
SIDES = (32, 16, 8)  # the digits at the sizes the ddim variants draw them, for training


JUNK_SHARE = 0.25  # non-digits added to each split, as a share of its digits


def _config():
    """The cnn default config with an 11th class, "not a digit" (junk.NOT_A_DIGIT)."""
    import dataclasses

    from flaxport.workloads.cnn import config as cnn_config

    return dataclasses.replace(cnn_config.get_config("default"), num_classes=junk.NOT_A_DIGIT + 1)


def _cache_file(cache_dir: Path, config) -> Path:
    import dataclasses

    recipe = json.dumps({**dataclasses.asdict(config), "epochs": CLASSIFIER_EPOCHS, "seed": 0,
                         "junk": [junk.RECIPE, JUNK_SHARE], "sides": SIDES}, sort_keys=True)
    return cache_dir / "features" / f"cnn-digits-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.npz"


def training_data(config):
    """The digits at every side in SIDES, each resized to 32x32 as the classifier's input
    is (_preprocess), with junk.images (drawn at the same side) added to each split under
    label NOT_A_DIGIT. A 16x16 digit enlarged to 32 is blurrier than the 32x32 digit made
    from the same 8x8 scan: trained on 32x32 alone, the classifier was sure of 95% of the
    held-out digits at 32 and 8, and of 83% at 16."""
    import jax

    from flaxport.data import digits
    from flaxport.workloads import registry

    data = registry.get("cnn").load_data(config)  # the 32x32 digits: its meta, and the first side
    enlarge = jax.jit(_preprocess)
    parts = {"train": [], "test": []}
    for k, side in enumerate(SIDES):
        source = data if side == CLASSIFIER_SIDE else digits.load(size=side, channels=3)
        for j, name in enumerate(parts):
            split = getattr(source, name)
            n = int(round(JUNK_SHARE * len(split["label"])))
            images = np.concatenate([split["image"], junk.images(n, split["image"], split["label"], 2 * k + j)])
            if side != CLASSIFIER_SIDE:
                images = np.rint(np.asarray(enlarge(images / np.float32(255))) * 255).astype(np.uint8)
            labels = np.concatenate([split["label"], np.full(n, junk.NOT_A_DIGIT, split["label"].dtype)])
            parts[name].append((images, labels))
    for name, pieces in parts.items():
        setattr(data, name, {"image": np.concatenate([p[0] for p in pieces]),
                             "label": np.concatenate([p[1] for p in pieces])})
    data.meta = {**data.meta, "classes": [*data.meta["classes"], "not a digit"]}
    return data


def _train(config):
    """variables {'params', 'batch_stats'} of the cnn trained on training_data (a few seconds)."""
    from flaxport.harness import loop
    from flaxport.workloads import registry

    with tempfile.TemporaryDirectory() as work:
        result = loop.train(registry.get("cnn"), config, workdir=Path(work) / "cnn", epochs=CLASSIFIER_EPOCHS,
                            data=training_data(config), checkpoints=False, progress=False, quiet=True)
    return {"params": result.state.params, "batch_stats": result.state.batch_stats}


def _flat(tree) -> dict:
    import jax

    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def classifier_variables(cache_dir=None, with_scale: bool = False):
    """(cnn module, variables[, feature scale]): loaded from the cache, else trained and
    cached atomically. The scale (see classifier_features) is cached beside the weights."""
    import jax

    from flaxport.data.download import default_data_dir
    from flaxport.workloads.cnn import model as cnn_model
    from flaxport.workloads.cnn import step as cnn_step

    config = _config()
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


def _preprocess(x):
    """Images (N, H, W, C) in [0, 1], C 1 or 3 -> (N, 32, 32, 3), what the classifier takes."""
    import jax
    import jax.numpy as jnp

    if x.shape[-1] == 1:
        x = jnp.repeat(x, 3, axis=-1)
    if x.shape[1:3] != (CLASSIFIER_SIDE, CLASSIFIER_SIDE):
        x = jax.image.resize(x, (x.shape[0], CLASSIFIER_SIDE, CLASSIFIER_SIDE, x.shape[-1]), "linear", antialias=True)
    return x


def _raw_features(net, variables):
    """The unscaled FeatureExtractor: fc2's input for images in [0, 1], resized to 32x32."""
    return flax_features(net.apply, variables, layer="fc2", take="input", preprocess=_preprocess,
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


def classifier_probabilities(cache_dir=None, batch_size: int = 256):
    """images float (N, H, W, C) in [0, 1], C 1 or 3 -> float32 (N, 11): the same
    classifier's probabilities of the digits 0..9 and of "not a digit" (column 10), in
    eval mode (running BN statistics)."""
    import jax

    net, variables = classifier_variables(cache_dir)
    run = jax.jit(lambda v, x: jax.numpy.exp(net.apply(v, _preprocess(x), train=False)))

    def probabilities(images) -> np.ndarray:
        images = np.asarray(images, np.float32)
        size = max(1, min(batch_size, len(images)))
        out = []
        for start in range(0, len(images), size):  # the last chunk zero-padded: one compile
            chunk = images[start:start + size]
            pad = size - len(chunk)
            if pad:
                chunk = np.concatenate([chunk, np.zeros((pad, *chunk.shape[1:]), chunk.dtype)])
            out.append(np.asarray(run(variables, chunk))[:size - pad])
        return np.concatenate(out)

    return probabilities
