"""Orbax checkpoints, one per finished epoch, with the run's identity beside the state.

Each checkpoint holds `state` (the whole train state pytree) and `meta` (workload,
config name, epochs done, seed, and a checksum of every state array). Restoring checks
`meta` against the run before it touches the state, so a checkpoint of another
workload is refused with one line.

Damage, and how it is caught:
* a save cut short (kill, crash, full disk): Orbax writes into `<step>.orbax-checkpoint-tmp`
  and renames it only when complete, so an unfinished step is never listed (and the
  training loop removes such leftovers with `clean_leftovers`, once it holds the workdir);
* a finished checkpoint damaged later (truncated or garbled array files, a lost
  metadata file): a read error, or arrays that do not match the checksums saved in
  `meta` (a flipped byte inside a compressed chunk can decode to wrong numbers).
`restore` then falls back to the newest good checkpoint with a warning, or stops with
one error line if none is good.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np

from flaxport.errors import TrainingDiverged, UserError
from flaxport.harness.distributed import Placement
from flaxport.harness.metrics import info
from flaxport.harness.saving import SAVE_DELAY_ENV, Damaged, os_reason

# Orbax logs every save at INFO through absl; a training run should not.
logging.getLogger("absl").setLevel(logging.WARNING)

# SAVE_DELAY_ENV (test hook): seconds to sleep inside every save, after its temporary
# directory exists and before Orbax finalises it, so a test can kill a run mid-save.
TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of a save Orbax has not finalised


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


class Checkpointer:
    """Checkpoints under `directory/<epochs done>/`; keeps the newest `max_to_keep`.

    placement: where restored arrays go (replicated over its mesh, if any).
    Unfinished saves of a killed run are removed by `clean_leftovers`, which only a run
    holding the workdir's lock may call (a reader must not delete a save in progress).
    Orbax's own clean-up is not used: it runs on a background thread that can outlive a
    run stopped by an error and print a traceback at exit.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3, placement: Placement | None = None):
        ocp = _ocp()
        self.directory = Path(directory).absolute()
        self.place = placement or Placement.single()
        self.damaged: list = []  # [(step, reason)] skipped by the last restore
        # create=False: a command that only reads a run must not add a folder to it; save makes it.
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=False, enable_async_checkpointing=False,
                                               cleanup_tmp_directories=False)
        meta_handler = ocp.JsonCheckpointHandler()
        delay = float(os.environ.get(SAVE_DELAY_ENV, "0") or 0)
        if delay > 0:
            meta_handler = _slow_json_handler(delay)
        try:
            self._manager = ocp.CheckpointManager(
                self.directory, options=options,
                item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": meta_handler},
            )
        except OSError as e:
            raise UserError(f"cannot create checkpoint directory {self.directory}: {e.strerror or e}") from e

    def latest(self) -> int | None:
        """Epochs done by the newest checkpoint, or None."""
        return self._manager.latest_step()

    def save(self, epochs_done: int, state, meta: dict, step: int | None = None) -> None:
        """Write checkpoint `epochs_done`; refuses a state holding NaN/inf (TrainingDiverged).

        step: the global step the state is at, for the message.
        """
        ocp = _ocp()
        digest, bad = fingerprint(self.place.fetch(state))
        if bad:
            where = f"step {step}" if step is not None else f"epoch {epochs_done}"
            last = self.latest()
            raise TrainingDiverged(
                f"the train state became NaN/inf by {where} (epoch {epochs_done}; first: {bad}); training stopped, "
                f"last good checkpoint: {f'epoch {last}' if last else 'none'} in {self.directory}")
        # Orbax writes on background threads, which log their error (with a traceback) before
        # it reaches this thread; here it becomes one line, so their log is held back.
        absl = logging.getLogger("absl")
        absl.addFilter(_background_error)
        _drop_failed_reads()  # a failing write's late callbacks report while the save unwinds
        try:
            if self.place.is_main:
                self.directory.mkdir(parents=True, exist_ok=True)
            self._manager.save(
                epochs_done,
                args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                        meta=ocp.args.JsonSave({**meta, "state_blake2b": digest})),
            )
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - OSError, or a tensorstore error for a full disk
            _drop_failed_writes(self.directory)
            if self.place.is_main:  # the unfinished save: it would only take space
                for p in self.directory.glob(f"{epochs_done}{TMP_MARK}*"):
                    shutil.rmtree(p, ignore_errors=True)
            try:
                kept = [s for s in self._manager.all_steps() if s != epochs_done]
            except Exception:  # noqa: BLE001 - the directory itself may be gone
                kept = []
            raise UserError(f"cannot write checkpoint {epochs_done} in {self.directory}: {_reason(e)} "
                            f"(earlier checkpoints kept: {', '.join(map(str, kept)) or 'none'})") from e
        finally:
            absl.removeFilter(_background_error)

    def clean_leftovers(self) -> list:
        """Remove the unfinished saves of a killed run (`<step>.orbax-checkpoint-tmp*`)."""
        gone = []
        if self.place.is_main and self.directory.is_dir():
            for p in self.directory.iterdir():
                if TMP_MARK in p.name:
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                    gone.append(p)
        _sync("flaxport-clean-leftovers", self.place)
        if gone:
            self._manager.reload()
        return gone

    def restore(self, target_state, expect_meta: dict, epochs_done: int | None = None):
        """(state, meta) of checkpoint `epochs_done`, or of the newest good one; shaped like target_state.

        A damaged checkpoint is skipped with a warning (listed in self.damaged) when an
        older one is good; if none is, one UserError names them all. A checkpoint of
        another run (meta, shapes) stops at once: an older one would not fit either.
        """
        steps = [epochs_done] if epochs_done is not None else sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            raise UserError(f"no checkpoint in {self.directory}")
        self.damaged = []
        for step in steps:
            try:
                result = self._restore_one(step, target_state, expect_meta)
            except Damaged as e:
                self.damaged.append((step, str(e)))
                continue
            for bad, why in self.damaged if self.place.is_main else ():
                info(f"flaxport: warning: checkpoint {self.directory / str(bad)} is damaged ({why}); "
                     f"using checkpoint {step} instead")
            return result
        detail = "; ".join(f"{s}: {why}" for s, why in self.damaged)
        raise UserError(f"no good checkpoint in {self.directory} ({detail})")

    def set_aside_damaged(self) -> list:
        """Move the checkpoints the last restore skipped to `<directory>-damaged/` (kept for a
        post-mortem, out of Orbax's way so their steps can be written again). Returns their paths."""
        moved = []
        if self.damaged and self.place.is_main:
            aside = self.directory.parent / f"{self.directory.name}-damaged"
            aside.mkdir(exist_ok=True)
            for step, _ in self.damaged:
                dest = aside / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
                shutil.move(str(self.directory / str(step)), str(dest))
                moved.append(dest)
        if self.damaged:
            _sync("flaxport-set-aside", self.place)
            self._manager.reload()
            self.damaged = []
        return moved

    def _restore_one(self, step: int, target_state, expect_meta: dict):
        ocp = _ocp()
        where = self.directory / str(step)
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            if not isinstance(meta, dict) or not isinstance(meta.get("epochs_done"), int):
                raise ValueError("no epochs_done in meta")
        except Exception as e:  # noqa: BLE001 - orbax raises many types for a bad file
            raise Damaged(f"meta unreadable: {_short(e)}") from e
        for k, want in expect_meta.items():
            if meta.get(k) != want:
                raise UserError(f"checkpoint {where} is from {k}={meta.get(k)!r}, not {want!r}")
        abstract = jax.eval_shape(lambda: target_state)  # plain ints (TrainState.step) become int32
        # Always say where the arrays go: a checkpoint written on 4 devices restores onto 1
        # (or 8) only with target shardings; left alone, Orbax insists on the saved topology.
        sharding = self.place.replicated() or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding),
                                          abstract)
        # Compare shapes before restoring: a failed Orbax restore leaves tensorstore
        # callbacks behind that print tracebacks at exit, and says less than this does.
        try:
            stored = _shapes(self._manager.item_metadata(step)["state"])
        except Exception as e:  # noqa: BLE001
            raise Damaged(f"state metadata unreadable: {_short(e)}") from e
        if not stored:
            raise Damaged("state metadata missing")
        wanted = _shapes(abstract)
        for path in sorted(wanted.keys() | stored.keys()):
            if path not in stored:
                raise UserError(f"checkpoint {where} does not fit this run's state: no {path}")
            if path not in wanted:
                raise UserError(f"checkpoint {where} does not fit this run's state: unexpected {path}")
            if stored[path] != wanted[path]:
                raise UserError(f"checkpoint {where} does not fit this run's state: {path} "
                                f"is {stored[path]} there, {wanted[path]} here")
        try:
            state = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        except Exception as e:  # noqa: BLE001 - shapes fit, so the files are at fault
            reason = f"arrays unreadable: {_short(e)}"
            del e
            _drop_failed_reads()
            raise Damaged(reason) from None
        saved = meta.get("state_blake2b")
        if saved is not None:  # checkpoints written before checksums existed are taken as they are
            digest, _ = fingerprint(self.place.fetch(state))
            wrong = sorted(k for k in digest.keys() | saved.keys() if digest.get(k) != saved.get(k))
            if wrong:
                raise Damaged(f"{wrong[0]} does not match its checksum" + (f" (+{len(wrong) - 1} more)" if wrong[1:] else ""))
        return state, meta

    def close(self):
        self._manager.close()


