"""flaxport sample WORKLOAD --workdir DIR [--n N] [--steps K]: pictures from a run's newest checkpoint."""
from __future__ import annotations

import json

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
    for flag, value in (("--n", args.n), ("--steps", args.steps)):  # before the checkpoint is read
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if args.steps is not None:
        from flaxport.workloads import registry

        common.setup_jax(args.workload)  # importing a workload imports jax: its settings first
        if not hasattr(registry.get(args.workload).get_config("default"), STEPS_FIELD):
            raise UserError(f"--steps: {args.workload} has no iterative sampler (no {STEPS_FIELD} in its config)")
    workload, config, info, evaluate = load_trained(args.workload, args.workdir)
    if args.n is not None and not (hasattr(config, "n_eval") or hasattr(config, "n_samples")):
        raise UserError(f"--n: {workload.name} draws no samples; `sample` rewrites its pictures from the checkpoint")
    data = common.load_data(workload, config, args)
    quality, artifacts = evaluate(data, args.n, args.steps)
    paths = workload.write_pictures(args.workdir, data, artifacts, f"{workload.name}, epoch {info.get('epochs_done')}")
    print(json.dumps({"pictures": [str(p) for p in paths], "quality": quality}))
    return 0
