"""A folder of files written as one set: filled beside it, then renamed into its place.

`write(directory, fill, names=...)` has `fill(tmp)` write the whole set into a new
temporary sibling folder (`.NAME.new-PID-XXXX`), then swaps it with `directory` in one
rename (Linux `renameat2(RENAME_EXCHANGE)`; elsewhere two renames) and removes what it
swapped out. So `directory` holds the old complete set or the new complete set, never a
mix, whatever happens meanwhile (a kill, a full disk, a write error), and files of the
old set that the new one does not write (an earlier `train_step.py`) go with the old
set. What a killed write leaves beside the folder is removed by the next write there.

Only a folder that holds nothing but an earlier set (`names`, Python's `__pycache__` and
the temporary files of an older save) is replaced; any other file in it is the user's,
and the write is refused before any work is done (`check`). Used by `translate --out`
and `convert`'s new workdir.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from flaxport.errors import UserError

# As in harness.store: tests kill a write while it waits here, complete but not yet renamed.
SAVE_DELAY_ENV = "FLAXPORT_TEST_SAVE_DELAY"
CACHE = "__pycache__"  # Python writes it beside a model.py that was imported: a cache, not the user's


def check(directory, names=(), what: str = "") -> Path:
    """`directory` if a set can be written there; else one UserError line (nothing changes).

    Refused: a path under a file, a file where the folder should be, a folder holding
    anything but an earlier set of `names`, a place that cannot be written."""
    label = f"{what} {directory}".strip()
    try:
        directory = _real(Path(os.path.abspath(directory)))  # "." has a parent to write beside
        for parent in reversed(directory.parents):
            if parent.exists() and not parent.is_dir():
                raise UserError(f"cannot write {label}: {parent} is a file, not a folder")
        if directory.exists() and not directory.is_dir():
            raise UserError(f"cannot write {label}: it exists and is not a folder")
        foreign = _foreign(directory, names) if directory.is_dir() else []
    except OSError as e:
        raise UserError(f"cannot write {label}: {e.strerror or e}") from e
    if foreign:
        raise UserError(f"cannot write {label}: it holds files that are not an earlier output "
                        f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                        "choose a new or empty folder")
    beside = next((p for p in directory.parents if p.exists()), directory)  # where the new set is written first
    try:
        tempfile.TemporaryFile(dir=beside).close()
    except OSError as e:
        raise UserError(f"cannot write {label}: {beside} is not writable ({e.strerror or e})") from e
    return directory


def write(directory, fill, names=(), what: str = "") -> Path:
    """Write the set `fill(tmp)` makes as `directory` (see the module docstring); returns it.

    names: the files a set of this kind holds (an earlier one is replaced whole; a folder
    holding others is refused). A write error is one UserError line naming the folder,
    with the earlier set kept and no temporary folder left; any other error from `fill`
    propagates after the temporary folder is removed."""
    label = f"{what} {directory}".strip()
    directory = check(directory, names, what)
    existed = directory.exists()
    made = first_missing(directory.parent)
    tmp = None
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(directory)
        tmp = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.new-{os.getpid()}-"))
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the folder from other users
        fill(tmp)
        _fsync_tree(tmp)
        delay = float(os.environ.get(SAVE_DELAY_ENV, "0") or 0)
        if delay:
            time.sleep(delay)
        _put_in_place(tmp, directory, names)
        _fsync_dir(directory.parent)
    except OSError as e:
        _remove(tmp)
        remove_empty(made)
        kept = "the earlier files are kept" if existed else "nothing written"
        raise UserError(f"cannot write {label}: {e.strerror or e} ({kept})") from e
    except UserError as e:  # fill's own line (a checkpoint that cannot be written): named at its real place
        _remove(tmp)
        remove_empty(made)
        if tmp is not None and e.args and isinstance(e.args[0], str):
            e.args = (e.args[0].replace(str(tmp), str(directory)),) + e.args[1:]
        raise
    except BaseException:
        _remove(tmp)
        remove_empty(made)
        raise
    _remove(tmp)  # after the swap it holds the old set
    return directory


def clean_leftovers(directory) -> list:
    """Remove what killed writes of `directory` left beside it (their processes are gone);
    an old set moved aside by an unfinished two-rename swap goes back if `directory` is
    missing. Returns the paths handled."""
    directory = Path(directory)
    done = []
    pattern = re.compile(rf"\.{re.escape(directory.name)}\.(new|old)-(\d+)-")
    for p in sorted(directory.parent.iterdir()) if directory.parent.is_dir() else []:
        m = pattern.match(p.name)
        if not m or _alive(int(m[2])):
            continue
        if m[1] == "old" and not directory.exists():
            os.rename(p, directory)
        else:
            _remove(p)
        done.append(p)
    return done


def _put_in_place(tmp: Path, directory: Path, names) -> None:
    """Make `tmp` `directory`; afterwards `tmp` holds the old set (or nothing)."""
    if not directory.exists():
        os.rename(tmp, directory)
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:  # a run that locked the folder (harness.workdir) is writing there: its files stay
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UserError(f"cannot write {directory}: another process is writing there; wait for it to "
                            "finish or choose another folder") from None
        if _foreign(directory, names):  # files appeared there since `check`: they stay, and nothing is replaced
            raise UserError(f"cannot write {directory}: files appeared in it while writing; nothing replaced")
        if _exchange(tmp, directory):
            return
        old = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old-{os.getpid()}-"))
        os.rename(directory, old)  # replaces the empty folder mkdtemp made
        os.rename(tmp, directory)
        os.rename(old, tmp)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_cwd, exchange = -100, 2
    if fn(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # no such call, or the file system cannot
        return False
    raise OSError(err, os.strerror(err), str(b))


def _foreign(directory: Path, names) -> list:
    """Entries of `directory` that are not an earlier set's files."""
    ours = set(names) | {CACHE}
    older = re.compile(r"\.(.+)\.tmp\d+$")  # an older save's temporary files: .weights.safetensors.tmp123

    def is_ours(name):
        m = older.match(name)
        return name in ours or (m is not None and m[1] in ours)

    return sorted(p.name for p in directory.iterdir() if not is_ours(p.name))


def _real(path: Path) -> Path:
    """A symlink to a folder is replaced where it points, not the link itself."""
    return path.resolve() if path.is_symlink() else path


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process has no write in flight there: what it left is a leftover
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_tree(top: Path) -> None:
    for root, _, files in os.walk(top):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path) -> None:
    if path is None or not os.path.lexists(path):
        return
    if Path(path).is_dir() and not Path(path).is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (what mkdir(parents) makes)."""
    missing = None
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing = p
    return missing


def remove_empty(top: Path | None) -> None:
    """Remove `top` if it holds nothing but empty folders (what a failed write made)."""
    if top is None or not top.is_dir():
        return
    for root, _, _ in sorted(os.walk(top), key=lambda t: -len(t[0])):
        try:
            os.rmdir(root)
        except OSError:
            return


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
