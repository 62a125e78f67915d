"""Every route to a convolution on this CPU, per shape class: `python -m flaxport.bench.convs`.

For each shape class a CNN holds (3x3 and 1x1 convolutions, strided ones, the RGB stem,
depthwise and grouped ones) it times the forward, the input gradient and the weight
gradient through each route a translated file can take: flaxport's kernels
(`flaxport.kernels.conv.convolution`), XLA's own convolution (YNNPACK where it takes it,
else Eigen), and, for reference, torch's oneDNN (channels-last, the faster layout there).
In float32, or bfloat16 with `--dtype bfloat16` (the kernels then sum in float32, as oneDNN
does). All in one process with the same threads, interleaved rounds (each in a shuffled
order), each route timed over ~20 ms of calls after ~10 ms untimed (`convnets.warm`),
medians; GFLOP/s count 2 x the multiply-adds, the same figure for every route.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

# (name, batch, side, in channels, out channels, kernel, stride, groups): the shapes of
# ResNet, MobileNet, EfficientNet, ConvNeXt and ResNeXt at 224x224 (and their 64x64 tails).
CLASSES = (
    ("3x3, 64 channels, 56x56", 8, 56, 64, 64, 3, 1, 1),
    ("3x3, 256 channels, 14x14", 8, 14, 256, 256, 3, 1, 1),
    ("3x3, 512 channels, 4x4", 8, 4, 512, 512, 3, 1, 1),
    ("3x3 stride 2, 128 -> 256", 8, 28, 128, 256, 3, 2, 1),
    ("7x7 stride 2 stem, RGB -> 64", 8, 224, 3, 64, 7, 2, 1),
    ("1x1, 256 -> 64, 56x56", 8, 56, 256, 64, 1, 1, 1),
    ("1x1 stride 2, 256 -> 512", 8, 56, 256, 512, 1, 2, 1),
    ("1x1, 40 -> 240, 28x28", 8, 28, 40, 240, 1, 1, 1),
    ("1x1, 2048 -> 512, 7x7", 8, 7, 2048, 512, 1, 1, 1),
    ("1x1, 1024 -> 1024, 4x4", 8, 4, 1024, 1024, 1, 1, 1),
    ("depthwise 3x3, 144 channels, 56x56", 8, 56, 144, 144, 3, 1, 144),
    ("depthwise 3x3 stride 2, 96 channels", 8, 112, 96, 96, 3, 2, 96),
    ("depthwise 5x5, 240 channels, 28x28", 8, 28, 240, 240, 5, 1, 240),
    ("depthwise 7x7, 96 channels, 56x56", 8, 56, 96, 96, 7, 1, 96),
    ("grouped 3x3, 32 groups of 4, 56x56", 8, 56, 128, 128, 3, 1, 32),
    ("grouped 3x3, 32 groups of 16, 14x14", 8, 14, 512, 512, 3, 1, 32),
)
PARTS = ("forward", "input gradient", "weight gradient")


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.convs", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds (default 7)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for JAX and torch alike (default: all)")
    p.add_argument("--classes", default=None, help="comma-separated substrings of the class names to run")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the convolutions' dtype, for every route (default float32)")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    if args.rounds < 1 or (args.threads is not None and args.threads < 1):
        p.error("--rounds and --threads must be at least 1")
    return args


def _routes(case, dtype):
    """{route: {part: (function, arguments)}} for one shape class; x NHWC, weight torch's OIHW."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from flaxport.kernels.conv import convolution

    _, n, side, cin, cout, k, stride, groups = case
    pad = [(k // 2, k // 2)] * 2
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((n, side, side, cin)), dtype)
    w = jnp.asarray(rng.standard_normal((cout, cin // groups, k, k)) * 0.1, dtype)

    def xla(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), pad, feature_group_count=groups,
                                        dimension_numbers=("NHWC", "OIHW", "NHWC"))

    def native(x, w):
        return convolution(x, w, (stride, stride), pad, (1, 1), groups)

    out = {}
    for route, conv in (("flaxport kernels", native), ("XLA", xla)):
        dy = jnp.ones(jax.eval_shape(conv, x, w).shape, dtype)
        out[route] = {
            "forward": (jax.jit(conv), (x, w)),
            "input gradient": (jax.jit(lambda x, w, dy, conv=conv: jax.vjp(lambda a: conv(a, w), x)[1](dy)), (x, w, dy)),
            "weight gradient": (jax.jit(lambda x, w, dy, conv=conv: jax.vjp(lambda b: conv(x, b), w)[1](dy)),
                                (x, w, dy)),
        }
    return out


def _torch_route(case, threads, dtype):
    import torch

    _, n, side, cin, cout, k, stride, groups = case
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype)
    conv = torch.nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
    conv = conv.to(dtype).to(memory_format=torch.channels_last)
    x = torch.randn(n, cin, side, side, dtype=dtype).to(memory_format=torch.channels_last)
    xg = x.clone().requires_grad_()
    y = conv(xg)
    dy = torch.ones_like(y)

    def forward():
        with torch.no_grad():
            return conv(x)

    return {"forward": (forward, ()),
            "input gradient": (lambda: torch.autograd.grad(y, xg, dy, retain_graph=True), ()),
            "weight gradient": (lambda: torch.autograd.grad(y, conv.weight, dy, retain_graph=True), ())}


def run(args) -> dict:
    from flaxport.bench.convnets import jax_threads, pin_jax_threads, warm
    from flaxport.harness.cpu import tune_allocator

    tune_allocator()
    if args.threads:
        pin_jax_threads(args.threads)
    import jax

    picked = [c for c in CLASSES if not args.classes or any(s in c[0] for s in args.classes.split(","))]
    rows = []
    for case in picked:
        name, n, side, cin, cout, k, stride, groups = case
        out_side = (side + 2 * (k // 2) - k) // stride + 1
        gflop = 2 * n * out_side * out_side * cout * (cin // groups) * k * k / 1e9
        routes = _routes(case, args.dtype)
        routes["torch oneDNN"] = _torch_route(case, jax_threads(), args.dtype)
        calls = {}
        for route, parts in routes.items():
            for part, (fn, fargs) in parts.items():
                call = (lambda fn=fn, fargs=fargs: jax.block_until_ready(fn(*fargs)))
                call()
                t0 = time.perf_counter()
                call()
                calls[(route, part)] = (call, max(1, round(0.02 / max(time.perf_counter() - t0, 1e-6))))
        wall = {key: [] for key in calls}
        cpu = {key: [] for key in calls}
        shuffle = random.Random(0).shuffle
        order = list(calls)
        for _ in range(args.rounds):
            shuffle(order)  # each round in another order (the same for every run)
            for key in order:
                call, repeat = calls[key]
                warm(call)  # not in the wake of the last route's threads
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(repeat):
                    call()
                wall[key].append((time.perf_counter() - t0) / repeat)
                cpu[key].append((time.process_time() - c0) / repeat)
        row = {"class": name, "gflop": round(gflop, 4), "gflops": {}, "cpu_gflops": {}}
        for (route, part) in calls:
            row["gflops"].setdefault(route, {})[part] = round(gflop / statistics.median(wall[(route, part)]), 1)
            row["cpu_gflops"].setdefault(route, {})[part] = round(gflop / statistics.median(cpu[(route, part)]), 1)
        rows.append(row)
        _print_row(row, len(rows) == 1)
    return {"rows": rows, "threads": jax_threads(), "dtype": args.dtype, "jax": jax.__version__}


def _print_row(row, header):
    routes = list(row["gflops"])
    if header:
        cols = [f"{r}: {p}" for r in routes for p in ("fwd", "dx", "dw")]
        print("GFLOP/s (wall time; CPU time in brackets)")
        print("| class | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols), flush=True)
    cells = [f"{row['gflops'][r][p]:.0f} ({row['cpu_gflops'][r][p]:.0f})" for r in routes for p in PARTS]
    print(f"| {row['class']} | " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> int:
    args = _args(argv)
    r = run(args)
    print(f"{r['threads']} threads for JAX and torch, {args.rounds} interleaved rounds, {r['dtype']}; jax {r['jax']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
