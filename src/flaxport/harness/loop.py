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
from flaxport.harness.lifecycle import Lifecycle
from flaxport.harness.metrics import steps_per_epoch
from flaxport.harness.store import open_store


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
    with Lifecycle(workload, workdir, "jax", resume=resume, has_checkpoint=_has_orbax_checkpoint, quiet=quiet,
                   write=place.is_main) as life:
        local_keys = rng.streams(seed)
        state = (init_state or workload.init_state)(config, local_keys["init"])
        keys = place.replicate(local_keys)
        if checkpoints:
            life.open(open_store("jax", life.workdir / "checkpoints", placement=place))
        state, saved = life.restore(state, {**life.identity, "variant": config.variant, "seed": seed})
        if not saved:
            state = place.replicate(state)
        start = life.start
        steps = steps_per_epoch(data, config.batch_size)
        if place.multi_process:
            feed = ShareFeed(data.train, config.batch_size, steps, place, local_keys["data"])
        else:
            feed = ResidentFeed(jax.device_put(data.train, place.replicated()), config.batch_size, steps,
                                place.batch_sharding())
        run = make_runner(runner_kind, workload.make_train_step(config), steps, feed, place)
        compile_seconds = run.compile(state, feed.spec(), keys) if start < epochs else 0.0
        life.begin({**dataclasses.asdict(config), "seed": seed, "runner": runner_kind}, epochs)
        quality, artifacts = {}, {}

        def evaluate():
            if not place.is_main:  # quality is reported (and pictures drawn) once
                return {}, {}
            return workload.evaluate(config, place.local(state), data, rng.at(local_keys["eval"], 0))

        with life.epochs(steps, progress) as log:
            for epoch in range(start, epochs):
                log.start(epoch, epochs)
                t0 = time.perf_counter()
                state, step_metrics = run.run_epoch(state, feed.inputs(epoch), keys, epoch, on_step=log.advance)
                run_seconds = time.perf_counter() - t0
                first = {"compile_seconds": compile_seconds} if epoch == start else {}
                quality, artifacts = log.end(epoch, step_metrics, run_seconds + first.get("compile_seconds", 0.0),
                                             run_seconds, evaluate, **first)
                life.save(epoch + 1, state, steps)
        quality, artifacts = life.finish(log, evaluate, data, name, quality, artifacts)
        settings = {"runner": runner_kind, "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                    "jax_threefry_partitionable": bool(jax.config.jax_threefry_partitionable),
                    "devices": place.devices, "processes": place.processes}
        return RunResult(name, "jax", log.epoch_seconds, compile_seconds, quality, log.history, place.local(state),
                         artifacts, settings)
