"""flaxport compare WORKLOAD: every framework/runner on the same data and config, one run."""
from __future__ import annotations

import os
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError
from flaxport.harness.metrics import info

RUNS = ("torch-eager", "torch-tuned", "jax-step", "jax-scan", "keras-jax", "jax-vmap", "torch-vmap")
# Runs that train every seed of --seeds as one program (harness.vmap, harness.torch_vmap).
VECTORISED = ("jax-vmap", "torch-vmap")


def add_parser(sub):
    p = sub.add_parser("compare", help="train every twin in one run and report speed and quality")
    common.add_train_flags(p, epochs_default=5)
    p.add_argument("--runs", default=None,
                   help=f"comma-separated subset of {','.join(RUNS)} (default: all the workload has)")
    p.add_argument("--seeds", type=int, default=1,
                   help="seeds SEED..SEED+N-1: every run trains them all (jax-vmap and torch-vmap, added when N > 1, "
                        "as one program each)")
    p.add_argument("--sequential-seeds", type=int, default=None, metavar="M",
                   help="with --seeds N: the runs that train one seed at a time take only the first M seeds, "
                        "torch-eager the first one (a speed comparison: member-steps/s does not depend on M)")
    p.set_defaults(run=run)


def run(args) -> int:
    from flaxport.bench import figure, report

    workload, config = common.workload_and_config(args)
    available = [r for r in RUNS if (r != "keras-jax" or workload.keras_twin) and (r != "torch-vmap" or _torch_vmap(workload))]
    default = [r for r in available if args.seeds > 1 or r not in VECTORISED]
    runs = default if args.runs is None else [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in available]
    if unknown or not runs:
        raise UserError(f"--runs: {workload.name} has no {','.join(unknown) or '(empty)'}; "
                        f"choose from {','.join(available)}")
    if "keras-jax" in runs and os.environ.setdefault("KERAS_BACKEND", "jax") != "jax":
        raise UserError(f"the keras-jax run needs Keras on JAX, but KERAS_BACKEND={os.environ['KERAS_BACKEND']}")
    if args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    sequential = args.seeds if args.sequential_seeds is None else args.sequential_seeds
    if not 1 <= sequential <= args.seeds:
        raise UserError(f"--sequential-seeds must be 1 to --seeds ({args.seeds}), got {sequential}")
    seeds = list(range(args.seed, args.seed + args.seeds))
    workdir = Path(args.workdir or common.default_workdir("compare", workload.name, config.variant))
    data = common.load_data(workload, config, args)
    config = workload.configure(config, data) if workload.configure else config
    info(f"compare {workload.name} ({config.variant} config, {args.epochs} epochs, data {data.name}) in {workdir}")
    members = None
    if "jax-vmap" in runs:  # a stack too large for memory is refused before any run starts
        from flaxport.harness import vmap
        from flaxport.harness.metrics import steps_per_epoch

        vmap.check_memory(workload, config, args.seeds, data, steps_per_epoch(data, config.batch_size))
        members = vmap.plan(args.seed, args.seeds, [])
    results = []
    for name in runs:
        if name in VECTORISED:
            info(f"-- {name} (seeds {seeds[0]}-{seeds[-1]} as one program)")
            results += _run_vectorised(name, workload, config, workdir / name, seeds, members, args.epochs, data, args)
            continue
        # With --sequential-seeds the one-seed-at-a-time runs time a subset, torch-eager one seed.
        for seed in seeds[:1 if name == "torch-eager" and args.sequential_seeds else sequential]:
            run_dir = workdir / (name if args.seeds == 1 else f"{name}-seed{seed}")
            info(f"-- {name} (seed {seed})")
            results.append((seed, _run_one(name, workload, config, run_dir, seed, args.epochs, data, args)))
    rep = report.build(workload, config, args.epochs, results)
    figure.write(workdir / "compare.png", workload, config, rep, results)
    report.write(workdir, rep)
    print(report.to_markdown(rep))
    info(f"wrote {workdir / 'report.md'}, {workdir / 'report.json'} and {workdir / 'compare.png'}")
    return 0


def _torch_vmap(workload) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"{workload.torch_twin}_vmap") is not None


def _clear(run_dir: Path, members: bool = False) -> None:
    """A comparison is re-run from scratch, but only a previous run's folder is removed
    (for a vectorised run: a folder of member runs)."""
    if not run_dir.exists():
        return
    if members:
        ok = all(p.is_dir() and (p / "config.json").exists() for p in run_dir.iterdir())
    else:
        ok = not any(run_dir.iterdir()) or (run_dir / "config.json").exists()
    if not ok:
        raise UserError(f"{run_dir} exists and is not a flaxport run; choose another --workdir")
    import shutil

    shutil.rmtree(run_dir)


def _run_vectorised(name, workload, config, run_dir, seeds, members, epochs, data, args) -> list:
    """[(seed, RunResult)] of every member of one vectorised run (one workdir each: run_dir/seedS)."""
    _clear(run_dir, members=True)
    if name == "jax-vmap":
        from flaxport.harness import vmap

        out = vmap.train_stack(workload, config, members, workdir=run_dir, epochs=epochs, data=data,
                               checkpoints=False, progress=not args.no_progress)
    else:
        from flaxport.harness import torch_vmap

        out = torch_vmap.train(workload, config, seeds, workdir=run_dir, epochs=epochs, data=data,
                               progress=not args.no_progress)
    return list(zip(seeds, out))


def _run_one(name, workload, config, run_dir, seed, epochs, data, args):
    kw = dict(workdir=run_dir, seed=seed, epochs=epochs, data=data, checkpoints=False,
              progress=not args.no_progress, resume=False)
    _clear(run_dir)
    if name == "keras-jax":
        from flaxport.harness import keras_loop

        return keras_loop.train(workload, config, name=name, **kw)
    if name.startswith("jax-"):
        from flaxport.harness import loop

        return loop.train(workload, config, runner=name.split("-", 1)[1], name=name, **kw)
    from flaxport.harness import torch_loop

    return torch_loop.train(workload, config, options=torch_loop.VARIANTS[name.split("-", 1)[1]], **kw)
