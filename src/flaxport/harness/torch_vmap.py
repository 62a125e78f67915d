"""The PyTorch counterpart of harness.vmap: K members as one torch.func program (`torch-vmap`).

Each member starts as its torch-tuned run starts (`init_state(config, seed)`, fused
Adam), draws its torch-tuned run's data order and noise (the same NumPy permutation and
torch generator per (seed, stream, epoch)), and leaves the same workdir files (no
checkpoints: `compare` runs keep none). The members' modules are stacked with
`torch.func.stack_module_state`; the workload's `<torch twin>_vmap` module gives the
vmapped step. A workload without one has no torch-vmap run.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import os
import time
from pathlib import Path

import numpy as np

from flaxport.errors import TrainingDiverged, UserError
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import EpochLog, info, steps_per_epoch
from flaxport.harness.torch_loop import TUNED, stream_seed
from flaxport.harness.workdir import claim

NAME = "torch-vmap"


def twin_of(workload):
    """The workload's vectorised torch step module, or None."""
    try:
        return importlib.import_module(f"{workload.torch_twin}_vmap")
    except ModuleNotFoundError:
        return None


class Stack:
    """K twin states as stacked tensors {module: (params, buffers)} and one optimizer per
    twin optimizer, over the stacked parameters, with the twin's hyperparameters."""

    def __init__(self, torch, twin, vtwin, config, seeds: list):
        self.members = [twin.init_state(config, s, fused=True) for s in seeds]
        self.vtwin = vtwin
        first = self.members[0]
        self.models = {m: copy.deepcopy(getattr(first, m)).to("meta") for m in vtwin.MODULES}
        self.state = {m: torch.func.stack_module_state([getattr(ts, m) for ts in self.members])
                      for m in vtwin.MODULES}
        self.opts = {}
        for name, module in vtwin.OPTIMIZERS.items():
            group = getattr(first, name).param_groups[0]
            hyper = {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")}
            self.opts[name] = torch.optim.Adam(list(self.state[module][0].values()), fused=True, **hyper)
        self.train_step = vtwin.make_train_step(config, self.models)

    def write_back(self, torch, i: int):
        """Member i's twin state (for evaluation), its tensors copied from the stack."""
        ts = self.members[i]
        with torch.no_grad():
            for m in self.vtwin.MODULES:
                module = getattr(ts, m)
                params, buffers = self.state[m]
                for name, t in list(module.named_parameters()) + list(module.named_buffers()):
                    t.copy_((params if name in params else buffers)[name][i])
        return ts


def _threads(torch, stack: Stack, batch, noise, candidates=None, steps: int = 10) -> int:
    """The fastest torch thread count for the stacked step, timed on a throwaway copy."""
    candidates = candidates or sorted({1, os.cpu_count() or 1})
    best, best_seconds = candidates[0], float("inf")
    for n in candidates:
        torch.set_num_threads(n)
        state, opts = copy.deepcopy((stack.state, stack.opts))  # one copy: the optimizers keep their tensors
        for _ in range(2):
            stack.train_step(state, opts, batch, noise)
        t0 = time.perf_counter()
        for _ in range(steps):
            stack.train_step(state, opts, batch, noise)
        if time.perf_counter() - t0 < best_seconds:
            best, best_seconds = n, time.perf_counter() - t0
    return best


def train(workload, config, seeds: list, *, workdir, epochs: int | None = None, data=None, progress: bool = True,
          quiet: bool = False) -> list:
    """Train seeds as one torch.func program; one RunResult per member (the stack's epoch seconds)."""
    import torch

    twin = importlib.import_module(workload.torch_twin)
    vtwin = twin_of(workload)
    if vtwin is None:
        raise UserError(f"{workload.name} has no vectorised torch twin (torch-vmap): {workload.torch_twin}_vmap")
    epochs = config.epochs if epochs is None else epochs
    workdir = Path(workdir)
    identity = {"workload": workload.name, "framework": "torch"}
    options = dataclasses.replace(TUNED, name=NAME, channels_last=False)  # MLP twins: no memory format
    dirs = [workdir / f"seed{s}" for s in seeds]
    held = []  # every member's workdir is claimed (checked, locked) before any is written
    try:
        for d in dirs:
            held.append(claim(d, identity, resume=False, has_checkpoint=lambda w: False))
        for h, s in zip(held, seeds):
            h.commit({**dataclasses.asdict(config), "seed": s, "torch": dataclasses.asdict(options)})
        return _train_claimed(torch, twin, vtwin, workload, config, seeds, options, dirs, epochs=epochs, data=data,
                              quiet=quiet)
    finally:
        for h in reversed(held):
            h.release()


def _train_claimed(torch, twin, vtwin, workload, config, seeds, options, dirs, *, epochs, data, quiet) -> list:
    """train, once every member's workdir is claimed and its config.json written."""
    old_threads = torch.get_num_threads()
    try:
        stack = Stack(torch, twin, vtwin, config, seeds)
        bs, k = config.batch_size, len(seeds)
        steps = steps_per_epoch(data, bs)
        n = len(next(iter(data.train.values())))
        tensors = {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in data.train.items()}
        shape = vtwin.noise_shape(config)
        first = {name: t[:bs].expand((k,) + t[:bs].shape).contiguous() for name, t in tensors.items()}
        threads = _threads(torch, stack, first, torch.zeros((k,) + shape))
        torch.set_num_threads(threads)
        if not quiet:
            info(f"{NAME}: {threads} torch thread(s) measured fastest")
        logs = [EpochLog(d, steps, 0, progress=False, quiet=True) for d in dirs]
        dropped, epoch_seconds = {}, []
        qualities, artifacts = [{} for _ in seeds], [{} for _ in seeds]
        try:
            for epoch in range(epochs):
                t0 = time.perf_counter()
                perms = torch.from_numpy(np.stack([np.random.default_rng(stream_seed(s, "data", epoch)).permutation(n)
                                                   for s in seeds]))
                gens = [torch.Generator().manual_seed(stream_seed(s, "train", epoch)) for s in seeds]
                per_step = []
                for i in range(steps):
                    idx = perms[:, i * bs:(i + 1) * bs]
                    batch = {name: t[idx] for name, t in tensors.items()}
                    noise = torch.stack([torch.randn(shape, generator=g) for g in gens])
                    per_step.append(stack.train_step(stack.state, stack.opts, batch, noise))
                metrics = {name: torch.stack([m[name] for m in per_step]).numpy() for name in per_step[0]}
                seconds = time.perf_counter() - t0
                epoch_seconds.append(seconds)
                for i, s in enumerate(seeds):
                    if s in dropped:
                        continue
                    ev = (lambda i=i, s=s: twin.evaluate(config, stack.write_back(torch, i), data,
                                                         stream_seed(s, "eval")))
                    try:
                        qualities[i], artifacts[i] = logs[i].end(epoch, {m: v[:, i] for m, v in metrics.items()},
                                                                 seconds, seconds, ev)
                    except TrainingDiverged as e:
                        dropped[s] = str(e).split(";")[0]
                        if not quiet:
                            info(f"flaxport: warning: {NAME} member seed{s} dropped: {dropped[s]}")
                if len(dropped) == k:
                    raise TrainingDiverged(f"every {NAME} member diverged (seed {seeds[0]}: {dropped[seeds[0]]})")
                if not quiet:
                    info(f"{NAME} epoch {epoch + 1}/{epochs} | {k} members | {seconds:.2f} s")
        finally:
            for log in logs:
                log.close()
        settings = {**dataclasses.asdict(options), "threads": threads, "runner": "torch.func.vmap", "members": k}
        results = []
        for i, (s, d) in enumerate(zip(seeds, dirs)):
            if s not in dropped:
                workload.write_pictures(d, data, artifacts[i], f"{workload.name} {NAME} seed{s}, epoch {epochs}")
            results.append(RunResult(NAME, "torch", epoch_seconds, 0.0, qualities[i] if s not in dropped else {},
                                     logs[i].history, stack.members[i], artifacts[i],
                                     {**settings, "member": f"seed{s}", "dropped": dropped.get(s)}))
        return results
    finally:
        torch.set_num_threads(old_threads)
