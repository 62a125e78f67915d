"""flaxport export WORKLOAD --workdir DIR --out FILE [--steps K] [--n N]: a serialised
`jax.export` sampler with the run's weights baked in (ddim: noise -> images in [0, 1])."""
from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError

# Workloads whose sampler can be exported: name -> module with ema_variables, export_sampler.
EXPORTERS = {"ddim": "flaxport.workloads.ddim.export"}


def add_parser(sub):
    p = sub.add_parser("export", help="serialise a trained sampler (jax.export) with its weights inside")
    p.add_argument("workload", help="ddim")
    p.add_argument("--workdir", required=True, help="a jax or torch run (its newest checkpoint)")
    p.add_argument("--out", required=True, help="file to write (jax.export serialisation)")
    p.add_argument("--steps", type=int, default=None, help="sampler steps (default: the config's picture steps)")
    p.add_argument("--n", type=int, default=16, help="images per call: the input is noise (n, H, W, C)")
    common.add_debug(p)
    p.set_defaults(run=run)


def _write(path: Path, blob: bytes) -> None:
    """Atomically: a reader never finds half an artifact under the final name."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide the artifact from other users
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e


def run(args) -> int:
    from flaxport.cli.evaluate import STEPS_FIELD, restore
    from flaxport.workloads import registry

    name = args.workload
    if name not in EXPORTERS:
        registry.summary(name)  # an unknown workload: one line naming the known ones (imports no jax)
        raise UserError(f"export: {name} has no sampler to export; choose {', '.join(EXPORTERS)}")
    for flag, value in (("--n", args.n), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    out = Path(args.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: no folder {out.parent}; create it first")
    workload, config, info, framework, state, _ = restore(name, args.workdir, args.n, args.steps)
    if state is None:
        raise UserError(f"export reads jax and torch runs; {args.workdir} is a {framework} run")
    exporter = importlib.import_module(EXPORTERS[name])
    steps = args.steps or getattr(config, STEPS_FIELD)
    exported = exporter.export_sampler(config, exporter.ema_variables(config, framework, state), args.n, steps)
    try:
        blob = bytes(exported.serialize())
    except ImportError as e:  # jax.export serialises with flatbuffers, an optional jax dependency
        raise UserError(f"export needs the flatbuffers package to serialise ({e}); pip install flatbuffers") from e
    _write(out, blob)
    shape = [int(d) for d in exported.in_avals[0].shape]
    print(json.dumps({"out": str(out), "bytes": len(blob), "input": {"shape": shape, "dtype": "float32"},
                      "steps": steps, "framework": framework, "epochs_done": info.get("epochs_done"),
                      "platforms": list(exported.platforms)}))
    return 0
