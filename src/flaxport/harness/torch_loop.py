"""The PyTorch twin of loop.py: same workdir files, same metrics, same RunResult.

`TorchOptions` says how the loop runs, so one loop gives both baselines of a comparison:
  torch-eager: the seed article's way (per-step NumPy -> tensor, `.item()` every step,
               foreach Adam);
  torch-tuned: PyTorch at its best on a CPU (data converted once, fused Adam,
               zero_grad(set_to_none=True), no per-step sync, threads tuned).
Randomness is seeded per (seed, stream, epoch), so a resumed run is exact here too.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import time
import zlib
from pathlib import Path

import numpy as np

from flaxport.errors import TrainingDiverged
from flaxport.harness.lifecycle import Lifecycle
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import info, steps_per_epoch
from flaxport.harness.store import open_store


@dataclasses.dataclass(frozen=True)
class TorchOptions:
    name: str = "torch-eager"
    fused: bool = False  # fused Adam kernel
    set_to_none: bool = True  # zero_grad(set_to_none=...)
    sync_each_step: bool = True  # .item() on the losses every step, as the seed does
    preload: bool = False  # data as one tensor, indexed per step (vs NumPy -> tensor per step)
    threads: int | str | None = None  # torch.set_num_threads for the run; "auto" measures
    compile: bool = False  # torch.compile the models
    channels_last: bool = False  # NHWC memory format for conv models (oneDNN's fast path)


EAGER = TorchOptions()
TUNED = TorchOptions("torch-tuned", fused=True, set_to_none=True, sync_each_step=False, preload=True, threads="auto",
                     channels_last=True)
COMPILED = dataclasses.replace(TUNED, name="torch-compiled", compile=True)
VARIANTS = {"eager": EAGER, "tuned": TUNED, "compiled": COMPILED}


def stream_seed(seed: int, name: str, counter: int = 0) -> int:
    """A 63-bit seed for torch/NumPy generators from (seed, stream name, counter)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode()) * 7919 + counter) % (2**63 - 1)


