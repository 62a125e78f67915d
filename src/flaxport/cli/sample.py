"""flaxport sample WORKLOAD --workdir DIR [--n N]: pictures from a run's newest checkpoint."""
from __future__ import annotations

import json

from flaxport.cli.evaluate import load_trained
from flaxport.cli import common


def add_parser(sub):
    p = sub.add_parser("sample", help="draw samples from a trained run and write its pictures")
    p.add_argument("workload")
    p.add_argument("--workdir", required=True)
    p.add_argument("--n", type=int, default=None, help="how many samples")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    workload, config, info, evaluate = load_trained(args.workload, args.workdir)
    data = workload.load_data(config, None, None)
    quality, artifacts = evaluate(data, args.n)
    paths = workload.write_pictures(args.workdir, data, artifacts, f"{workload.name}, epoch {info.get('epochs_done')}")
    print(json.dumps({"pictures": [str(p) for p in paths], "quality": quality}))
    return 0
