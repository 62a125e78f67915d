"""flaxport train WORKLOAD [--framework jax|torch|keras] [--runner step|scan] ..."""
from __future__ import annotations

import json

from flaxport.cli import common, stack
from flaxport.errors import UserError
from flaxport.harness.metrics import info


def add_parser(sub):
    p = sub.add_parser("train", help="train a workload in one framework")
    common.add_train_flags(p)
    p.add_argument("--framework", default="jax", choices=common.FRAMEWORKS, help="which twin trains")
    p.add_argument("--runner", default=None, choices=("step", "scan"), help="jax: jit per step or scan-fused epoch")
    p.add_argument("--torch-variant", default="eager", choices=("eager", "tuned", "compiled"),
                   help="torch: the seed's loop, tuned for CPU, or tuned + torch.compile")
    p.add_argument("--resume", action="store_true", help="continue from the workdir's newest checkpoint")
    p.add_argument("--init-from", default=None, metavar="FILE",
                   help="jax: start from a PyTorch checkpoint's weights (.pt/.pth/.safetensors; optimizer fresh)")
    common.add_scale_flags(p)
    stack.add_flags(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if stack.wanted(args):  # several runs as one vectorised program
        stack.check_flags(args)
        return stack.run(args, *common.workload_and_config(args))
    joined = False
    if args.framework == "jax":
        joined = common.join_distributed(args)  # before JAX makes its devices
    elif args.devices or args.coordinator or args.num_processes is not None or args.process_id is not None:
        raise UserError(f"--devices and the multi-process flags are for --framework jax, not {args.framework}")
    workload, config = common.workload_and_config(args)
    main = True  # in a multi-process run, process 0 alone reports
    if joined:
        import jax

        main = jax.process_index() == 0
    if args.init_from and args.framework != "jax":
        raise UserError(f"--init-from carries torch weights into Flax: it needs --framework jax, not {args.framework}")
    if args.framework == "keras" and not workload.keras_twin:
        raise UserError(f"{workload.name} has no Keras twin; --framework jax or torch")
    workdir = args.workdir or common.default_workdir(workload.name, args.framework, config.variant)
    data = common.load_data(workload, config, args)
    config = workload.configure(config, data) if workload.configure else config
    if main:
        info(f"{workload.name}: training {args.framework} on {data.name} ({config.variant} config) in {workdir}")
    if args.framework == "jax":
        from flaxport.harness import loop

        _note_native_convs_unsharded(config, args.devices, main)
        result = loop.train(workload, config, workdir=workdir, seed=args.seed, epochs=args.epochs,
                            runner=args.runner, resume=args.resume, data=data, progress=not args.no_progress,
                            devices=args.devices, init_state=_from_torch(workload, args.init_from))
    elif args.framework == "keras":
        from flaxport.harness import keras_loop

        result = keras_loop.train(workload, config, workdir=workdir, seed=args.seed, epochs=args.epochs,
                                  resume=args.resume, data=data, progress=not args.no_progress)
    else:
        from flaxport.harness import torch_loop

        options = torch_loop.VARIANTS[args.torch_variant]
        result = torch_loop.train(workload, config, workdir=workdir, seed=args.seed, epochs=args.epochs,
                                  resume=args.resume, data=data, options=options, progress=not args.no_progress)
    if not main:
        return 0
    print(json.dumps({"workdir": str(workdir), "name": result.name, "quality": result.quality,
                      "epoch_seconds": [round(s, 4) for s in result.epoch_seconds],
                      "compile_seconds": round(result.compile_seconds, 4)}))
    return 0


def _from_torch(workload, path):
    """init_state(config, key) reading the weights of torch checkpoint `path`, or None."""
    if not path:
        return None
    from pathlib import Path

    if not Path(path).is_file():
        raise UserError(f"--init-from: no file {path}")

    def init_state(config, key):
        from flaxport.workloads.checkpoints import init_state_from_torch

        info(f"{workload.name}: weights and statistics from {path} (optimizer starts fresh)")
        return init_state_from_torch(workload, config, path, key)

    return init_state


def _note_native_convs_unsharded(config, devices, main: bool) -> None:
    """flaxport's FFI convs carry no partitioning rule: on a mesh XLA gathers the whole
    batch around each of them (right numbers, no speed-up). Say so, and how to avoid it."""
    import jax

    if getattr(config, "conv_impl", None) == "native" and (devices or jax.device_count()) > 1 and main:
        info("note: conv_impl=native runs each conv on the whole batch on every device; "
             "--set conv_impl=im2col shards them")

