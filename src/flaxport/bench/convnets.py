"""Translated models against torch eager: `python -m flaxport.bench.convnets`.

Each model (bench/catalog.py: torchvision's and timm's CNNs by default) is translated (the
default file: flaxport's CPU kernels for the convolutions where it is installed) and timed
beside the torch module it came from, in one process, with equal threads: the jitted
eval-mode forward against torch's under `no_grad`, and the jitted step of the generated
train_step.py against torch's eager step (same optimizer and loss, cross-entropy on random
labels). The timings are interleaved in rounds, so a slow spell of a shared machine hits
both frameworks alike; medians are compared and compile times reported apart. On a virtual
machine the host can take the CPUs away for seconds at a time (Linux counts it as stolen
time): each row records how much it took during its timed rounds, and the run names the
rows it touched.

`time_translation(module, inputs)` is the measurement for one model, for other benchmarks
to call. On a GPU (`--device cuda`, jax and torch built with CUDA) the same command adds
torch.compile beside torch eager and runs float32 or bfloat16; `--conv xla` writes files
that need no flaxport kernels; `--save DIR` / `--load DIR` time files translated elsewhere.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

OPTIMIZER = "torch.optim.SGD(lr=0.01, momentum=0.9)"
LOSS = "torch.nn.functional.cross_entropy"
_threads: dict = {}


def pin_jax_threads(threads: int) -> None:
    """Create JAX's CPU client with an intra-op pool of `threads` threads (before JAX starts):
    the client sizes its pool from the CPU affinity, which is restored right after."""
    import jax

    full = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(full[:threads]))
    try:
        jax.devices()
    finally:
        os.sched_setaffinity(0, set(full))
    _threads["jax"] = min(threads, len(full))


def jax_threads() -> int:
    """The threads of JAX's CPU pool: pin_jax_threads' count, else every core this process may use."""
    return _threads.get("jax") or len(os.sched_getaffinity(0))


def warm(call, sync=lambda out: out, seconds: float = 0.01) -> None:
    """Run `call` untimed for `seconds`: the cores are then busy with this framework alone.
    After an op torch's OpenMP workers spin for a few milliseconds before they sleep, and a
    JAX call timed right after one finds its second pool thread kept off a core (a 3x3
    convolution, 64 channels at 56x56 on 2 cores: 6.2 ms timed after torch's, 4.6 ms with
    torch's workers told not to spin, OMP_WAIT_POLICY=PASSIVE, torch's own time unchanged); a
    core left idle is slow to wake (a sleep between the calls made every first call slower).
    A user's program does not interleave the two frameworks, so neither is timed in the
    other's wake."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sync(call())


# A row whose timed rounds lost this much CPU time to the host is named at the end of the run.
DISTURBED_S = 0.1


def stolen_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU seconds the hypervisor has taken from this machine's CPUs since boot (Linux's steal
    time, summed over the CPUs); None where the kernel does not count it."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") if fields[0] == "cpu" else None
    except (OSError, IndexError, ValueError):
        return None


class _Runs:
    """Named callables timed in interleaved rounds: wall seconds of one call (synced), and the
    process's CPU seconds (every thread's), which a loaded machine disturbs far less."""

    def __init__(self):
        self.calls, self.first, self.seconds, self.cpu_seconds = {}, {}, {}, {}

    def add(self, name, call, sync):
        t0 = time.perf_counter()
        sync(call())
        self.first[name] = time.perf_counter() - t0  # compile (JAX, torch.compile) and warm-up
        sync(call())
        t0 = time.perf_counter()
        sync(call())
        self.calls[name] = (call, sync, max(1, round(0.2 / max(time.perf_counter() - t0, 1e-6))))
        self.seconds[name], self.cpu_seconds[name] = [], []

    def round(self):
        for name, (call, sync, repeat) in self.calls.items():
            warm(call, sync)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(repeat):
                out = call()
            sync(out)
            self.seconds[name].append((time.perf_counter() - t0) / repeat)
            self.cpu_seconds[name].append((time.process_time() - c0) / repeat)

    def median_ms(self, name, cpu=False):
        return statistics.median((self.cpu_seconds if cpu else self.seconds)[name]) * 1e3


