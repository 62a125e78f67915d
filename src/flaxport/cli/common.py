"""Flags and helpers shared by the subcommands."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from flaxport.errors import UserError

FRAMEWORKS = ("jax", "torch", "keras")


def add_debug(p):
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def add_train_flags(p, epochs_default=None):
    """The `train` contract every workload honours (compare shares most of it)."""
    p.add_argument("workload", help="gan, cnn, vae or ddim")
    p.add_argument("--config", default="default", help="config variant: default, smoke, bench (gan also: tuned, quick)")
    p.add_argument("--epochs", type=int, default=epochs_default,
                   help="epochs (default: the config's)" if epochs_default is None else "epochs")
    p.add_argument("--seed", type=int, default=0, help="root seed: init, shuffles and every random draw")
    p.add_argument("--workdir", default=None, help="run directory (default runs/WORKLOAD-...)")
    p.add_argument("--data", default=None, metavar="SOURCE", help="dataset source (workload-specific)")
    p.add_argument("--data-dir", default=None, help="where real datasets live (default $FLAXPORT_DATA)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_debug(p)


def setup_jax(workload_name: str) -> None:
    """Process-wide JAX settings for the workload; must run before JAX starts."""
    from flaxport.harness.cpu import tune_allocator, tune_for_tiny_models
    from flaxport.workloads import registry

    tune_allocator()
    if registry.prefers_single_thread(workload_name):
        tune_for_tiny_models()


def add_scale_flags(p):
    """Data parallelism and multi-process flags of `train` (jax only)."""
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help="jax: train data-parallel on N devices (default: all visible; the batch is split)")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="jax multi-process: process 0's address (or $JAX_COORDINATOR_ADDRESS)")
    p.add_argument("--num-processes", type=int, default=None, metavar="N",
                   help="jax multi-process: how many processes (or $JAX_NUM_PROCESSES)")
    p.add_argument("--process-id", type=int, default=None, metavar="I",
                   help="jax multi-process: this process, 0..N-1 (or $JAX_PROCESS_ID)")


def join_distributed(args) -> bool:
    """Join a multi-process JAX run when the flags or the environment ask for one.

    Runs before JAX starts: the workload's environment settings first (JAX reads them on
    import), then jax.distributed, then (in workload_and_config) the devices.
    """
    from flaxport.harness.cpu import tiny_model_env
    from flaxport.harness.distributed import join
    from flaxport.workloads import registry

    if registry.prefers_single_thread(args.workload):
        tiny_model_env()
    return join(getattr(args, "coordinator", None), getattr(args, "num_processes", None),
                getattr(args, "process_id", None))


def workload_and_config(args):
    """(Workload, config) for args.workload / --config / --set, every setting checked, and the
    memory the config needs checked against what is free (before anything is allocated)."""
    from flaxport.workloads import registry

    setup_jax(args.workload)
    workload = registry.get(args.workload)
    if args.config not in workload.variants:
        raise UserError(f"unknown config {args.config!r} for {workload.name}; choose one of: {', '.join(workload.variants)}")
    config = apply_overrides(workload.get_config(args.config), args.set)
    if getattr(args, "data", None):
        if args.data not in workload.data_sources:
            raise UserError(f"--data {args.data!r}: {workload.name} trains on {', '.join(workload.data_sources)}")
        if hasattr(config, "data"):  # recorded in config.json, so evaluate finds it again
            config = dataclasses.replace(config, data=args.data)
    if args.epochs is not None and args.epochs < 1:
        raise UserError(f"--epochs must be at least 1, got {args.epochs}")
    check_seed(args.seed)
    check_memory(workload.name, config)
    return workload, config


def check_seed(seed, flag: str = "--seed") -> int:
    """seed, if every framework's generator takes it (0 .. 2**63 - 1); else one UserError."""
    from flaxport.workloads.validate import check_seed as check

    return check(seed, flag)


