"""One interface to every framework's checkpoints, with the same guarantees for each.

`open_store(framework, directory)` gives the jax loop Orbax (harness/checkpoint.py) and the
torch and Keras loops a `FileStore` (one file per finished epoch). Every store has:

  latest() -> int | None          epochs done by the newest finished checkpoint (not yet verified)
  save(epochs_done, state, meta, step=None)
                                  atomic: written to a temporary name, fsynced, renamed; a state
                                  holding NaN/inf is never saved (TrainingDiverged names the step
                                  and the tensor); a write error (full disk) is one UserError line
                                  and the earlier checkpoints stay as they were
  restore(target, expect_meta) -> (state, meta)
                                  the newest checkpoint that reads back as it was written
                                  (checksums of every tensor), skipping damaged ones with a
                                  warning; a checkpoint of another run is refused at once
  set_aside_damaged() -> [paths]  moves what the last restore skipped to `<directory>-damaged/`
  clean_leftovers()               removes unfinished saves of a killed run (only a process that
                                  holds the workdir's lock may: see harness/workdir.py)
  close()

A FileStore reads with no code execution: torch files with `torch.load(weights_only=True)`,
Keras archives with `np.load(allow_pickle=False)`. A file whose name is not exactly
`epoch_<N><suffix>` (say `epoch_007.pt`, or a copy) is not a checkpoint and is ignored.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from flaxport.errors import TrainingDiverged, UserError, first_line
from flaxport.harness.metrics import info
from flaxport.harness.saving import SAVE_DELAY_ENV, Damaged, os_reason

TMP_PREFIX = "tmp-epoch-"  # unfinished saves; torch rejects file names that start with a dot
DIGEST_KEY = "state_blake2b"


def open_store(framework: str, directory, *, placement=None, max_to_keep: int = 3):
    """The checkpoint store of a `framework` ("jax", "torch" or "keras") run under `directory`."""
    if framework == "jax":
        from flaxport.harness.checkpoint import Checkpointer

        return Checkpointer(directory, max_to_keep=max_to_keep, placement=placement)
    if framework == "torch":
        return FileStore(directory, TorchCodec(), keep=max_to_keep)
    if framework == "keras":
        return FileStore(directory, NpzCodec(), keep=max_to_keep)
    raise UserError(f"unknown framework {framework!r}; choose jax, torch or keras")


class TorchCodec:
    """{"state": nested dicts of tensors and plain values, "meta": dict} as a torch zip file."""

    suffix = ".pt"

    def write(self, f, payload: dict) -> None:
        import torch

        torch.save(payload, f)

    def read(self, path: Path) -> dict:
        import pickle
        import zipfile

        import torch

        if not zipfile.is_zipfile(path):  # every torch.save since 1.6 writes a zip archive
            raise Damaged(f"not a torch checkpoint (no zip archive: {path.stat().st_size} bytes, cut short or "
                          f"overwritten?)")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:  # weights_only refused an object: it could run code
            raise Damaged(f"it holds Python objects other than tensors, refused unread (loading them could "
                          f"run code): {first_line(e, 120)}") from None


class NpzCodec:
    """{"state": {name: array}, "meta": dict} as a NumPy archive; meta rides as a JSON string."""

    suffix = ".npz"

    def write(self, f, payload: dict) -> None:
        np.savez(f, __meta__=np.array(json.dumps(payload["meta"])), **payload["state"])

    def read(self, path: Path) -> dict:
        with np.load(path, allow_pickle=False) as z:
            return {"meta": json.loads(str(z["__meta__"])), "state": {k: z[k] for k in z.files if k != "__meta__"}}


class FileStore:
    """Checkpoints `directory/epoch_<N><suffix>`, one per finished epoch; keeps the newest `keep`."""

    def __init__(self, directory, codec, keep: int = 3):
        self.directory = Path(directory).absolute()
        self.codec = codec
        self.keep = keep
        self.damaged: list = []  # [(epochs, reason)] skipped by the last restore

    def path(self, epochs_done: int) -> Path:
        return self.directory / f"epoch_{epochs_done}{self.codec.suffix}"

    def steps(self) -> list[int]:
        """Epochs of the finished checkpoints, oldest first (names exactly epoch_<N><suffix>)."""
        if not self.directory.is_dir():
            return []
        pattern = re.compile(rf"epoch_(0|[1-9][0-9]*){re.escape(self.codec.suffix)}")
        return sorted(int(m[1]) for p in self.directory.iterdir() if (m := pattern.fullmatch(p.name)))

    def latest(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def save(self, epochs_done: int, state, meta: dict, step: int | None = None) -> None:
        leaves = dict(_leaves(state))
        bad = next((k for k, v in leaves.items() if not _finite(v)), None)
        if bad is not None:
            where = f"step {step}" if step is not None else f"epoch {epochs_done}"
            last = self.latest()
            raise TrainingDiverged(
                f"the train state became NaN/inf by {where} (epoch {epochs_done}; first: {bad}); training stopped, "
                f"last good checkpoint: {f'epoch {last}' if last is not None else 'none'} in {self.directory}")
        meta = {**meta, DIGEST_KEY: _digests(leaves)}
        meta["meta_blake2b"] = _meta_digest(meta)
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=TMP_PREFIX, suffix=self.codec.suffix)
            with os.fdopen(fd, "wb") as f:
                self.codec.write(f, {"state": state, "meta": meta})
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the checkpoint from other users
            delay = float(os.environ.get(SAVE_DELAY_ENV, "0") or 0)
            if delay > 0:
                time.sleep(delay)  # test hook: a complete file, not yet under its name
            os.replace(tmp, self.path(epochs_done))
            tmp = None
            _fsync_dir(self.directory)
        except Exception as e:  # noqa: BLE001 - OSError, or torch's writer error for a full disk
            kept = [s for s in self.steps() if s != epochs_done]
            raise UserError(f"cannot write checkpoint {epochs_done} in {self.directory}: {os_reason(e)} "
                            f"(earlier checkpoints kept: {', '.join(map(str, kept)) or 'none'})") from e
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
        for old in self.steps()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)

    def restore(self, target, expect_meta: dict):
        """(target, meta) with target.load_state_dict(the newest good checkpoint's state)."""
        steps = sorted(self.steps(), reverse=True)
        if not steps:
            raise UserError(f"no checkpoint in {self.directory}")
        self.damaged = []
        for epochs in steps:
            try:
                payload = self._read_one(epochs, expect_meta)
            except Damaged as e:
                self.damaged.append((epochs, str(e)))
                continue
            try:
                target.load_state_dict(payload["state"])
            except (RuntimeError, ValueError, KeyError, TypeError) as e:  # names, shapes or layout of another run
                what = " ".join(line.strip() for line in str(e).strip().splitlines()[:2]) or type(e).__name__
                raise UserError(f"checkpoint {self.path(epochs)} does not fit this run's state: {what[:300]}") from e
            for bad, why in self.damaged:
                info(f"flaxport: warning: checkpoint {self.path(bad)} is damaged ({why}); "
                     f"using checkpoint {epochs} instead")
            return target, payload["meta"]
        detail = "; ".join(f"{s}: {why}" for s, why in self.damaged)
        raise UserError(f"no good checkpoint in {self.directory} ({detail})")

    def _read_one(self, epochs: int, expect_meta: dict) -> dict:
        path = self.path(epochs)
        try:
            payload = self.codec.read(path)
        except Damaged:
            raise
        except Exception as e:  # noqa: BLE001 - loaders raise many types for a bad file
            raise Damaged(f"unreadable: {first_line(e)}") from None
        meta = payload.get("meta") if isinstance(payload, dict) else None
        if not isinstance(meta, dict) or not isinstance(payload.get("state"), dict):
            raise Damaged("not a flaxport checkpoint (no state and meta)")
        if meta.get("meta_blake2b") not in (None, _meta_digest(meta)):
            raise Damaged("its meta does not match its checksum")
        if meta.get("epochs_done") != epochs:
            raise Damaged(f"it holds epoch {meta.get('epochs_done')!r}, not {epochs}")
        for k, want in expect_meta.items():
            if meta.get(k) != want:
                raise UserError(f"checkpoint {path} is from {k}={meta.get(k)!r}, not {want!r}")
        saved = meta.get(DIGEST_KEY)
        if saved is not None:  # files written before checksums existed are taken as they are
            digest = _digests(dict(_leaves(payload["state"])))
            wrong = sorted(k for k in digest.keys() | saved.keys() if digest.get(k) != saved.get(k))
            if wrong:
                raise Damaged(f"{wrong[0]} does not match its checksum" + (f" (+{len(wrong) - 1} more)" if wrong[1:] else ""))
        return payload

    def set_aside_damaged(self) -> list:
        moved = []
        if self.damaged:
            aside = self.directory.parent / f"{self.directory.name}-damaged"
            aside.mkdir(exist_ok=True)
            for epochs, _ in self.damaged:
                dest = aside / f"{self.path(epochs).name}-{time.strftime('%Y%m%d-%H%M%S')}"
                shutil.move(str(self.path(epochs)), str(dest))
                moved.append(dest)
            self.damaged = []
        return moved

    def clean_leftovers(self) -> list:
        """Remove the temporary files of saves that never finished (a killed run's)."""
        gone = []
        if self.directory.is_dir():
            for p in self.directory.glob(f"{TMP_PREFIX}*"):
                p.unlink(missing_ok=True)
                gone.append(p)
        return gone

    def close(self) -> None:
        pass


def _leaves(obj, prefix: str = ""):
    """(dotted path, leaf) of nested dicts/lists/tuples; tensors, arrays and plain values are leaves."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}{k}.")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], obj


def _as_numpy(leaf):
    if hasattr(leaf, "detach"):  # a torch tensor
        t = leaf.detach().cpu().contiguous()
        try:
            return t.numpy()
        except TypeError:  # a dtype NumPy lacks (bfloat16): its raw bits
            return t.view(_torch_int(t.element_size())).numpy()
    if isinstance(leaf, np.ndarray):
        return leaf
    return None


def _torch_int(size: int):
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


def _finite(leaf) -> bool:
    a = _as_numpy(leaf)
    if a is not None:
        return a.dtype.kind not in "fc" or bool(np.isfinite(a).all())
    return not isinstance(leaf, float) or math.isfinite(leaf)


def _digests(leaves: dict) -> dict:
    """{path: blake2b-128 hex of dtype, shape and bytes (arrays) or of the repr (plain values)}."""
    out = {}
    for path, leaf in leaves.items():
        a = _as_numpy(leaf)
        if a is None:
            h = hashlib.blake2b(f"{type(leaf).__name__}:{leaf!r}".encode(), digest_size=16)
        else:
            a = np.ascontiguousarray(a)
            h = hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode(), digest_size=16)
            h.update(a.view(np.uint8).reshape(-1) if a.size else b"")
        out[path] = h.hexdigest()
    return out


def _meta_digest(meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "meta_blake2b"}
    return hashlib.blake2b(json.dumps(body, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (a crash after it cannot bring the old name back)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


