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
    from flaxport.bench import figure, ownership, report

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
    common.check_seeds(args.seed, args.seeds)
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
    plan = []  # (run name, its seeds, its folder)
    for name in runs:
        if name in VECTORISED:
            plan.append((name, seeds, workdir / name))
            continue
        # With --sequential-seeds the one-seed-at-a-time runs time a subset, torch-eager one seed.
        for seed in seeds[:1 if name == "torch-eager" and args.sequential_seeds else sequential]:
            plan.append((name, [seed], workdir / (name if args.seeds == 1 else f"{name}-seed{seed}")))
    held = _claim(workdir)
    try:
        made = ownership.recorded(workdir)
        for _, _, folder in plan:  # every folder it would replace is an earlier comparison's: checked first
            ownership.check(folder, made)
        held.commit(None)  # the comparison's folder holds no config.json (that marks a single run)
        made = {**{k: v for k, v in made.items() if (workdir / k).exists()}, **{f.name: None for _, _, f in plan}}
        ownership.record(workdir, made)
        for path in (workdir / "report.md", workdir / "compare.png"):  # the earlier comparison's, being re-made
            path.unlink(missing_ok=True)
        results = []
        for name, run_seeds, folder in plan:
            ownership.remove(folder, made)
            if name in VECTORISED:
                info(f"-- {name} (seeds {seeds[0]}-{seeds[-1]} as one program)")
                results += _run_vectorised(name, workload, config, folder, seeds, members, args.epochs, data, args)
            else:
                info(f"-- {name} (seed {run_seeds[0]})")
                results.append((run_seeds[0], _run_one(name, workload, config, folder, run_seeds[0], args.epochs,
                                                       data, args)))
            made[folder.name] = ownership.digest(folder)
            ownership.record(workdir, made)
        rep = {**report.build(workload, config, args.epochs, results), "made": made}
        figure.write(workdir / "compare.png", workload, config, rep, results)
        report.write(workdir, rep)
    finally:
        held.release()
    print(report.to_markdown(rep))
    info(f"wrote {workdir / 'report.md'}, {workdir / 'report.json'} and {workdir / 'compare.png'}")
    return 0


def _torch_vmap(workload) -> bool:
    import importlib.util

    return importlib.util.find_spec(f"{workload.torch_twin}_vmap") is not None


def _claim(workdir: Path):
    """The comparison's workdir, locked (a training or another comparison there is named);
    a single run's or a stack's workdir is refused. Nothing is written."""
    from flaxport.harness.workdir import claim

    held = claim(workdir, {}, resume=True, has_checkpoint=lambda w: False)
    for marker, what in (("config.json", "a single run"), ("checkpoints", "a stack of runs")):
        if (workdir / marker).exists():
            held.release()
            raise UserError(f"workdir {workdir} holds {what} ({marker}); choose another --workdir for a comparison")
    return held


def _run_vectorised(name, workload, config, run_dir, seeds, members, epochs, data, args) -> list:
    """[(seed, RunResult)] of every member of one vectorised run (one workdir each: run_dir/seedS)."""
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
    if name == "keras-jax":
        from flaxport.harness import keras_loop

        return keras_loop.train(workload, config, name=name, **kw)
    if name.startswith("jax-"):
        from flaxport.harness import loop

        return loop.train(workload, config, runner=name.split("-", 1)[1], name=name, **kw)
    from flaxport.harness import torch_loop

    return torch_loop.train(workload, config, options=torch_loop.VARIANTS[name.split("-", 1)[1]], **kw)
