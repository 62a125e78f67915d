"""The Keras 3 twin of loop.py: same workdir files, same metrics, same RunResult.

Keras picks its backend once per process, at import: $KERAS_BACKEND, else jax here
(~/.keras/keras.json may name TensorFlow, which is rarely installed). The run is named
after it, `keras-jax` or `keras-torch`. The twin trains through Keras's own `fit`, one
call an epoch, on the data order and noise seeds the other loops use, so a resumed run
is exact. Checkpoints are NumPy archives of every Keras variable (weights, the noise
generator's state, the optimizer's slots), written atomically like torch's.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import time
from pathlib import Path

import numpy as np

from flaxport.errors import UserError
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import EpochLog, info, steps_per_epoch
from flaxport.harness.torch_loop import latest, read_file, save_file, stream_seed
from flaxport.harness.workdir import prepare

SUFFIX = ".npz"


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


def _write(payload: dict):
    def write(tmp):
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a path
            np.savez(f, __meta__=np.array(json.dumps(payload["meta"])), **payload["state"])
    return write


def _read(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {"meta": json.loads(str(z["__meta__"])), "state": {k: z[k] for k in z.files if k != "__meta__"}}


def load_checkpoint(workdir, expect_meta: dict):
    """(epochs_done, {"meta", "state"}) of the newest Keras checkpoint, meta checked; None if none."""
    return read_file(workdir, expect_meta, _read, SUFFIX)


def restore(ks, payload: dict, workdir) -> None:
    try:
        ks.load_state_dict(payload["state"])
    except ValueError as e:
        raise UserError(f"checkpoint in {Path(workdir) / 'checkpoints'} does not fit this model: {e}") from e


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
    workdir = prepare(workdir, identity, {**dataclasses.asdict(config), "seed": seed, "keras_backend": backend},
                      resume, lambda w: latest(w, SUFFIX) is not None)
    ks = twin.init_state(config, seed)
    meta = {**identity, "variant": config.variant, "seed": seed, "keras_backend": backend}
    start = 0
    found = load_checkpoint(workdir, meta) if resume else None
    if found is not None:
        start, payload = found
        restore(ks, payload, workdir)
        if not quiet:
            info(f"resuming {workload.name} (keras) from epoch {start} in {workdir}")
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
                payload = {"state": ks.state_dict(), "meta": {**meta, "epochs_done": epoch + 1}}
                save_file(workdir, epoch + 1, _write(payload), SUFFIX)
    finally:
        log.close()
    if not log.history:
        quality, artifacts = evaluate()
    workload.write_pictures(workdir, data, artifacts, f"{workload.name} {name}, epoch {max(start, epochs)}")
    settings = {"keras_backend": backend, "keras": keras.__version__, "jit_compile": _jit_compile(ks)}
    return RunResult(name, "keras", log.epoch_seconds, 0.0, quality, log.history, ks, artifacts, settings)


def _jit_compile(ks):
    return bool(getattr(ks.model, "jit_compile", False))
