"""Orbax checkpoints, one per finished epoch, with the run's identity beside the state.

Each checkpoint holds `state` (the whole train state pytree) and `meta` (workload,
config name, epochs done, seed). Restoring checks `meta` against the run before it
touches the state, so a checkpoint of another workload is refused with one line.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import jax

from flaxport.errors import UserError

# Orbax logs every save at INFO through absl; a training run should not.
logging.getLogger("absl").setLevel(logging.WARNING)


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


class Checkpointer:
    """Checkpoints under `directory/<epochs done>/`; keeps the newest `max_to_keep`."""

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3):
        ocp = _ocp()
        self.directory = Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False)
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, options=options,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()},
            )
        except OSError as e:
            raise UserError(f"cannot create checkpoint directory {self.directory}: {e.strerror or e}") from e

    def latest(self) -> int | None:
        """Epochs done by the newest checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, epochs_done: int, state, meta: dict) -> None:
        ocp = _ocp()
        try:
            self._manager.save(
                epochs_done,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            )
            self._manager.wait_until_finished()
        except OSError as e:
            raise UserError(f"cannot write checkpoint {epochs_done} in {self.directory}: {e.strerror or e}") from e

    def restore(self, target_state, expect_meta: dict, epochs_done: int | None = None):
        """(state, meta) of checkpoint `epochs_done` (newest by default), shaped like target_state."""
        ocp = _ocp()
        step = self.latest() if epochs_done is None else epochs_done
        if step is None:
            raise UserError(f"no checkpoint in {self.directory}")
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a bad file
            raise UserError(f"checkpoint {self.directory / str(step)} is unreadable: {_short(e)}") from e
        for k, want in expect_meta.items():
            if meta.get(k) != want:
                raise UserError(
                    f"checkpoint {self.directory / str(step)} is from {k}={meta.get(k)!r}, not {want!r}"
                )
        abstract = jax.eval_shape(lambda: target_state)  # plain ints (TrainState.step) become int32
        # Compare shapes before restoring: a failed Orbax restore leaves tensorstore
        # callbacks behind that print tracebacks at exit, and says less than this does.
        try:
            stored = _shapes(self._manager.item_metadata(step)["state"])
        except Exception as e:  # noqa: BLE001
            raise UserError(f"checkpoint {self.directory / str(step)} is unreadable: {_short(e)}") from e
        wanted = _shapes(abstract)
        for path in sorted(wanted.keys() | stored.keys()):
            if path not in stored:
                raise UserError(f"checkpoint {self.directory / str(step)} does not fit this run's state: no {path}")
            if path not in wanted:
                raise UserError(f"checkpoint {self.directory / str(step)} does not fit this run's state: "
                                f"unexpected {path}")
            if stored[path] != wanted[path]:
                raise UserError(f"checkpoint {self.directory / str(step)} does not fit this run's state: {path} "
                                f"is {stored[path]} there, {wanted[path]} here")
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        except Exception as e:  # noqa: BLE001
            raise UserError(f"checkpoint {self.directory / str(step)} does not fit this run's state: {_short(e)}") from e
        return restored["state"], meta

    def close(self):
        self._manager.close()


def _shapes(tree) -> dict:
    """{'g.params.net_0.kernel': (512, 64), ...} for arrays or Orbax array metadata."""

    def name(k):
        return str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))))

    return {".".join(name(k) for k in path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]
