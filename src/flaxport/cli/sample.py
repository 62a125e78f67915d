"""flaxport sample WORKLOAD --workdir DIR [--n N] [--steps K]: pictures from a run's newest checkpoint."""
from __future__ import annotations

import json
import os

from flaxport.cli.evaluate import STEPS_FIELD, load_trained
from flaxport.cli import common
from flaxport.errors import UserError


def add_parser(sub):
    p = sub.add_parser("sample", help="draw samples from a trained run and write its pictures")
    p.add_argument("workload", help="gan, cnn, vae or ddim")
    p.add_argument("--workdir", required=True, help="a run of any framework (its newest checkpoint)")
    p.add_argument("--n", type=int, default=None, help="how many samples (generative workloads)")
    p.add_argument("--steps", type=int, default=None,
                   help="sampler steps of the pictures (workloads with an iterative sampler: ddim)")
    p.add_argument("--data-dir", default=None, help="where real datasets live (default $FLAXPORT_DATA)")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from flaxport.harness.workdir import write_pictures
    from flaxport.workloads import registry

    for flag, value in (("--n", args.n), ("--steps", args.steps)):  # before the checkpoint is read
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    common.setup_jax(args.workload)  # importing a workload imports jax: its settings first
    default = registry.get(args.workload).get_config("default")
    if args.steps is not None and not hasattr(default, STEPS_FIELD):
        raise UserError(f"--steps: {args.workload} has no iterative sampler (no {STEPS_FIELD} in its config)")
    if args.n is not None and not (hasattr(default, "n_eval") or hasattr(default, "n_samples")):
        raise UserError(f"--n: {args.workload} draws no samples; `sample` rewrites its pictures from the checkpoint")
    if os.path.isdir(args.workdir) and not os.access(args.workdir, os.W_OK):  # before the sampling, not after
        raise UserError(f"cannot write pictures to {args.workdir}: it is read-only")
    workload, config, info, evaluate = load_trained(args.workload, args.workdir, args.n, args.steps)
    data = common.load_data(workload, config, args)
    quality, artifacts = evaluate(data, args.n, args.steps)
    paths = write_pictures(workload, args.workdir, data, artifacts, f"{workload.name}, epoch {info.get('epochs_done')}")
    print(json.dumps({"pictures": [str(p) for p in paths], "quality": quality}))
    return 0