def check_seeds(seed, count) -> None:
    """The last of `count` seeds from `seed` (SEED..SEED+count-1) is a seed too; else one UserError."""
    from flaxport.workloads.validate import SEED_LIMIT

    check_seed(seed)
    if count is not None and count > 1 and seed + count - 1 >= SEED_LIMIT:
        raise UserError(f"--seed {seed} with --seeds {count}: the last seed, {seed + count - 1}, is past 2**63 - 1; "
                        f"choose --seed {SEED_LIMIT - count} or lower")


def check_memory(workload_name: str, config, context: str = "") -> None:
    """Refuse a config that cannot fit in the memory free here (flaxport.workloads.validate)."""
    from flaxport.workloads.validate import check_memory as check

    check(workload_name, config, context)


def apply_overrides(config, items):
    """config with KEY=VALUE strings applied, each read as the field's type and checked
    against the field's rule (flaxport.workloads.validate)."""
    from flaxport.workloads.validate import check, parse_value

    fields = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        if key not in fields or key == "variant":
            raise UserError(f"--set: {config.__class__.__module__.split('.')[-2]} config has no field {key!r}")
        changes[key] = parse_value(config, key, raw)
    if not changes:
        return config
    return check(dataclasses.replace(config, **changes), "--set", blame=changes)


def config_from_dict(workload, saved: dict, where: str = "config.json"):
    """The config a run used, from its config.json's "config" object, every field checked."""
    from flaxport.workloads.validate import from_dict

    return from_dict(workload, saved, where)


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """What a workdir's config.json says about its run."""

    framework: str
    config: object
    seed: int
    saved: dict  # the whole file


def read_run(workdir) -> dict:
    """A workdir's config.json as a dict; one UserError line when there is none or it is not an object."""
    from flaxport.harness.workdir import read_config_json

    saved = read_config_json(workdir)
    if saved is None:
        raise UserError(f"{workdir} is not a flaxport run directory (no config.json)")
    return saved


def load_run(workload, workdir) -> SavedRun:
    """The run in `workdir` (its config.json), checked: this workload's, a known framework,
    a config whose every field keeps its rule, a valid seed. One UserError line otherwise."""
    path = Path(workdir) / "config.json"
    saved = read_run(workdir)
    if saved.get("workload") != workload.name:
        raise UserError(f"{workdir} holds a {saved.get('workload')!r} run, not {workload.name!r}")
    framework = saved.get("framework")
    if framework not in FRAMEWORKS:
        raise UserError(f"{path}: framework must be one of {', '.join(FRAMEWORKS)}, got {framework!r}")
    if "config" not in saved:
        raise UserError(f"{path}: no \"config\" (the run's settings)")
    config = config_from_dict(workload, saved["config"], str(path))
    seed = check_seed(saved["config"].get("seed", 0), f"{path}: seed")
    return SavedRun(framework, config, seed, saved)


def default_workdir(*parts) -> str:
    return str(Path("runs") / "-".join(str(p) for p in parts if p))


def load_data(workload, config, args):
    """The run's dataset; says on stderr which one (source, sizes)."""
    from flaxport.harness.metrics import info

    data_dir = getattr(args, "data_dir", None) or os.environ.get("FLAXPORT_DATA")
    if data_dir and Path(data_dir).expanduser().exists() and not Path(data_dir).expanduser().is_dir():
        origin = "--data-dir" if getattr(args, "data_dir", None) else "$FLAXPORT_DATA"
        raise UserError(f"{origin} {data_dir} is not a directory; point it at a folder for datasets")
    data = workload.load_data(config, getattr(args, "data", None), data_dir)
    from flaxport.harness.metrics import steps_per_epoch

    steps_per_epoch(data, config.batch_size)  # too few examples: refuse before a workdir is made
    sizes = "/".join(str(len(next(iter(split.values())))) for split in (data.train, data.test) if split)
    info(f"data: {data.name} ({data.meta.get('source', 'synthetic')}; {sizes} train/test examples)")
    return data
