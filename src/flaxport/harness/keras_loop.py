"""The Keras 3 twin of loop.py: same workdir files, same metrics, same RunResult.

Keras picks its backend once per process, at import: $KERAS_BACKEND, else jax here
(~/.keras/keras.json may name TensorFlow, which is rarely installed). The run is named
after it, `keras-jax` or `keras-torch`. The twin trains through Keras's own `fit`, one
call an epoch, on the data order and noise seeds the other loops use, so a resumed run
is exact. Checkpoints are NumPy archives of every Keras variable (weights, the noise
generator's state, the optimizer's slots), kept like every framework's (harness/store.py).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import time
from pathlib import Path

import numpy as np

from flaxport.errors import UserError
from flaxport.harness.lifecycle import Lifecycle
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import steps_per_epoch
from flaxport.harness.store import open_store
from flaxport.harness.torch_loop import stream_seed


def import_keras():
    """keras, on $KERAS_BACKEND or jax; refuses TensorFlow when it is not installed."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    backend = os.environ["KERAS_BACKEND"]
    if backend not in ("jax", "torch", "tensorflow", "numpy", "openvino"):
        raise UserError(f"KERAS_BACKEND={backend!r} is not a Keras backend; use jax or torch")
    try:
        import keras
    except ImportError as e:
        raise UserError(f"Keras on backend {backend} cannot be imported ({e}); pip install 'flaxport[keras]'") from e
    return keras


def twin_of(workload):
    if not workload.keras_twin:
        raise UserError(f"{workload.name} has no Keras twin; use --framework jax or torch")
    import_keras()
    return importlib.import_module(workload.keras_twin)


def checkpoint_store(workdir):
    """The Keras run's checkpoints, `workdir/checkpoints/epoch_N.npz` (harness/store.py)."""
    return open_store("keras", Path(workdir) / "checkpoints")


def train(workload, config, *, workdir, seed: int = 0, epochs: int | None = None, resume: bool = False,
          data=None, checkpoints: bool = True, progress: bool = True, quiet: bool = False,
          name: str | None = None) -> RunResult:
    """Train the Keras twin of `workload`; same files and result shape as loop.train."""
    twin = twin_of(workload)
    keras = import_keras()
    backend = keras.backend.backend()
    name = name or f"keras-{backend}"
    epochs = config.epochs if epochs is None else epochs
    store = checkpoint_store(workdir)
    with Lifecycle(workload, workdir, "keras", resume=resume, has_checkpoint=lambda w: store.latest() is not None,
                   quiet=quiet, saving=checkpoints) as life:
        ks = twin.init_state(config, seed)
        life.open(store)
        life.restore(ks, {**life.identity, "variant": config.variant, "seed": seed, "keras_backend": backend})
        start = life.start
        life.begin({**dataclasses.asdict(config), "seed": seed, "keras_backend": backend}, epochs)
        bs = config.batch_size
        steps = steps_per_epoch(data, bs)
        n = len(next(iter(data.train.values())))
        quality, artifacts = {}, {}

        def evaluate():
            return twin.evaluate(config, ks, data, stream_seed(seed, "eval"))

        with life.epochs(steps, progress) as log:
            for epoch in range(start, epochs):
                log.start(epoch, epochs)
                t0 = time.perf_counter()
                # The torch twin's order and the same partial-batch drop.
                order = np.random.default_rng(stream_seed(seed, "data", epoch)).permutation(n)[: steps * bs]
                step_metrics = twin.train_epoch(config, ks, {k: v[order] for k, v in data.train.items()},
                                                stream_seed(seed, "train", epoch), on_step=log.advance)
                seconds = time.perf_counter() - t0  # the first epoch includes Keras's jit compile
                quality, artifacts = log.end(epoch, step_metrics, seconds, seconds, evaluate)
                life.save(epoch + 1, ks.state_dict(), steps)
        quality, artifacts = life.finish(log, evaluate, data, name, quality, artifacts)
        settings = {"keras_backend": backend, "keras": keras.__version__, "jit_compile": _jit_compile(ks)}
        return RunResult(name, "keras", log.epoch_seconds, 0.0, quality, log.history, ks, artifacts, settings)


def _jit_compile(ks):
    return bool(getattr(ks.model, "jit_compile", False))
