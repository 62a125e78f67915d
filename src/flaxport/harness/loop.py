"""The one Flax training loop: epochs, evaluation, checkpoints, metrics, progress.

Every workload runs through `train`; it talks only to the Workload record.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import jax

from flaxport.harness import rng
from flaxport.harness.distributed import ShareFeed, make_placement
from flaxport.harness.epoch import ResidentFeed, make_runner
from flaxport.harness.metrics import EpochLog, info, steps_per_epoch
from flaxport.harness.store import open_store
from flaxport.harness.workdir import claim, write_pictures


@dataclasses.dataclass
class RunResult:
    """What a run leaves besides its workdir; `compare` builds its report from these."""

    name: str
    framework: str
    epoch_seconds: list  # wall time of every epoch run here, first one included
    compile_seconds: float  # ahead-of-time compile (jax); 0 for eager torch
    quality: dict
    history: list
    state: Any = None
    artifacts: dict = dataclasses.field(default_factory=dict)
    settings: dict = dataclasses.field(default_factory=dict)  # how it ran: runner, threads, ...


def _has_orbax_checkpoint(workdir: Path) -> bool:
    ckpt = workdir / "checkpoints"
    return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def train(workload, config, *, workdir, seed: int = 0, epochs: int | None = None, runner: str | None = None,
          resume: bool = False, data=None, checkpoints: bool = True, progress: bool = True,
          name: str | None = None, quiet: bool = False, devices: int | None = None,
          init_state=None) -> RunResult:
    """Train `workload` in Flax for `epochs` (default config.epochs) and return a RunResult.

    data: a flaxport.data.Dataset (loaded by the caller, so a comparison shares one).
    runner: "step" (jit per step) or "scan" (scan-fused epoch); default config.runner.
    devices: how many devices to train data-parallel on (default: every visible one,
    across all processes of a multi-process run); config.batch_size is the global batch.
    init_state(config, key) -> state replaces workload.init_state for a fresh start (e.g.
    weights from a torch checkpoint); a resumed run restores its checkpoint as usual.
    """
    epochs = config.epochs if epochs is None else epochs
    runner_kind = runner or config.runner
    name = name or f"jax-{runner_kind}"
    place = make_placement(devices, config.batch_size)
    quiet = quiet or not place.is_main  # one process speaks and writes files
    identity = {"workload": workload.name, "framework": "jax"}
    workdir = Path(workdir)
    held = claim(workdir, identity, resume=resume, has_checkpoint=_has_orbax_checkpoint, write=place.is_main)
    ckpt = None
    try:
        local_keys = rng.streams(seed)
        state = (init_state or workload.init_state)(config, local_keys["init"])
        keys = place.replicate(local_keys)
        meta = {**identity, "variant": config.variant, "seed": seed}
        ckpt = open_store("jax", workdir / "checkpoints", placement=place) if checkpoints else None
        start, resumed = 0, False
        if resume and ckpt is not None and ckpt.latest() is not None:
            state, saved = ckpt.restore(state, meta)  # refuses another run's checkpoint: nothing written yet
            start, resumed = int(saved["epochs_done"]), True
        else:
            state = place.replicate(state)
        steps = steps_per_epoch(data, config.batch_size)
        if place.multi_process:
            feed = ShareFeed(data.train, config.batch_size, steps, place, local_keys["data"])
        else:
            feed = ResidentFeed(jax.device_put(data.train, place.replicated()), config.batch_size, steps,
                                place.batch_sharding())
        run = make_runner(runner_kind, workload.make_train_step(config), steps, feed, place)
        compile_seconds = run.compile(state, feed.spec(), keys) if start < epochs else 0.0
        if start < epochs:  # every check passed: from here on the run changes its workdir
            held.commit({**dataclasses.asdict(config), "seed": seed, "runner": runner_kind})
            if ckpt is not None:
                ckpt.clean_leftovers()
                for moved in ckpt.set_aside_damaged():
                    info(f"moved the damaged checkpoint to {moved}")
        if resumed and not quiet:
            info(f"resuming {workload.name} from epoch {start} in {workdir}")
        if start >= epochs and not quiet:
            info(f"{workdir} already holds {start} epochs; nothing to train (ask for more with --epochs)")
        quality, artifacts = {}, {}

        def evaluate():
            if not place.is_main:  # quality is reported (and pictures drawn) once
                return {}, {}
            return workload.evaluate(config, place.local(state), data, rng.at(local_keys["eval"], 0))

        log = EpochLog(workdir, steps, start, progress and not quiet, quiet, write=place.is_main)
        try:
            for epoch in range(start, epochs):
                log.start(epoch, epochs)
                t0 = time.perf_counter()
                state, step_metrics = run.run_epoch(state, feed.inputs(epoch), keys, epoch, on_step=log.advance)
                run_seconds = time.perf_counter() - t0
                first = {"compile_seconds": compile_seconds} if epoch == start else {}
                quality, artifacts = log.end(epoch, step_metrics, run_seconds + first.get("compile_seconds", 0.0),
                                             run_seconds, evaluate, **first)
                if ckpt is not None:
                    ckpt.save(epoch + 1, state, {**meta, "epochs_done": epoch + 1}, step=(epoch + 1) * steps)
        finally:
            log.close()
        if not log.history:  # nothing trained (resumed a finished run): still report its quality
            quality, artifacts = evaluate()
        if place.is_main:
            write_pictures(workload, workdir, data, artifacts, f"{workload.name} {name}, epoch {max(start, epochs)}")
        settings = {"runner": runner_kind, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                    "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
                    "devices": place.devices, "processes": place.processes}
        return RunResult(name, "jax", log.epoch_seconds, compile_seconds, quality, log.history, place.local(state),
                         artifacts, settings)
    finally:
        # Orbax runs a background event loop: close it on every path, errors included.
        if ckpt is not None:
            ckpt.close()
        held.release()
