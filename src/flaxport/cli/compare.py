"""flaxport compare WORKLOAD: every framework/runner on the same data and config, one run."""
from __future__ import annotations

import os
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError
from flaxport.harness.metrics import info

RUNS = ("torch-eager", "torch-tuned", "jax-step", "jax-scan", "keras-jax")


def add_parser(sub):
    p = sub.add_parser("compare", help="train every twin in one run and report speed and quality")
    common.add_train_flags(p, epochs_default=5)
    p.add_argument("--runs", default=None,
                   help=f"comma-separated subset of {','.join(RUNS)} (default: all the workload has)")
    p.add_argument("--seeds", type=int, default=1, help="repeat every run with seeds 0..N-1")
    p.set_defaults(run=run)


def run(args) -> int:
    from flaxport.bench import figure, report

    workload, config = common.workload_and_config(args)
    available = [r for r in RUNS if r != "keras-jax" or workload.keras_twin]
    runs = available if args.runs is None else [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in available]
    if unknown or not runs:
        raise UserError(f"--runs: {workload.name} has no {','.join(unknown) or '(empty)'}; "
                        f"choose from {','.join(available)}")
    if "keras-jax" in runs and os.environ.setdefault("KERAS_BACKEND", "jax") != "jax":
        raise UserError(f"the keras-jax run needs Keras on JAX, but KERAS_BACKEND={os.environ['KERAS_BACKEND']}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    workdir = Path(args.workdir or common.default_workdir("compare", workload.name, config.variant))
    data = common.load_data(workload, config, args)
    config = workload.configure(config, data) if workload.configure else config
    info(f"compare {workload.name} ({config.variant} config, {args.epochs} epochs, data {data.name}) in {workdir}")
    results = []
    for seed in range(args.seed, args.seed + args.seeds):
        for name in runs:
            run_dir = workdir / (name if args.seeds == 1 else f"{name}-seed{seed}")
            info(f"-- {name} (seed {seed})")
            results.append((seed, _run_one(name, workload, config, run_dir, seed, args.epochs, data, args)))
    rep = report.build(workload, config, args.epochs, results)
    figure.write(workdir / "compare.png", workload, config, rep, results)
    report.write(workdir, rep)
    print(report.to_markdown(rep))
    info(f"wrote {workdir / 'report.md'}, {workdir / 'report.json'} and {workdir / 'compare.png'}")
    return 0


def _run_one(name, workload, config, run_dir, seed, epochs, data, args):
    kw = dict(workdir=run_dir, seed=seed, epochs=epochs, data=data, checkpoints=False,
              progress=not args.no_progress, resume=False)
    if run_dir.exists():
        # A comparison is re-run from scratch, but only a previous run's folder is removed.
        if any(run_dir.iterdir()) and not (run_dir / "config.json").exists():
            raise UserError(f"{run_dir} exists and is not a flaxport run; choose another --workdir")
        import shutil

        shutil.rmtree(run_dir)
    if name == "keras-jax":
        from flaxport.harness import keras_loop

        return keras_loop.train(workload, config, name=name, **kw)
    if name.startswith("jax-"):
        from flaxport.harness import loop

        return loop.train(workload, config, runner=name.split("-", 1)[1], name=name, **kw)
    from flaxport.harness import torch_loop

    return torch_loop.train(workload, config, options=torch_loop.VARIANTS[name.split("-", 1)[1]], **kw)
