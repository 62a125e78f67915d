"""The translated CNN against the hand-written Flax CNN: `python -m flaxport.bench.translate`.

The cnn workload's torch twin is translated twice (torch's layout, and --layout nhwc) and
timed against the workload's own hand-written Flax CNN holding the same weights (ported
by its key map): the jitted eval-mode forward on one batch of the config's batch size,
steady state, in interleaved rounds (a slow spell of the shared machine hits every model
alike), medians compared; compile times are reported apart. The hand-written model runs
twice: with the config's convolution (flaxport's native FFI kernels on CPU) and with
XLA's convolution, and the translation four times: torch's layout and --layout nhwc,
each with --conv xla (XLA's convolutions only) and with --conv native (the default: the
file calls flaxport's kernels), so the figures say which part is layout and which is the
kernel.

With --train it times the train step instead: train_step.py as `translate --optimizer
"torch.optim.Adam(lr=1e-3)" --loss "torch.nn.functional.nll_loss"` writes it (the config's
Adam, NLL on the log-probabilities), against the workload's hand-written jitted
`make_train_step` (the `jax-step` runner's step), both donating their state.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time


# (row name, translate's layout, translate's conv)
TRANSLATIONS = (("translated (nchw, --conv xla)", "nchw", "xla"), ("translated (nhwc, --conv xla)", "nhwc", "xla"),
                ("translated (nchw)", "nchw", "native"), ("translated (nhwc)", "nhwc", "native"))


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.translate", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds (default 30)")
    p.add_argument("--calls", type=int, default=10, help="forward calls per round (default 10)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the cnn config's, 32)")
    p.add_argument("--train", action="store_true", help="time one train step (forward, backward, Adam) instead")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    for name in ("rounds", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def run(args) -> dict:
    """The figures, for parsed `args`."""
    from flaxport.harness.cpu import tune_allocator

    tune_allocator()
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    from flaxport.translate import translate
    from flaxport.workloads.cnn import config as config_lib
    from flaxport.port import port_weights
    from flaxport.workloads.cnn import model, model_torch

    config = config_lib.get_config("default")
    batch = args.batch or config.batch_size
    torch.manual_seed(0)
    twin = model_torch.CNN(config).eval()
    images = torch.rand(batch, config.channels, config.image_size, config.image_size,
                        generator=torch.Generator().manual_seed(1))
    images_nchw = jnp.asarray(images.numpy())
    images_nhwc = jnp.asarray(images.numpy().transpose(0, 2, 3, 1))

    if args.train:
        return _time(args, batch, jax, _train_runs(config, twin, images, jnp, np), config)
    runs = {}
    for name, layout, conv in TRANSLATIONS:
        t = translate(twin, images, layout=layout, conv=conv, check=False)
        # The model's arrays as a flat list: an nnx.State argument takes jit's slower Python
        # dispatch path (2 ms a call here), a list of arrays its fast one.
        graphdef, state = nnx.split(t.model)
        leaves, treedef = jax.tree.flatten(state)
        fn = jax.jit(lambda arrays, x, g=graphdef, d=treedef: nnx.merge(g, jax.tree.unflatten(d, arrays))(x))
        runs[name] = (fn, leaves, images_nchw)
    for impl in (config.conv_impl, "xla"):
        cfg = dataclasses.replace(config, conv_impl=impl)
        net = model.cnn(cfg)
        variables = port_weights(twin, net, (images.numpy(),), flatten_shapes={"fc1": model.flat_geometry(cfg)})
        fn = jax.jit(lambda v, x, net=net: net.apply(v, x, train=False))
        runs[f"hand-written ({impl} conv)"] = (fn, jax.tree.map(jnp.asarray, variables), images_nhwc)
    return _time(args, batch, jax, runs, config)


def _train_runs(config, twin, images, jnp, np) -> dict:
    """{name: (step(box, x) -> output, box holding the state, x)} for the train steps."""
    import dataclasses as dc

    import jax
    import torch

    from flaxport.translate import translate
    from flaxport.translate.train_step import Loss, write_train_step
    from flaxport.translate.training.proof import namespace
    from flaxport.workloads.cnn import step as cnn_step

    labels = np.random.default_rng(0).integers(0, config.num_classes, images.shape[0]).astype(np.int32)
    runs = {}
    adam = ("Adam", {"lr": config.lr, "betas": (config.b1, config.b2), "eps": config.adam_eps})
    for name, layout, conv in TRANSLATIONS:
        t = translate(twin.train(), images, layout=layout, conv=conv, check=False)
        made = write_train_step(t, twin, adam, Loss("nll_loss", {}, "F.nll_loss"), check=False)
        train_step, state, _ = namespace(made.source)["make_train_step"](t.new_model())

        def run(box, x, train_step=train_step):
            box[0], loss = train_step(box[0], x, jnp.asarray(labels))
            return loss

        runs[f"{name} train_step.py"] = (run, [state], jnp.asarray(images.numpy()))
    batch = {"image": jnp.asarray((images.numpy().transpose(0, 2, 3, 1) * 255).astype(np.uint8)),
             "label": jnp.asarray(labels)}
    for impl in (config.conv_impl, "xla"):
        cfg = dc.replace(config, conv_impl=impl)
        step = jax.jit(cnn_step.make_train_step(cfg), donate_argnums=0)

        def run(box, b, step=step):
            box[0], metrics = step(box[0], b, jax.random.key(0))
            return metrics["loss"]

        runs[f"hand-written ({impl} conv)"] = (run, [cnn_step.init_state(cfg, jax.random.key(0))], batch)
    return runs


def _time(args, batch, jax, runs, config) -> dict:
    import numpy as np

    compile_seconds, outputs = {}, {}
    for name, (fn, params, x) in runs.items():
        t0 = time.perf_counter()
        outputs[name] = np.asarray(jax.block_until_ready(fn(params, x)))
        compile_seconds[name] = round(time.perf_counter() - t0, 2)
        jax.block_until_ready(fn(params, x))
    seconds = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (fn, params, x) in runs.items():
            t0 = time.perf_counter()
            for _ in range(args.calls):
                out = fn(params, x)
            jax.block_until_ready(out)
            seconds[name].append((time.perf_counter() - t0) / args.calls)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    reference = outputs[f"hand-written ({config.conv_impl} conv)"]
    return {"batch": batch, "train": bool(args.train), "rounds": args.rounds, "calls": args.calls,
            "jax": jax.__version__,
            "median_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
            "min_ms": {k: round(min(v) * 1e3, 3) for k, v in seconds.items()},
            "compile_seconds": compile_seconds,
            "ratio_vs_hand_written": {k: round(v / median[f"hand-written ({config.conv_impl} conv)"], 3)
                                      for k, v in median.items()},
            "ratio_vs_hand_written_xla_conv": {k: round(v / median["hand-written (xla conv)"], 3)
                                               for k, v in median.items()},
            "max_abs_output_difference": ({} if args.train else
                                          {k: float(np.max(np.abs(v - reference))) for k, v in outputs.items()})}


def main(argv=None) -> int:
    args = _args(argv)
    r = run(args)
    what = "train step (forward, backward, Adam)" if r["train"] else "forward, jitted, eval mode"
    print(f"cnn {what}, batch {r['batch']}; {r['rounds']} interleaved rounds of {r['calls']} calls; compile apart")
    print("| model | median (ms) | min (ms) | vs hand-written | vs hand-written, xla conv | compile (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ms in r["median_ms"].items():
        print(f"| {name} | {ms:.2f} | {r['min_ms'][name]:.2f} | {r['ratio_vs_hand_written'][name]:.2f}x | "
              f"{r['ratio_vs_hand_written_xla_conv'][name]:.2f}x | {r['compile_seconds'][name]} |")
    if r["max_abs_output_difference"]:
        worst = max(r["max_abs_output_difference"].values())
        print(f"all {len(r['median_ms'])} compute the same log-probabilities (max |difference| {worst:.1e})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
