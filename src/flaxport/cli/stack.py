"""`train --seeds K` / `--sweep KEY=V1,V2`: the command-line side of harness.vmap (not a subcommand)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError
from flaxport.harness.metrics import info


def add_flags(p) -> None:
    p.add_argument("--seeds", type=int, default=None, metavar="K",
                   help="jax: train seeds SEED..SEED+K-1 as one vectorised program, one workdir each")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                   help="jax: train every value (the cross product of several --sweep, times --seeds) "
                        "as one vectorised program; hyperparameters that keep shapes only")


def wanted(args) -> bool:
    return args.seeds is not None or bool(args.sweep)


def check_flags(args) -> None:
    """Refusals that need neither JAX nor data."""
    if args.seeds is not None and args.seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {args.seeds}")
    common.check_seeds(args.seed, args.seeds)
    if args.framework != "jax":
        raise UserError(f"--seeds/--sweep train one vectorised JAX program; --framework {args.framework} trains "
                        "one run (compare --seeds runs torch-vmap)")
    if args.runner not in (None, "scan"):
        raise UserError("--seeds/--sweep run the scan runner (the vmapped step inside one scan), not --runner step")
    if args.init_from:
        raise UserError("--init-from starts one run from torch weights; it does not combine with --seeds/--sweep")
    if args.devices not in (None, 1) or args.coordinator or args.num_processes is not None or args.process_id is not None:
        raise UserError("--seeds/--sweep train on one device in one process (no --devices/multi-process flags)")


def check_members(config, sweep: list, members: list) -> None:
    """Every swept value, then every member's config, through the validator --set goes
    through (flaxport.workloads.validate): a member is refused before it could train."""
    from flaxport.workloads import validate

    for key, values in sweep:
        for raw, value in values:
            validate.check(dataclasses.replace(config, **{key: value}), f"--sweep {key}={raw}", blame={key})
    for m in members:
        validate.check(dataclasses.replace(config, **m.settings), f"--sweep member {m.name}", blame=set(m.settings))


def run(args, workload, config) -> int:
    from flaxport.bench import sweep as sweep_report
    from flaxport.harness import vmap

    from flaxport.harness.metrics import steps_per_epoch

    sweep = vmap.parse_sweep(config, args.sweep)
    check_members(config, sweep, vmap.plan(args.seed, args.seeds, sweep))
    workdir = args.workdir or common.default_workdir(workload.name, "jax", config.variant, "stack")
    data = common.load_data(workload, config, args)
    config = workload.configure(config, data) if workload.configure else config
    vmap.check_memory(workload, config, vmap.count(args.seeds, sweep), data, steps_per_epoch(data, config.batch_size))
    members = vmap.plan(args.seed, args.seeds, sweep)
    info(f"{workload.name}: training {len(members)} members as one jax program on {data.name} "
         f"({config.variant} config) in {workdir}")
    results = vmap.train_stack(workload, config, members, workdir=workdir, epochs=args.epochs, resume=args.resume,
                               data=data, progress=not args.no_progress)
    epochs = args.epochs if args.epochs is not None else config.epochs
    rep = sweep_report.build(workload, config, epochs, members, results)
    paths = sweep_report.write(workdir, rep)
    info(f"wrote {', '.join(str(p) for p in paths)}")
    print(json.dumps({"workdir": str(workdir), "members": [
        {"name": m.name, "workdir": str(Path(workdir) / m.name), "quality": r.quality,
         "dropped": r.settings.get("dropped")} for m, r in zip(members, results)],
        "epoch_seconds": [round(s, 4) for s in results[0].epoch_seconds],
        "compile_seconds": round(results[0].compile_seconds, 4),
        "member_steps_per_second": rep["member_steps_per_second"]}))
    return 0
