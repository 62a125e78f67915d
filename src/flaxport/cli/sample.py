"""flaxport sample WORKLOAD --workdir DIR [--n N]: pictures from a run's newest checkpoint."""
from __future__ import annotations

import json

from flaxport.cli.evaluate import load_trained
from flaxport.cli import common
from flaxport.errors import UserError


def add_parser(sub):
    p = sub.add_parser("sample", help="draw samples from a trained run and write its pictures")
    p.add_argument("workload")
    p.add_argument("--workdir", required=True)
    p.add_argument("--n", type=int, default=None, help="how many samples (generative workloads)")
    p.add_argument("--data-dir", default=None, help="where real datasets live (default $FLAXPORT_DATA)")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    workload, config, info, evaluate = load_trained(args.workload, args.workdir)
    if args.n is not None and not (hasattr(config, "n_eval") or hasattr(config, "n_samples")):
        raise UserError(f"--n: {workload.name} draws no samples; `sample` rewrites its pictures from the checkpoint")
    if args.n is not None and args.n < 1:
        raise UserError(f"--n must be at least 1, got {args.n}")
    data = common.load_data(workload, config, args)
    quality, artifacts = evaluate(data, args.n)
    paths = workload.write_pictures(args.workdir, data, artifacts, f"{workload.name}, epoch {info.get('epochs_done')}")
    print(json.dumps({"pictures": [str(p) for p in paths], "quality": quality}))
    return 0
