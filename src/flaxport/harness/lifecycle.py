"""A training run's life over its workdir, one for the Flax, PyTorch and Keras loops.

The workdir's rule (workdir.py) kept in one place: a run checks everything first, then
changes the workdir. In the order a loop uses it:

    with Lifecycle(workload, workdir, "torch", resume=resume, has_checkpoint=...) as run:
        run.open(store)                      # the run's checkpoints (closed with the run)
        state, saved = run.restore(state, meta)  # a resumed run's checkpoint, checked against meta
        ...                                  # the loop's own checks (thread count, compile)
        run.begin(settings, epochs)          # config.json; leftovers cleaned, damage set aside
        with run.epochs(steps, progress) as log:
            for epoch in range(run.start, epochs):
                ...                          # one epoch, then log.end(...)
                run.save(epoch + 1, state, steps)
        quality, artifacts = run.finish(log, evaluate, data, run_name, quality, artifacts)
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from flaxport.harness.metrics import EpochLog, info
from flaxport.harness.workdir import claim, write_pictures


class Lifecycle:
    """Claims `workdir` for one run of `workload` in `framework` (jax, torch or keras).

    has_checkpoint(workdir) -> bool: whether the workdir already holds this framework's
    checkpoints (a run that does not resume refuses them). write: False in every process but
    the first of a multi-process run. saving: False keeps no checkpoints (a resumed run still
    reads them).
    """

    def __init__(self, workload, workdir, framework: str, *, resume: bool, has_checkpoint, quiet: bool = False,
                 write: bool = True, saving: bool = True):
        self.workload, self.framework = workload, framework
        self.identity = {"workload": workload.name, "framework": framework}
        self.resume, self.quiet, self.write, self.saving = resume, quiet, write, saving
        self.held = claim(Path(workdir), self.identity, resume=resume, has_checkpoint=has_checkpoint, write=write)
        self.workdir = self.held.path
        self.store = None
        self.meta: dict = {}
        self.start = 0  # epochs done before this run
        self.epochs_asked = 0  # the epochs the run is to have done (begin)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self.store is not None:  # Orbax runs a background event loop: closed on every path
                self.store.close()
        finally:
            self.held.release()

    def open(self, store) -> None:
        """Keep `store` as the run's checkpoints."""
        self.store = store

    def restore(self, state, meta: dict):
        """(state, the checkpoint's metadata) of the latest checkpoint where the run resumes, else
        (state, {}). Refuses another run's checkpoint (meta differs): nothing is written yet."""
        self.meta = meta
        if not (self.resume and self.store is not None and self.store.latest() is not None):
            return state, {}
        state, saved = self.store.restore(state, meta)
        self.start = int(saved["epochs_done"])
        return state, saved

    def begin(self, settings: dict, epochs: int) -> None:
        """Every check passed: from here on the run changes its workdir (settings -> config.json)."""
        self.epochs_asked = epochs
        if self.start < epochs:
            self.held.commit(settings)
            if self.store is not None:
                self.store.clean_leftovers()
                for moved in self.store.set_aside_damaged():
                    info(f"moved the damaged checkpoint to {moved}")
        if self.quiet:
            return
        if self.start:
            says = "" if self.framework == "jax" else f" ({self.framework})"
            info(f"resuming {self.workload.name}{says} from epoch {self.start} in {self.workdir}")
        if self.start >= epochs:
            info(f"{self.workdir} already holds {self.start} epochs; nothing to train (ask for more with --epochs)")

    @contextlib.contextmanager
    def epochs(self, steps: int, progress: bool):
        """The EpochLog of the epochs run here (metrics.jsonl continued after a resume), closed on exit."""
        log = EpochLog(self.workdir, steps, self.start, progress, self.quiet, write=self.write)
        try:
            yield log
        finally:
            log.close()

    def save(self, epochs_done: int, state, steps: int, **meta) -> None:
        """The checkpoint after `epochs_done` epochs of `steps` steps; meta adds to restore's."""
        if self.saving and self.store is not None:
            self.store.save(epochs_done, state, {**self.meta, "epochs_done": epochs_done, **meta},
                            step=epochs_done * steps)

    def finish(self, log, evaluate, data, run_name: str, quality: dict, artifacts: dict):
        """(quality, artifacts) of the run, evaluated here where no epoch ran (a finished run
        resumed), and its pictures drawn, titled with the workload, run_name and the epochs done."""
        if not log.history:
            quality, artifacts = evaluate()
        if self.write:
            label = f"{self.workload.name} {run_name}, epoch {max(self.start, self.epochs_asked)}"
            write_pictures(self.workload, self.workdir, data, artifacts, label)
        return quality, artifacts