def tune_threads(torch, twin, config, ts, batch, candidates=None, steps: int = 30) -> int:
    """The fastest torch thread count for this step, timed on a throwaway copy of `ts`."""
    import copy

    candidates = candidates or sorted({1, max(1, (os.cpu_count() or 1) // 2), os.cpu_count() or 1})
    best, best_seconds = candidates[0], float("inf")
    for n in candidates:
        torch.set_num_threads(n)
        scratch = copy.deepcopy(ts)
        gen = torch.Generator().manual_seed(0)
        for _ in range(5):  # warm-up: allocator, first-call paths
            twin.train_step(config, scratch, batch, gen)
        t0 = time.perf_counter()
        for _ in range(steps):
            twin.train_step(config, scratch, batch, gen)
        seconds = time.perf_counter() - t0
        if seconds < best_seconds:
            best, best_seconds = n, seconds
    return best


def checkpoint_store(workdir):
    """The torch run's checkpoints, `workdir/checkpoints/epoch_N.pt` (harness/store.py)."""
    return open_store("torch", Path(workdir) / "checkpoints")


def train(workload, config, *, workdir, seed: int = 0, epochs: int | None = None, resume: bool = False,
          data=None, options: TorchOptions = EAGER, checkpoints: bool = True, progress: bool = True,
          quiet: bool = False) -> RunResult:
    """Train the PyTorch twin of `workload`; same files and result shape as loop.train."""
    import torch

    twin = importlib.import_module(workload.torch_twin)
    epochs = config.epochs if epochs is None else epochs
    store = checkpoint_store(workdir)
    with Lifecycle(workload, workdir, "torch", resume=resume, has_checkpoint=lambda w: store.latest() is not None,
                   quiet=quiet, saving=checkpoints) as life, _thread_count_kept(torch):
        # Only conv twins take a memory format; the option means nothing to an MLP.
        takes_format = "channels_last" in inspect.signature(twin.init_state).parameters
        extra = {"channels_last": options.channels_last} if takes_format else {}
        ts = twin.init_state(config, seed, fused=options.fused, set_to_none=options.set_to_none, **extra)
        life.open(store)
        _, saved = life.restore(ts, {**life.identity, "variant": config.variant, "seed": seed})
        start = life.start
        # torch's reductions round differently with another thread count, so a resumed
        # run keeps the count its checkpoint was trained with: resume stays exact.
        if options.threads == "auto" and saved.get("threads"):
            threads = saved["threads"]
        elif options.threads == "auto":
            first = {k: torch.from_numpy(np.ascontiguousarray(v[: config.batch_size])) for k, v in data.train.items()}
            threads = tune_threads(torch, twin, config, ts, first)
            if not quiet:
                info(f"{options.name}: {threads} torch thread(s) measured fastest")
        else:
            threads = options.threads
        if threads:
            torch.set_num_threads(threads)
        if options.compile:
            twin.compile_models(ts)
        life.begin({**dataclasses.asdict(config), "seed": seed, "torch": dataclasses.asdict(options)}, epochs)
        arrays = data.train
        bs = config.batch_size
        steps = steps_per_epoch(data, bs)
        n = len(next(iter(arrays.values())))
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()} if options.preload else None
        quality, artifacts = {}, {}

        def evaluate():
            return twin.evaluate(config, ts, data, stream_seed(seed, "eval"))

        with life.epochs(steps, progress) as log:
            for epoch in range(start, epochs):
                log.start(epoch, epochs)
                t0 = time.perf_counter()
                perm = np.random.default_rng(stream_seed(seed, "data", epoch)).permutation(n)
                gen = torch.Generator().manual_seed(stream_seed(seed, "train", epoch))
                per_step = []
                if options.preload:
                    perm_t = torch.from_numpy(perm)
                for i in range(steps):
                    if options.preload:
                        idx = perm_t[i * bs:(i + 1) * bs]
                        batch = {k: t[idx] for k, t in tensors.items()}
                    else:
                        idx = perm[i * bs:(i + 1) * bs]
                        batch = {k: torch.from_numpy(v[idx]) for k, v in arrays.items()}  # the twin converts
                    try:
                        m = twin.train_step(config, ts, batch, gen)
                    except RuntimeError as e:  # torch's optimizers refuse a step float32 cannot hold
                        if "overflow" not in str(e):
                            raise
                        last = store.latest()
                        raise TrainingDiverged(
                            f"the update overflowed float32 at step {epoch * steps + i + 1} (epoch {epoch + 1}); "
                            f"training stopped, last good checkpoint: {f'epoch {last}' if last else 'none'} in "
                            f"{store.directory}") from e
                    per_step.append({k: v.item() for k, v in m.items()} if options.sync_each_step else m)
                    if (i + 1) % 200 == 0:
                        log.advance(200)
                if options.sync_each_step:
                    step_metrics = {k: np.array([m[k] for m in per_step]) for k in per_step[0]}
                else:
                    step_metrics = {k: torch.stack([m[k] for m in per_step]).numpy() for k in per_step[0]}
                seconds = time.perf_counter() - t0
                quality, artifacts = log.end(epoch, step_metrics, seconds, seconds, evaluate)
                life.save(epoch + 1, ts.state_dict(), steps, threads=torch.get_num_threads())
        quality, artifacts = life.finish(log, evaluate, data, options.name, quality, artifacts)
        settings = {**dataclasses.asdict(options), "threads": torch.get_num_threads(),
                    "channels_last": bool(extra.get("channels_last"))}  # only where the twin applies it
        return RunResult(options.name, "torch", log.epoch_seconds, 0.0, quality, log.history, ts, artifacts, settings)


@contextlib.contextmanager
def _thread_count_kept(torch):
    """torch's thread count as it was, on every way out of the run."""
    old = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(old)
