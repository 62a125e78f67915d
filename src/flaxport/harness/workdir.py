"""A run's working directory: config.json, metrics.jsonl, checkpoints/, pictures.

Shared by the Flax loop and its PyTorch twin, so both leave the same files behind.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from flaxport.errors import UserError


def write_json(path: Path, obj) -> None:
    """Write JSON atomically: a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, default=_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _default(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def prepare(workdir, identity: dict, config, resume: bool, has_checkpoint, write: bool = True) -> Path:
    """Create/validate `workdir` for a run and write config.json.

    identity: {"workload": ..., "framework": ...}; a workdir that holds another
    workload's run is refused. Without --resume a workdir with checkpoints is refused
    too, so a typo never overwrites a finished run.
    write: False in every process but the first of a multi-process run: they check the
    same things (so all of them stop together) but leave the files to process 0.
    """
    workdir = Path(workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        if write:
            probe = workdir / ".write-test"
            probe.write_text("")
            probe.unlink()
    except OSError as e:
        raise UserError(f"workdir {workdir} is not writable: {e.strerror or e}") from e
    cfg_path = workdir / "config.json"
    if cfg_path.exists():
        try:
            old = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{cfg_path} is unreadable: {e}") from e
        for key, want in identity.items():
            if old.get(key) not in (None, want):
                raise UserError(f"workdir {workdir} holds a {key}={old[key]!r} run, not {want!r}; choose another --workdir")
    if has_checkpoint(workdir) and not resume:
        raise UserError(f"workdir {workdir} already holds checkpoints; pass --resume to continue or choose another --workdir")
    if write:
        write_json(cfg_path, {**identity, "config": config})
    return workdir