def fingerprint(host_tree) -> tuple[dict, str | None]:
    """({leaf path: blake2b-128 hex of dtype, shape and bytes}, first leaf holding NaN/inf or None).

    host_tree: the state as NumPy arrays (Placement.fetch).
    """
    digest, bad = {}, None
    for path, leaf in _leaves(host_tree).items():
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)  # a typed key: checksum its raw bits
        a = np.ascontiguousarray(leaf)
        h = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=16)
        h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        digest[path] = h.hexdigest()
        if bad is None and a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad = path
    return digest, bad


def _leaves(tree) -> dict:
    def name(k):
        return str(getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))))

    return {".".join(name(k) for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _shapes(tree) -> dict:
    """{'g.params.net_0.kernel': (512, 64), ...} for arrays or Orbax array metadata."""
    return {k: tuple(leaf.shape) for k, leaf in _leaves(tree).items()}


def _short(e: Exception) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return first.split(" See full TensorStore details")[0][:300]  # the rest is a repr of the store


_READ_ERROR = "Encountered error while reading array index"  # Orbax's words for a failed array read


def _drop_failed_reads() -> None:
    """Silence what a failed Orbax restore leaves behind, for the rest of the process.

    When one array cannot be read, Orbax abandons the reads of the others. Later, each
    would report its own copy of the error after our one-line message, through three
    channels: coroutines finalised at exit ("Exception ignored in: <coroutine
    _read_array_index_and_device_put>"), reads still running that call back into
    Orbax's closed event loop ("RuntimeError: Event loop is closed"), and asyncio's
    "exception was never retrieved" log. Those reports, and only those, are dropped.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_flaxport", False):
        return

    def quiet(report):
        abandoned = getattr(report.object, "__qualname__", "") == "_read_array_index_and_device_put"
        late = report.exc_type is RuntimeError and str(report.exc_value) == "Event loop is closed"
        if not (abandoned or late):
            previous(report)

    def unretrieved(record) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and str(exc).startswith(_READ_ERROR))

    quiet._flaxport = True
    sys.unraisablehook = quiet
    logging.getLogger("asyncio").addFilter(unretrieved)


def _background_error(record) -> bool:
    """False for Orbax's log of an error raised on its save threads (re-raised in the caller)."""
    return "raised an exception" not in record.getMessage()


def _reason(e: Exception) -> str:
    """The OS's words for a failed write (tensorstore wraps them in a long message), else _short(e)."""
    text = os_reason(e)
    return text if len(text) < 80 else _short(e)


def _drop_failed_writes(directory: Path) -> None:
    """After a failed save, what Orbax abandoned reports later, each with a traceback, after
    the one line that already said it: tensorstore writes that finish and call back into
    Orbax's closed event loop ("RuntimeError: Event loop is closed", as _drop_failed_reads
    silences), and asyncio's "exception was never retrieved" for the other writes into the
    unfinished save (their messages name its folder, `directory/<step>.orbax-checkpoint-tmp`)."""
    _drop_failed_reads()
    where = str(directory)

    def unretrieved(record) -> bool:
        text = record.getMessage()
        return not ("never retrieved" in text and where in text)

    logging.getLogger("asyncio").addFilter(unretrieved)


def _sync(name: str, place: Placement) -> None:
    if place.multi_process:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _slow_json_handler(delay: float):
    """A JsonCheckpointHandler that sleeps after writing, inside the unfinished save.

    The instance's method is wrapped rather than the class subclassed: Orbax maps
    argument types (JsonSave) to handler classes, and a subclass is not registered.
    """
    handler = _ocp().JsonCheckpointHandler()
    write = handler._save_fn

    async def write_then_wait(x, directory):
        await write(x, directory)
        time.sleep(delay)  # blocks the save on purpose (test hook)

    handler._save_fn = write_then_wait
    return handler
