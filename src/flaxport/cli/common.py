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
    """(Workload, config) for args.workload / --config / --set."""
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
    return workload, config


def apply_overrides(config, items):
    """config with KEY=VALUE strings applied, each parsed as the field's current type."""
    fields = {f.name for f in dataclasses.fields(config)}
    changes = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        if key not in fields or key == "variant":
            raise UserError(f"--set: {config.__class__.__module__.split('.')[-2]} config has no field {key!r}")
        changes[key] = _parse_like(getattr(config, key), raw, key)
        current = getattr(config, key)
        if isinstance(current, int) and not isinstance(current, bool) and current > 0 and changes[key] < 1:
            raise UserError(f"--set {key}: must be at least 1, got {changes[key]}")  # sizes, counts, epochs
        allowed = getattr(type(config), "CHOICES", {}).get(key)
        if allowed and changes[key] not in allowed:
            raise UserError(f"--set {key}: {raw!r} is not one of {', '.join(allowed)}")
    return dataclasses.replace(config, **changes)


def _parse_like(current, raw: str, key: str):
    try:
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(current, tuple):
            kind = type(current[0]) if current else float
            return tuple(kind(x) for x in raw.split(",") if x)
        return type(current)(raw)
    except ValueError:
        raise UserError(f"--set {key}: cannot read {raw!r} as {type(current).__name__}") from None


def config_from_dict(workload, saved: dict):
    """The config a run used, from its config.json."""
    base = workload.get_config(saved.get("variant", "default"))
    fields = {f.name for f in dataclasses.fields(base)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
    return dataclasses.replace(base, **values)


def read_run(workdir) -> dict:
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise UserError(f"{workdir} is not a flaxport run directory (no config.json)")
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from e


def default_workdir(*parts) -> str:
    return str(Path("runs") / "-".join(str(p) for p in parts if p))


def load_data(workload, config, args):
    """The run's dataset; says on stderr which one (source, sizes)."""
    from flaxport.harness.metrics import info

    data = workload.load_data(config, getattr(args, "data", None), getattr(args, "data_dir", None)
                              or os.environ.get("FLAXPORT_DATA"))
    from flaxport.harness.metrics import steps_per_epoch

    steps_per_epoch(data, config.batch_size)  # too few examples: refuse before a workdir is made
    sizes = "/".join(str(len(next(iter(split.values())))) for split in (data.train, data.test) if split)
    info(f"data: {data.name} ({data.meta.get('source', 'synthetic')}; {sizes} train/test examples)")
    return data