def time_translation(module, inputs, *, rounds: int = 10, train: bool = True, conv: str = "native",
                     device: str = "cpu", dtype: str = "float32", torch_compile: bool = False, translation=None,
                     files=None) -> dict:
    """Median milliseconds of the translated forward and train step against torch eager's.

    module: a torch.nn.Module (left unchanged); inputs: one example tensor in torch's layout
    (images or token ids), its batch the timed batch. torch runs with as many threads as JAX's
    CPU pool. Returns {"forward": {"torch_ms", "jax_ms", "ratio"}, "step": {...} (train),
    "compile_s": {...}, plus "torch_compile_ms" per part with torch_compile}. translation: a
    Translation of module to time (else translated here); files: a directory holding model.py
    (and train_step.py) to import instead of translating.
    """
    import copy

    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    from flaxport.translate.copies import PARAMETERS, copy_as

    torch.set_num_threads(jax_threads())
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    if device == "cpu" and all(p.dtype == torch_dtype for p in module.parameters()):
        # an eval forward under no_grad writes no parameter, so the module's own are used (a
        # 645M-parameter RegNet's 2.6 GB held once less)
        model = copy_as(module, share=(PARAMETERS,)).eval()
    else:
        model = copy.deepcopy(module).eval().to(device=device, dtype=torch_dtype)
    x_torch = inputs.to(device=device, dtype=torch_dtype if inputs.is_floating_point() else inputs.dtype)
    x_jax = jnp.asarray(inputs.numpy(), jnp.bfloat16 if dtype == "bfloat16" and inputs.is_floating_point() else None)
    sync_torch = (lambda out: torch.cuda.synchronize()) if device != "cpu" else (lambda out: None)
    runs = _Runs()

    with torch.no_grad():
        out = model(x_torch)
    classes = out.shape[-1]
    labels = torch.randint(0, classes, out.shape[:1], generator=torch.Generator().manual_seed(2))
    namespace = _translated(module, inputs, conv, translation, files, train)
    jax_model = namespace["model"](jnp.bfloat16 if dtype == "bfloat16" else None)

    def forward_torch():
        with torch.no_grad():
            return model(x_torch)

    runs.add("torch forward", forward_torch, sync_torch)
    from flax import nnx

    graphdef, state = nnx.split(jax_model)
    leaves, treedef = jax.tree.flatten(state)
    # A flat list of arrays takes jit's fast dispatch path (an nnx.State argument the slow one).
    forward = jax.jit(lambda arrays, x: nnx.merge(graphdef, jax.tree.unflatten(treedef, arrays))(x))
    runs.add("jax forward", lambda: forward(leaves, x_jax), jax.block_until_ready)
    if torch_compile:
        compiled = torch.compile(model)

        def forward_compiled():
            with torch.no_grad():
                return compiled(x_torch)

        runs.add("torch.compile forward", forward_compiled, sync_torch)
    if train:
        _add_steps(runs, namespace, module, x_torch, x_jax, labels, device, torch_dtype, torch_compile, sync_torch)
    stolen, t0 = stolen_seconds(), time.perf_counter()
    for _ in range(rounds):
        runs.round()
    figures = _figures(runs, train, torch_compile)
    if stolen is not None:
        figures["stolen_s"] = round(stolen_seconds() - stolen, 2)
        figures["timed_s"] = round(time.perf_counter() - t0, 1)
    return figures


def _add_steps(runs, namespace, module, x_torch, x_jax, labels, device, torch_dtype, torch_compile, sync_torch):
    import copy

    import jax
    import jax.numpy as jnp
    import torch
    from torch.nn import functional as F

    def torch_step(net):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        y = labels.to(device)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x_torch), y)
            loss.backward()
            optimizer.step()
            return loss

        return step

    net = copy.deepcopy(module).train().to(device=device, dtype=torch_dtype)
    runs.add("torch step", torch_step(net), sync_torch)
    if torch_compile:
        runs.add("torch.compile step", torch_step(torch.compile(copy.deepcopy(net))), sync_torch)
    train_step, state = namespace["train_step"](jnp.bfloat16 if torch_dtype == torch.bfloat16 else None)
    box, y = [state], jnp.asarray(labels.numpy())

    def jax_step():
        box[0], loss = train_step(box[0], x_jax, y)
        return loss

    runs.add("jax step", jax_step, jax.block_until_ready)


