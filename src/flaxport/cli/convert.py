"""flaxport convert WORKLOAD SRC DST: torch checkpoint <-> Flax workdir, by file type.

  SRC .pt/.pth/.safetensors  ->  DST a new directory: a flaxport (jax) workdir, as
      `flaxport train` leaves one at epoch 0: config.json + checkpoints/0 (Orbax). Then
      `flaxport evaluate|sample WORKLOAD --workdir DST` use it, and
      `flaxport train WORKLOAD --workdir DST --resume --seed S` (S: config.json's seed)
      trains on from the torch weights (the optimizer starts fresh: torch's optimizer
      state is not converted). BatchNorm num_batches_tracked counters, which have no Flax
      slot, ride in the checkpoint's meta, so converting back is bit-exact.
  SRC a jax workdir          ->  DST .pt/.pth (a state_dict; {"G", "D"} for the GAN) or
      .safetensors (flat; GAN keys prefixed G./D.), from its newest good checkpoint.

ddim keeps an EMA copy of its UNet (what samples). A jax workdir's goes out beside the
weights: .pt {"model": state_dict, "ema_model": state_dict} (TorchDDIM.state_dict()'s keys,
so `ts.ema_model.load_state_dict(ckpt["ema_model"])`), .safetensors with the copy's keys
behind `ema_model.`. Coming in, the copy is read from those forms and from the torch twin's
checkpoint (its `ema_model`); a bare state_dict has none, and the workdir's EMA starts at
the weights (as a fresh run's does): the JSON line's "ema" says which.

The model's shapes come from --config/--set (default: the `default` config), or, for a
torch twin checkpoint `RUN/checkpoints/epoch_N.pt`, from RUN/config.json. Strict: every
key, shape and dtype must fit; a mismatch is one error line naming the key, and nothing
is written.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError


def add_parser(sub):
    p = sub.add_parser("convert", help="torch checkpoint (.pt/.safetensors) <-> Flax workdir")
    p.add_argument("workload", help="gan, cnn, vae or ddim")
    p.add_argument("src", metavar="SRC", help="a .pt/.pth/.safetensors file, or a jax workdir")
    p.add_argument("dst", metavar="DST", help="a new workdir (from a file), or a .pt/.pth/.safetensors file")
    p.add_argument("--config", default=None, help="config variant giving the model's shapes (default: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--seed", type=int, default=None,
                   help="the new workdir's seed (default: the torch run's, from its config.json; else 0)")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    common.setup_jax(args.workload)  # before anything imports jax
    from flaxport.workloads.checkpoints import FILE_SUFFIXES
    from flaxport.workloads.twins import part_names
    from flaxport.workloads import registry

    workload = registry.get(args.workload)
    part_names(workload.name)  # a workload that declares no twin parts: one line, before any work
    src, dst = Path(args.src), Path(args.dst)
    if not src.exists():
        raise UserError(f"{src}: no such file or directory")
    if src.is_dir():
        if dst.suffix not in FILE_SUFFIXES:
            raise UserError(f"{dst}: from a workdir, convert writes a .pt, .pth or .safetensors file")
        if args.config or args.set or args.seed is not None:
            raise UserError("--config, --set and --seed are for torch -> Flax; a workdir has its own")
        return _flax_to_torch(workload, src, dst)
    if dst.suffix in FILE_SUFFIXES:
        raise UserError(f"{dst}: from a torch file, convert writes a workdir (a directory), not a file")
    return _torch_to_flax(workload, src, dst, args)


def _torch_to_flax(workload, src: Path, dst: Path, args) -> int:
    from flaxport import fileset
    from flaxport.harness.store import open_store
    from flaxport.harness.workdir import write_json
    from flaxport.workloads.checkpoints import read_torch_file, split_ema, state_from_flat
    from flaxport.workloads.twins import ema_name

    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise UserError(f"{dst} exists and is not an empty directory; convert writes a new workdir")
    flat, meta = read_torch_file(src, workload)
    config, seed = _config(workload, src, meta, args)
    state, counters = state_from_flat(workload, config, flat)  # every check before anything is written
    identity = {"workload": workload.name, "framework": "jax"}

    def fill(workdir: Path) -> None:  # the new workdir, written whole beside DST, then renamed into place
        write_json(workdir / "config.json", {**identity, "config": {**dataclasses.asdict(config), "seed": seed,
                                                                    "runner": config.runner}})
        ckpt = open_store("jax", workdir / "checkpoints")
        try:
            ckpt.save(0, state, {**identity, "variant": config.variant, "seed": seed, "epochs_done": 0,
                                 "converted_from": str(src.resolve()), "torch_num_batches_tracked": counters})
        finally:
            ckpt.close()

    fileset.write(dst, fill)
    ema = ema_name(workload.name)
    extra = {"ema": f"{ema} from {src.name}" if split_ema(flat, workload)[1] else "the weights (none in the file)"
             } if ema else {}
    print(json.dumps({"workdir": str(dst), "from": str(src), "config": config.variant, "seed": seed,
                      "tensors": len(flat), **extra}))
    return 0


def _config(workload, src: Path, meta, args):
    """(config, seed): the torch run's own (RUN/config.json beside RUN/checkpoints/SRC) if there
    is one, else --config (or the checkpoint meta's variant) and seed 0; then --set, --seed."""
    saved = None
    run_json = src.resolve().parent.parent / "config.json"
    if meta is not None and src.resolve().parent.name == "checkpoints" and run_json.exists():
        if common.read_run(run_json.parent).get("workload") == workload.name:
            saved = common.load_run(workload, run_json.parent)
    if saved is not None and args.config is None:
        config, seed = saved.config, saved.seed
    else:
        variant = args.config or (meta or {}).get("variant") or "default"
        if variant not in workload.variants:
            raise UserError(f"unknown config {variant!r} for {workload.name}; choose one of: "
                            f"{', '.join(workload.variants)}")
        config, seed = workload.get_config(variant), 0
    config = common.apply_overrides(config, args.set)
    common.check_memory(workload.name, config)
    return config, seed if args.seed is None else common.check_seed(args.seed)


def _flax_to_torch(workload, src: Path, dst: Path) -> int:
    import jax
    import jax.numpy as jnp

    from flaxport.harness.store import open_store
    from flaxport.workloads.checkpoints import abstract_state, flat_from_state, write_torch_file

    run = common.load_run(workload, src)
    if run.framework != "jax":
        raise UserError(f"{src} is a {run.framework!r} run; its checkpoints/epoch_N.pt already is a "
                        "torch checkpoint (convert reads a jax workdir)")
    if dst.exists():
        raise UserError(f"{dst} exists; convert does not overwrite it")
    if not dst.parent.is_dir():
        raise UserError(f"{dst}: no folder {dst.parent}; create it first")
    config, seed = run.config, run.seed
    # A zero state of the right tree is all a restore needs: no init, nothing compiled.
    target = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), abstract_state(workload, config))
    ckpt = open_store("jax", src / "checkpoints")
    try:
        if ckpt.latest() is None:
            raise UserError(f"no checkpoint in {src / 'checkpoints'}")
        state, meta = ckpt.restore(target, {"workload": workload.name, "framework": "jax",
                                            "variant": config.variant, "seed": seed})
    finally:
        ckpt.close()
    flat = flat_from_state(workload, config, state, meta.get("torch_num_batches_tracked"))
    write_torch_file(dst, flat, workload)
    print(json.dumps({"file": str(dst), "from": str(src), "epochs_done": meta.get("epochs_done"),
                      "tensors": len(flat)}))
    return 0
