"""train_step.py on a one-device mesh against the same step without one: `python -m flaxport.bench.train_mesh`.

The cnn workload's torch twin is translated with `--optimizer "torch.optim.Adam(lr=1e-3)"
--loss "torch.nn.functional.nll_loss"`, and its train step is made three times from the same
weights: without a mesh (plain jit), on a Mesh of one device along `data`, and along `data`
and `fsdp`. Each takes `--calls` steps per round on one batch of the config's size, rounds
interleaved (a slow spell of the shared machine hits every variant alike); the medians are
compared, compile reported apart. What the mesh costs is the sharding bookkeeping: the
placement of each batch and jit's sharding checks.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.train_mesh", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30, help="interleaved timed rounds (default 30)")
    p.add_argument("--calls", type=int, default=10, help="train steps per round (default 10)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the cnn config's)")
    return p.parse_args(argv)


def run(args) -> dict:
    import jax
    import numpy as np
    import torch
    from jax.sharding import Mesh

    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step
    from flaxport.translate.training.proof import namespace
    from flaxport.workloads.cnn import config as cnn_config
    from flaxport.workloads.cnn import model_torch

    config = cnn_config.get_config("default")
    batch = args.batch or config.batch_size
    torch.manual_seed(0)
    twin = model_torch.CNN(config).train()
    images = torch.randn(batch, 3, 32, 32)
    labels = np.random.default_rng(0).integers(0, 10, batch).astype(np.int32)
    t = translate(twin, images)
    ns = namespace(write_train_step(t, twin, "torch.optim.Adam(lr=1e-3)", "torch.nn.functional.nll_loss",
                                    check=False).source)
    devices = np.array(jax.devices()[:1])
    variants = {"no mesh": None, "mesh data=1": Mesh(devices, ("data",)),
                "mesh data=1,fsdp=1": Mesh(devices.reshape(1, 1), ("data", "fsdp"))}
    x = images.numpy()
    steps, compile_s = {}, {}
    for name, mesh in variants.items():
        train_step, state, _ = ns["make_train_step"](t.new_model(), mesh=mesh)
        start = time.perf_counter()
        state, loss = train_step(state, x, labels)
        jax.block_until_ready(loss)
        compile_s[name] = time.perf_counter() - start
        steps[name] = [train_step, state]
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, box in steps.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                box[1], loss = box[0](box[1], x, labels)
            jax.block_until_ready(loss)
            times[name].append((time.perf_counter() - start) / args.calls)
    medians = {name: statistics.median(v) for name, v in times.items()}
    base = medians["no mesh"]
    return {"batch": batch, "devices": jax.device_count(), "jax": jax.__version__,
            "step_ms": {k: round(v * 1e3, 3) for k, v in medians.items()},
            "vs_no_mesh": {k: round(v / base, 3) for k, v in medians.items()},
            "compile_s": {k: round(v, 2) for k, v in compile_s.items()}}


def main(argv=None) -> int:
    result = run(_args(argv))
    for name, ms in result["step_ms"].items():
        print(f"{name:20s} {ms:8.3f} ms/step  {result['vs_no_mesh'][name]:.3f}x  (compile {result['compile_s'][name]} s)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
