"""flaxport evaluate WORKLOAD --workdir DIR: quality of a run's newest checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

from flaxport.cli import common
from flaxport.errors import UserError


def add_parser(sub):
    p = sub.add_parser("evaluate", help="quality metrics of a trained run")
    p.add_argument("workload", help="gan, cnn, vae or ddim")
    p.add_argument("--workdir", required=True, help="a run of any framework (its newest checkpoint)")
    p.add_argument("--data-dir", default=None, help="where real datasets live (default $FLAXPORT_DATA)")
    common.add_debug(p)
    p.set_defaults(run=run)


def restore(workload_name: str, workdir, n=None, steps=None):
    """(workload, config, run_info, framework, state, seed) of a workdir's newest good checkpoint:
    state is the Flax train state (jax runs) or the twin's state (torch runs; None for keras,
    which load_trained reads). n, steps: the sample count and sampler steps a caller will
    use (see _with_n), checked against the memory free here before anything is loaded."""
    from flaxport.workloads import registry

    common.setup_jax(workload_name)
    workload = registry.get(workload_name)
    run = common.load_run(workload, workdir)
    config, seed, framework = run.config, run.seed, run.framework
    context = f"--n {n}: " if n is not None else ""
    common.check_memory(workload.name, _with_n(config, n, steps), context)
    meta = {"workload": workload.name, "framework": framework, "variant": config.variant, "seed": seed}
    if framework == "jax":
        from flaxport.harness import rng
        from flaxport.harness.store import open_store

        ckpt = open_store("jax", Path(workdir) / "checkpoints")
        try:  # close Orbax's background loop on every path
            if ckpt.latest() is None:
                raise UserError(f"no checkpoint in {Path(workdir) / 'checkpoints'}")
            state, info = ckpt.restore(workload.init_state(config, rng.streams(seed)["init"]), meta)
        finally:
            ckpt.close()
        return workload, config, info, framework, state, seed
    if framework == "keras":
        return workload, config, meta, framework, None, seed  # load_trained reads keras checkpoints
    import importlib

    from flaxport.harness import torch_loop

    ts = importlib.import_module(workload.torch_twin).init_state(config, seed)
    _, info = torch_loop.checkpoint_store(workdir).restore(ts, meta)
    return workload, config, info, framework, ts, seed


def load_trained(workload_name: str, workdir, n=None, steps=None):
    """(workload, config, run_info, evaluate(data, n=None, steps=None) -> (quality, artifacts))
    from a workdir's newest good checkpoint; n and steps override the sample count and the
    sampler's steps (see _with_n), and are checked against the memory free here first."""
    workload, config, info, framework, state, seed = restore(workload_name, workdir, n, steps)
    if framework == "jax":
        from flaxport.harness import rng

        return workload, config, info, lambda data, n=None, steps=None: workload.evaluate(
            _with_n(config, n, steps), state, data, rng.at(rng.streams(seed)["eval"], 0))
    if framework == "keras":
        return _load_keras(workload, config, info, workdir, seed)
    import importlib

    from flaxport.harness import torch_loop

    twin = importlib.import_module(workload.torch_twin)
    return workload, config, info, lambda data, n=None, steps=None: twin.evaluate(
        _with_n(config, n, steps), state, data, torch_loop.stream_seed(seed, "eval"))


def _load_keras(workload, config, meta, workdir, seed):
    from flaxport.harness import keras_loop, torch_loop

    twin = keras_loop.twin_of(workload)
    meta = {**meta, "keras_backend": twin.keras.backend.backend()}
    ks = twin.init_state(config, seed)
    _, info = keras_loop.checkpoint_store(workdir).restore(ks, meta)
    return workload, config, info, lambda data, n=None, steps=None: twin.evaluate(
        _with_n(config, n, steps), ks, data, torch_loop.stream_seed(seed, "eval"))


# The config field a sampling-steps override sets (`sample --steps`), where a workload has one.
STEPS_FIELD = "plot_diffusion_steps"


def _with_n(config, n, steps=None):
    """config with its sample count set to n: n_eval (gan) or n_samples (vae, ddim), and
    its sampler's steps (STEPS_FIELD: ddim's pictures) to `steps`."""
    import dataclasses

    if steps is not None:
        config = dataclasses.replace(config, **{STEPS_FIELD: steps})
    if n is None:
        return config
    field = "n_eval" if hasattr(config, "n_eval") else "n_samples"
    return dataclasses.replace(config, **{field: n})


def run(args) -> int:
    workload, config, info, evaluate = load_trained(args.workload, args.workdir)
    data = common.load_data(workload, config, args)
    quality, _ = evaluate(data)
    print(json.dumps({"workdir": args.workdir, "epochs_done": info.get("epochs_done"), "quality": quality}))
    return 0