def _figures(runs, train, torch_compile) -> dict:
    parts = ("forward", "step") if train else ("forward",)
    out = {"compile_s": {name: round(s, 2) for name, s in runs.first.items() if name.startswith(("jax", "torch."))},
           "rounds": len(runs.seconds["jax forward"])}
    for part in parts:
        torch_ms, jax_ms = runs.median_ms(f"torch {part}"), runs.median_ms(f"jax {part}")
        torch_cpu, jax_cpu = runs.median_ms(f"torch {part}", cpu=True), runs.median_ms(f"jax {part}", cpu=True)
        out[part] = {"torch_ms": round(torch_ms, 4), "jax_ms": round(jax_ms, 4), "ratio": round(jax_ms / torch_ms, 3),
                     "torch_cpu_ms": round(torch_cpu, 4), "jax_cpu_ms": round(jax_cpu, 4),
                     "cpu_ratio": round(jax_cpu / torch_cpu, 3)}
        if torch_compile:
            out[part]["torch_compile_ms"] = round(runs.median_ms(f"torch.compile {part}"), 4)
    return out


def _translated(module, inputs, conv, translation, files, train) -> dict:
    """{"model": dtype -> a fresh translated model, "train_step": dtype -> (jitted step, state)}."""
    import jax
    import jax.numpy as jnp

    if files is not None:
        return _from_files(files, train)
    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step
    from flaxport.translate.training.proof import namespace

    t = translation or translate(module, inputs, conv=conv, check=False)
    out = {"model": lambda dtype: _cast(t.new_model(), dtype, jax, jnp)}
    if train:
        source = write_train_step(t, module, OPTIMIZER, LOSS, check=False).source
        make = namespace(source)["make_train_step"]

        def step(dtype):
            train_step, state, _ = make(_cast(t.new_model(), dtype, jax, jnp))
            return train_step, state

        out["train_step"] = step
    return out


def _from_files(directory, train) -> dict:
    import importlib.util

    import jax
    import jax.numpy as jnp

    def module_of(name):
        spec = importlib.util.spec_from_file_location(name, os.path.join(directory, f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    model_py = module_of("model")
    out = {"model": lambda dtype: _cast(model_py.load(directory), dtype, jax, jnp)}
    if train:
        sys.modules["model"] = model_py  # train_step.py's imports stay its own

        def step(dtype):
            train_step, state, _ = module_of("train_step").make_train_step(_cast(model_py.load(directory), dtype,
                                                                                   jax, jnp))
            return train_step, state

        out["train_step"] = step
    return out


def _cast(model, dtype, jax, jnp):
    """The model with its floating-point arrays in `dtype` (None: as they are)."""
    if dtype is None:
        return model
    from flax import nnx

    graphdef, state = nnx.split(model)
    state = jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, state)
    return nnx.merge(graphdef, state)


# --------------------------------------------------------------------------- the command
def _args(argv):
    from flaxport.bench import catalog

    p = argparse.ArgumentParser(prog="python -m flaxport.bench.convnets", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cnns",
                   help="comma-separated names (torchvision's, timm/NAME, gpt-small), or 'cnns' (the default: "
                        f"{len(catalog.CNNS)} torchvision and timm CNNs), 'torchvision', 'timm', 'gpu' "
                        f"({', '.join(catalog.GPU_MODELS)}), 'torchvision-all' (every torchvision CNN classifier)")
    p.add_argument("--sizes", default="64,224", help="image sides (token counts for gpt-small), default 64,224")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10, help="interleaved timed rounds (default 10)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for JAX and torch alike (default: all)")
    p.add_argument("--forward-only", action="store_true", help="skip the train steps")
    p.add_argument("--conv", default="native", choices=("native", "xla"),
                   help="native: the default file (flaxport's CPU kernels where installed); xla: XLA's only")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--torch-compile", action="store_true", help="also time torch.compile (compile time apart)")
    p.add_argument("--save", metavar="DIR", help="also write each translation to DIR/MODEL-SIZE/")
    p.add_argument("--load", metavar="DIR", help="time DIR/MODEL-SIZE/ files (from --save) instead of translating")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = p.parse_args(argv)
    groups = {"cnns": catalog.CNNS, "torchvision": catalog.TORCHVISION_CNNS, "timm": catalog.TIMM_CNNS,
              "gpu": catalog.GPU_MODELS}
    parts = args.models.split(",")
    if "torchvision-all" in parts:
        groups["torchvision-all"] = catalog.torchvision_cnns()
    args.models = [m for part in parts for m in groups.get(part, (part,))]
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        p.error(f"--sizes: comma-separated integers, got {args.sizes!r}")
    if args.rounds < 1 or args.batch < 1 or (args.threads is not None and args.threads < 1):
        p.error("--rounds, --batch and --threads must be at least 1")
    return args


