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
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import EpochLog, info, steps_per_epoch
from flaxport.harness.store import open_store
from flaxport.harness.torch_loop import stream_seed
from flaxport.harness.workdir import claim, write_pictures


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
    identity = {"workload": workload.name, "framework": "keras"}
    store = checkpoint_store(workdir)
    held = claim(workdir, identity, resume=resume, has_checkpoint=lambda w: store.latest() is not None)
    workdir = held.path
    try:
        ks = twin.init_state(config, seed)
        meta = {**identity, "variant": config.variant, "seed": seed, "keras_backend": backend}
        start = 0
        if resume and store.latest() is not None:
            _, saved = store.restore(ks, meta)  # refuses another run's checkpoint: nothing written yet
            start = int(saved["epochs_done"])
        if start < epochs:  # every check passed: from here on the run changes its workdir
            held.commit({**dataclasses.asdict(config), "seed": seed, "keras_backend": backend})
            store.clean_leftovers()
            for moved in store.set_aside_damaged():
                info(f"moved the damaged checkpoint to {moved}")
        if start and not quiet:
            info(f"resuming {workload.name} (keras) from epoch {start} in {workdir}")
        if start >= epochs and not quiet:
            info(f"{workdir} already holds {start} epochs; nothing to train (ask for more with --epochs)")
        bs = config.batch_size
        steps = steps_per_epoch(data, bs)
        n = len(next(iter(data.train.values())))
        quality, artifacts = {}, {}

        def evaluate():
            return twin.evaluate(config, ks, data, stream_seed(seed, "eval"))

        log = EpochLog(workdir, steps, start, progress, quiet)
        try:
            for epoch in range(start, epochs):
                log.start(epoch, epochs)
                t0 = time.perf_counter()
                # The torch twin's order and the same partial-batch drop.
                order = np.random.default_rng(stream_seed(seed, "data", epoch)).permutation(n)[: steps * bs]
                step_metrics = twin.train_epoch(config, ks, {k: v[order] for k, v in data.train.items()},
                                                stream_seed(seed, "train", epoch), on_step=log.advance)
                seconds = time.perf_counter() - t0  # the first epoch includes Keras's jit compile
                quality, artifacts = log.end(epoch, step_metrics, seconds, seconds, evaluate)
                if checkpoints:
                    store.save(epoch + 1, ks.state_dict(), {**meta, "epochs_done": epoch + 1},
                               step=(epoch + 1) * steps)
        finally:
            log.close()
        if not log.history:
            quality, artifacts = evaluate()
        write_pictures(workload, workdir, data, artifacts, f"{workload.name} {name}, epoch {max(start, epochs)}")
        settings = {"keras_backend": backend, "keras": keras.__version__, "jit_compile": _jit_compile(ks)}
        return RunResult(name, "keras", log.epoch_seconds, 0.0, quality, log.history, ks, artifacts, settings)
    finally:
        held.release()


def _jit_compile(ks):
    return bool(getattr(ks.model, "jit_compile", False))
