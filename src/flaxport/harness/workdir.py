"""A run's working directory: config.json, metrics.jsonl, checkpoints/, pictures.

Shared by every loop (Flax, PyTorch, Keras), so all leave the same files behind, and by
anything else that writes a run (convert, a sweep's members). The rule: a run checks
everything first, then changes the workdir. The API, in the order a writer uses it:

    held = claim(workdir, {"workload": "gan", "framework": "jax"}, resume=False,
                 has_checkpoint=store_has_checkpoint)  # checks, then locks; writes nothing
    try:
        ...  # more checks: restore the checkpoint (seed, variant, shapes), build the model
        held.commit(config_dict)  # now config.json is written (atomically)
        ...  # train, save checkpoints, metrics, pictures
    finally:
        held.release()  # or `with claim(...) as held:`

The lock is `flock` on the workdir itself: the kernel drops it when the process dies
(a SIGKILL never leaves a run stuck), and a second writer gets one line naming the
process that holds it. Commands that only read a run (evaluate, sample, export,
convert from a workdir) take no lock.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
from pathlib import Path

from flaxport.errors import UserError
from flaxport.fileset import first_missing, remove_empty


def write_json(path: Path, obj) -> None:
    """Write JSON atomically and durably: a reader (or a crash) never sees half a file."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_default) + "\n")


def write_text(path: Path, text: str) -> None:
    """Replace `path` by `text` atomically: temporary file, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _default(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_pictures(workload, workdir, data, artifacts, label: str) -> list:
    """workload.write_pictures, with a write error (read-only folder, full disk) as one line."""
    try:
        return workload.write_pictures(workdir, data, artifacts, label)
    except OSError as e:
        where = e.filename or workdir
        raise UserError(f"cannot write pictures to {where}: {e.strerror or e}") from e


def read_config_json(workdir) -> dict | None:
    """config.json of `workdir` as a dict (None if there is none); one UserError line if it is
    not a JSON object."""
    path = Path(workdir) / "config.json"
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is unreadable: {e}") from e
    if not isinstance(saved, dict):
        raise UserError(f"{path} holds a JSON {type(saved).__name__}, not a run's settings (an object with "
                        f"workload, framework and config)")
    return saved


class Claim:
    """A workdir locked by this process for a run. `commit(config)` writes config.json;
    `release()` unlocks it (and removes the directory again if this claim made it and the
    run never committed, so a refused run leaves nothing behind)."""

    def __init__(self, path: Path, identity: dict, fd: int | None, made: Path | None):
        self.path, self.identity, self._fd, self._made = path, identity, fd, made
        self.committed = False

    def commit(self, config) -> None:
        """Write `{**identity, "config": config}` to config.json: call it once every check passed.
        config None: the folder is kept and written to, but holds no config.json (a stack's)."""
        if self._fd is not None and config is not None:  # a multi-process run's other processes leave the files to process 0
            try:
                write_json(self.path / "config.json", {**self.identity, "config": config})
            except OSError as e:
                raise UserError(f"cannot write {self.path / 'config.json'}: {e.strerror or e}") from e
        self.committed = True

    def release(self) -> None:
        if self._made is not None and not self.committed:
            remove_empty(self._made)
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def claim(workdir, identity: dict, *, resume: bool, has_checkpoint, write: bool = True) -> Claim:
    """Check that a run may write to `workdir`, then lock it; nothing in it is changed.

    identity: {"workload": ..., "framework": ...}; a workdir holding another workload's or
    framework's run is refused. Without `resume`, a workdir with checkpoints is refused
    too, so a typo never overwrites a finished run. has_checkpoint(workdir) -> bool.
    write: False in every process but the first of a multi-process run: they check the
    same things (so all of them stop together) but neither lock nor write.
    Raises UserError (one line) for each refusal, including "in use by process N".
    """
    workdir = Path(workdir)
    made = None
    if write:
        try:
            made = first_missing(workdir)  # inside: a name too long for the file system fails here
            workdir.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=workdir, prefix=".write-test-")
            probe.close()
        except OSError as e:
            if made is not None:
                remove_empty(made)
            raise UserError(f"workdir {workdir} is not writable: {e.strerror or e}") from e
    fd = lock(workdir) if write else None
    held = Claim(workdir, identity, fd, made)
    try:
        old = read_config_json(workdir) if workdir.is_dir() else None
        for key, want in identity.items():
            if old is not None and old.get(key) not in (None, want):
                raise UserError(f"workdir {workdir} holds a {key}={old[key]!r} run, not {want!r}; "
                                f"choose another --workdir")
        if not resume and has_checkpoint(workdir):
            raise UserError(f"workdir {workdir} already holds checkpoints; pass --resume to continue or "
                            f"choose another --workdir")
    except BaseException:
        held.release()
        raise
    return held


def lock(directory) -> int:
    """An exclusive flock on `directory`, as an open descriptor (close it to unlock).
    Held by another process (or another claim in this one): one UserError naming it."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        holder = holder_pid(directory)
        who = f"process {holder}" if holder is not None else "another process"
        if holder == os.getpid():
            who = f"this process ({holder})"
        raise UserError(f"workdir {directory} is in use by {who}, which is writing a run there; wait for it "
                        f"to finish or choose another --workdir") from e
    return fd


def holder_pid(directory) -> int | None:
    """The process holding a flock on `directory`, from /proc/locks (Linux); None if unknown."""
    try:
        st = os.stat(directory)
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 12345 fe:00:2148422 0 EOF" (a waiter's line has "->" second)
        if len(parts) < 6 or parts[1] != "FLOCK":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == want:
                return int(parts[4])
        except ValueError:
            continue
    return None
