"""DDIM sampling, JAX against PyTorch, interleaved: `python -m flaxport.bench.ddim_sampling`.

`compare ddim` times one 64-image sample per epoch, and on a shared 2-core machine a
single measurement swings by 30%. Here the two twins sample from the same weights and
noise in alternating rounds, so a slow spell hits both, and the medians are compared.
The JAX sampler is compiled before the clock (its compile is reported apart); torch runs
one untimed round first. Weights: the torch twin's keras init (seed 0) with a random head
(keras zero-initialises it, and a zero head would make every sample trivially equal),
converted to Flax.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.ddim_sampling", description=__doc__.splitlines()[0])
    p.add_argument("--config", default="bench", help="ddim config variant (default: bench, 32x32)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per framework (default 5)")
    p.add_argument("--n", type=int, default=64, help="images per sample (default 64)")
    p.add_argument("--steps", type=int, default=20, help="DDIM steps (default 20)")
    p.add_argument("--torch-threads", type=int, default=None, help="torch.set_num_threads (default: all cores)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    from flaxport.workloads.ddim import config as config_lib

    if args.config not in config_lib.VARIANTS:
        p.error(f"--config {args.config!r}: choose one of {', '.join(config_lib.VARIANTS)}")
    for name in ("rounds", "n", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def run(args) -> dict:
    """The figures of one benchmark, for parsed `args`."""
    from flaxport.harness.cpu import tune_allocator

    tune_allocator()  # as for every flaxport run, both frameworks
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from flaxport.workloads.ddim import config as config_lib, export, step, step_torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    config = config_lib.get_config(args.config)
    # Unit statistics: the figures do not depend on them, and no dataset is read.
    config = dataclasses.replace(config, norm_mean=(0.0,) * config.channels, norm_std=(1.0,) * config.channels)
    twin = step_torch.init_state(config, 0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for net in (twin.model, twin.ema_model):
            net.head.weight.copy_(0.05 * torch.randn(net.head.weight.shape, generator=generator))
    variables = export.ema_variables(config, "torch", twin)
    side = config.image_size
    noise = np.random.default_rng(0).standard_normal((args.n, side, side, config.channels)).astype(np.float32)

    t0 = time.perf_counter()
    sampler = step.compiled_sampler(config, variables, args.steps, args.n)
    compile_seconds = time.perf_counter() - t0
    noise_nchw = torch.from_numpy(noise).permute(0, 3, 1, 2).contiguous()

    def jax_round():
        return np.asarray(sampler(variables, jnp.asarray(noise)))

    def torch_round():
        with torch.no_grad():
            return step_torch.generate(config, twin, noise_nchw, args.steps).permute(0, 2, 3, 1).numpy()

    images_jax, images_torch = jax_round(), torch_round()  # warm-up, and the twins agree
    seconds = {"jax": [], "torch-eager": []}
    for _ in range(args.rounds):
        for name, fn in (("jax", jax_round), ("torch-eager", torch_round)):
            t = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - t)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    return {"config": args.config, "n": args.n, "steps": args.steps, "rounds": args.rounds,
            "torch_threads": torch.get_num_threads(), "jax_compile_seconds": round(compile_seconds, 2),
            "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
            "median_seconds": {k: round(v, 3) for k, v in median.items()},
            "jax_speedup_vs_torch_eager": round(median["torch-eager"] / median["jax"], 3),
            "max_abs_image_difference": float(np.max(np.abs(images_jax - images_torch)))}


def main(argv=None) -> int:
    args = _args(argv)
    result = run(args)
    print(f"ddim sampling, {result['n']} images x {result['steps']} steps ({result['config']} config), "
          f"{result['rounds']} interleaved rounds; JAX compile {result['jax_compile_seconds']} s apart")
    print("| run | median (s) | min (s) | max (s) |\n|---|---:|---:|---:|")
    for name, values in result["seconds"].items():
        print(f"| {name} | {result['median_seconds'][name]:.3f} | {min(values):.3f} | {max(values):.3f} |")
    print(f"JAX vs torch eager ({result['torch_threads']} torch threads): "
          f"{result['jax_speedup_vs_torch_eager']:.2f}x; images agree to {result['max_abs_image_difference']:.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