def run(args) -> dict:
    """The figures for parsed `args`: {"rows": [...], "machine": {...}}."""
    from flaxport.harness.cpu import tune_allocator

    tune_allocator()
    if args.threads:
        pin_jax_threads(args.threads)
    import jax
    import torch

    from flaxport.bench import catalog

    load_before = os.getloadavg()
    rows = []
    for name in args.models:
        for size in args.sizes:
            if not catalog.fits(name, size):
                continue
            row = {"model": name, "size": size, "batch": args.batch}
            try:
                module, x = catalog.build(name), catalog.example(name, args.batch, size)
                files = os.path.join(args.load, f"{name.replace('/', '_')}-{size}") if args.load else None
                translation = None
                if args.save and not files:
                    translation = _save(module, x, args, name, size)
                row.update(time_translation(module, x, rounds=args.rounds, train=not args.forward_only,
                                            conv=args.conv, device=args.device, dtype=args.dtype,
                                            torch_compile=args.torch_compile, translation=translation, files=files))
            except Exception as e:  # noqa: BLE001 - a model that fails is a row saying why, not the end of the run
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            rows.append(row)
            _print_row(row, args)
    return {"rows": rows, "threads": jax_threads() if args.device == "cpu" else None, "device": args.device,
            "dtype": args.dtype, "conv": args.conv, "jax": jax.__version__, "torch": torch.__version__,
            "jax_device": str(jax.devices()[0]), "load_average_before": load_before,
            "load_average_after": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _save(module, x, args, name, size):
    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step

    t = translate(module, x, conv=args.conv, check=False)
    if not args.forward_only:
        write_train_step(t, module, OPTIMIZER, LOSS, check=False)
    t.save(os.path.join(args.save, f"{name.replace('/', '_')}-{size}"))
    return t


_HEADER = False


def _print_row(row, args):
    global _HEADER
    compile_cols = args.torch_compile
    if not _HEADER:
        cols = ["model", "size", "torch fwd ms", "jax fwd ms", "fwd ratio", "cpu-time ratio"]
        cols += ["torch.compile fwd ms"] if compile_cols else []
        if not args.forward_only:
            cols += ["torch step ms", "jax step ms", "step ratio", "cpu-time ratio"]
            cols += ["torch.compile step ms"] if compile_cols else []
        print("| " + " | ".join(cols) + " |\n|" + "---|" * 2 + "---:|" * (len(cols) - 2), flush=True)
        _HEADER = True
    if "error" in row:
        print(f"| {row['model']} | {row['size']} | {row['error']} |", flush=True)
        return
    cells = [row["model"], str(row["size"])]
    for part in ("forward",) + (() if args.forward_only else ("step",)):
        f = row[part]
        cells += [f"{f['torch_ms']:.1f}", f"{f['jax_ms']:.1f}", f"{f['ratio']:.2f}x", f"{f['cpu_ratio']:.2f}x"]
        cells += [f"{f['torch_compile_ms']:.1f}"] if compile_cols else []
    print("| " + " | ".join(cells) + " |", flush=True)


def main(argv=None) -> int:
    args = _args(argv)
    r = run(args)
    ok = [row for row in r["rows"] if "error" not in row]
    print(f"{len(ok)} of {len(r['rows'])} ran; batch {args.batch}, {r['threads'] or r['jax_device']} threads, "
          f"{args.rounds} interleaved rounds, {r['dtype']}; jax {r['jax']}, torch {r['torch']}; load average "
          f"{r['load_average_before'][0]:.1f} before, {r['load_average_after'][0]:.1f} after")
    for part in ("forward", "step"):
        for key, what in (("ratio", "wall-time"), ("cpu_ratio", "cpu-time")):
            rows = [row for row in ok if part in row]
            if rows:
                worst = max(rows, key=lambda row: row[part][key])
                print(f"{part} {what} ratio jax/torch: median {statistics.median(r[part][key] for r in rows):.2f}x, "
                      f"worst {worst[part][key]:.2f}x ({worst['model']} at {worst['size']})")
    disturbed = [row for row in ok if row.get("stolen_s", 0) >= DISTURBED_S]
    if disturbed:
        print("the host took CPU time from this machine while these were timed (Linux's steal time; if a "
              "figure looks off, time it again): " + ", ".join(
                  f"{row['model']} at {row['size']} ({row['stolen_s']:.1f} s in {row['timed_s']:.0f} s)"
                  for row in disturbed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
