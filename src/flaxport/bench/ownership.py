"""What a comparison owns in its workdir: the run folders it made, recorded in its report.json.

`compare` is re-run from scratch, so it removes the run folders an earlier comparison
made there, and nothing else: a folder is removed only when the workdir's report.json
lists it (`made`: {folder name: digest of every file in it}), it holds no checkpoints (a
comparison keeps none) and its files are still the ones the comparison left (no run took
it over since, no file was added). The folder is locked while it is checked and removed,
so a training that holds it is named and never touched.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from flaxport.errors import UserError
from flaxport.harness.workdir import lock, write_json

REPORT = "report.json"


def recorded(workdir) -> dict:
    """{folder name: digest or None} of the run folders earlier comparisons made in `workdir`."""
    path = Path(workdir) / REPORT
    try:
        made = json.loads(path.read_text()).get("made", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: v for k, v in made.items() if isinstance(k, str) and (v is None or isinstance(v, str))} \
        if isinstance(made, dict) else {}


def digest(folder) -> str:
    """BLAKE2b of every file in `folder` (paths and bytes): the folder as the comparison left it."""
    folder = Path(folder)
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def check(folder, made: dict) -> None:
    """Refuse (one UserError line) a run folder this comparison may not replace; nothing changes."""
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return
    if not folder.is_dir() or folder.is_symlink():
        raise UserError(f"{folder} is a file or a link where the comparison's run folder goes; "
                        "move it or choose another --workdir")
    os.close(lock(folder))  # a run writing there is named first (by its process)
    _refuse_unless_ours(folder, made)


def remove(folder, made: dict) -> None:
    """Remove an earlier comparison's run folder, locked (and each member folder in it) while
    it is checked again and removed; a folder held by a training is refused, naming it."""
    folder = Path(folder)
    if not folder.exists():
        return
    fds = [lock(folder)]
    try:
        fds += [lock(d) for d in sorted(folder.iterdir()) if d.is_dir() and (d / "config.json").exists()]
        _refuse_unless_ours(folder, made)
        shutil.rmtree(folder)
    finally:
        for fd in fds:
            os.close(fd)


def record(workdir, made: dict) -> None:
    """report.json of a comparison under way: which run folders it made (`made`), so that
    an interrupted comparison's folders are still known as its own. Written before a run
    folder is made and after each run; the finished report replaces it (report.write)."""
    write_json(Path(workdir) / REPORT, {"complete": False, "made": made})


def _refuse_unless_ours(folder: Path, made: dict) -> None:
    why = _not_ours(folder, made)
    if why:
        raise UserError(f"{folder} {why}; compare removes only the run folders an earlier comparison made "
                        f"there (listed in {folder.parent / REPORT}): move it or choose another --workdir")


def _not_ours(folder: Path, made: dict) -> str:
    if folder.name not in made:
        return "holds a run or files that no earlier comparison here made"
    held = [p for p in [folder / "checkpoints", *folder.glob("*/checkpoints")] if p.is_dir() and any(p.iterdir())]
    if held:
        return f"holds checkpoints ({held[0]}), which a comparison never keeps: another run trained there"
    if made[folder.name] is not None and made[folder.name] != digest(folder):
        return "has changed since the comparison wrote it (another run trained there, or files were added)"
    return ""
