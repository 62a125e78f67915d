"""train.py beside train_step.py: a runnable training program for the translated model.

`python train.py --data my_data.py:loader --steps N [--mesh data=2,fsdp=2] [--precision bf16]
[--resume | --from-torch-checkpoint ckpt.pt]`: the user's own loader (a torch DataLoader or any
iterable of arrays) feeding NumPy batches, a progress line, metrics as JSONL, Orbax checkpoints
(atomic; the newest good one restored), a torch checkpoint continued where torch stopped, and
several processes through jax.distributed. It imports jax, flax, optax, orbax and numpy (torch
only to read --from-torch-checkpoint, with weights_only=True), never flaxport.
"""
from __future__ import annotations

TEMPLATE = r'''"""Train {root} (model.py) with train_step.py, as the torch loop trained it; written by `flaxport translate`.

    python train.py --data my_data.py:loader --steps 1000 --workdir runs/{run}
    python train.py --data my_data.py:loader --steps 1000 --mesh data=2,fsdp=2 --precision {precisions}
    python train.py --data my_data.py:loader --steps 2000 --workdir runs/{run} --resume
    python train.py --data my_data.py:loader --steps 2000 --from-torch-checkpoint ckpt.pt

--data FILE.py:NAME names your loader: an iterable of batches, or a function (a class) that
returns one when called with no arguments (a torch DataLoader is both). A batch is
({batch}), arrays or tensors; a step takes one batch, and the loader starts over when it ends.
With several processes each one's loader yields that process's rows of the global batch (a
DistributedSampler's share). Every step appends {{"step", "loss", "seconds"}} to
WORKDIR/metrics.jsonl; WORKDIR/checkpoints holds the newest three Orbax checkpoints (one every
--save-every steps and one at the end). --resume continues from the newest good one, and
--from-torch-checkpoint from a torch.save of {{"model": model.state_dict(), "optimizer":
optimizer.state_dict(), "step": optimizer steps taken}}: both skip the batches those steps used.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

HERE = os.path.dirname(os.path.abspath(__file__))
# torch's optimizer state names -> the optax state fields holding them ({optimizer})
TORCH_STATE = {moments!r}
TORCH_SCALARS = {scalars!r}


def load_sibling(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, metavar="FILE.py:NAME", help="your loader: an iterable of batches, or "
                   "a function returning one")
    p.add_argument("--steps", type=int, required=True, help="train until this many optimizer steps are done")
    p.add_argument("--workdir", default="run", help="metrics.jsonl and checkpoints/ go here")
    p.add_argument("--mesh", default=None, metavar="data=N,fsdp=M", help="devices as a mesh: the batch split over "
                   "data (and fsdp), parameters and optimizer moments split over fsdp; default: one device")
    p.add_argument("--precision", default="float32", choices={precision_choices!r},
                   help="float32; float64 (jax x64, for checking against torch in double); {bf16_help}")
    p.add_argument("--save-every", type=int, default=100, metavar="N", help="a checkpoint every N steps (and at the end)")
    p.add_argument("--resume", action="store_true", help="continue from the newest good checkpoint in --workdir")
    p.add_argument("--from-torch-checkpoint", default=None, metavar="FILE", help="continue a torch run from its "
                   "torch.save (read with weights_only=True)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's dropout and noise streams")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="several processes: process 0's address")
    p.add_argument("--num-processes", type=int, default=None)
    p.add_argument("--process-id", type=int, default=None)
    return p.parse_args(argv)


def fail(message):
    print(f"train.py: error: {{message}}", file=sys.stderr)
    sys.exit(2)


# --------------------------------------------------------------------------- data
def loader(spec):
    """The iterable --data names (file.py:name; importing the file runs it: it is your code)."""
    path, _, name = spec.rpartition(":")
    if not path or not name or not os.path.isfile(path):
        fail(f"--data {{spec!r}}: write it as file.py:name, of a file that exists")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    module_spec = importlib.util.spec_from_file_location(f"data_{{os.getpid()}}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, name):
        fail(f"--data {{spec!r}}: {{path}} has no {{name!r}}")
    found = getattr(module, name)
    return found if hasattr(found, "__iter__") else found()


def batches(data, skip, dtype):
    """Endless NumPy batches from `data` (starting it over when it ends), the first `skip` left out."""
    seen = 0
    while True:
        empty = True
        for batch in data:
            empty = False
            seen += 1
            if seen > skip:
                yield [as_array(b, dtype) for b in (batch if isinstance(batch, (tuple, list)) else (batch,))]
        if empty:
            fail("--data: the loader yields no batches")


def as_array(b, dtype):
    a = b.detach().cpu().numpy() if hasattr(b, "detach") else np.asarray(b)
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(dtype)
    return a.astype(np.int32) if a.dtype == np.int64 and not jax.config.jax_enable_x64 else a


# --------------------------------------------------------------------------- devices
def mesh_of(text):
    if text is None:
        return None
    from jax.sharding import Mesh

    try:
        sizes = {{k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}}
    except ValueError:
        fail(f"--mesh {{text!r}}: write it as data=N or data=N,fsdp=M")
    if not set(sizes) <= {{"data", "fsdp"}} or any(n < 1 for n in sizes.values()):
        fail(f"--mesh {{text!r}}: the axes are data and fsdp, each at least 1")
    devices = jax.devices()
    if int(np.prod(list(sizes.values()))) != len(devices):
        fail(f"--mesh {{text!r}} needs {{int(np.prod(list(sizes.values())))}} devices; there are {{len(devices)}}")
    return Mesh(np.array(devices).reshape(tuple(sizes.values())), tuple(sizes))


# --------------------------------------------------------------------------- checkpoints
def manager(workdir):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=3, enable_async_checkpointing=False)
    return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "checkpoints")), options=options)


def save(checkpoints, step, state):
    import orbax.checkpoint as ocp

    checkpoints.save(step, args=ocp.args.StandardSave({{"state": state}}), force=True)
    checkpoints.wait_until_finished()


def restore(checkpoints, state):
    """(state, step) of the newest checkpoint that reads back whole; the damaged ones are skipped."""
    import orbax.checkpoint as ocp

    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {{"state": state}})
    for step in sorted(checkpoints.all_steps(), reverse=True):
        try:
            return checkpoints.restore(step, args=ocp.args.StandardRestore(abstract))["state"], step
        except Exception as e:  # noqa: BLE001 - a damaged checkpoint: say so, try the one before
            print(f"train.py: checkpoint {{step}} does not read back ({{type(e).__name__}}); trying an older one",
                  file=sys.stderr)
    fail(f"--resume: no checkpoint in {{checkpoints.directory}} reads back")


def from_torch(path, model_py, model, state, param_paths, order):
    """(state, step) continuing the torch run saved in `path` (model, optimizer state and step count)."""
    import torch  # only here: torch's file format

    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - refusing a pickle with code is the point
        fail(f"--from-torch-checkpoint {{path}}: cannot read it as plain tensors (weights_only): {{e}}")
    if not isinstance(saved, dict) or "model" not in saved:
        fail(f"--from-torch-checkpoint {{path}}: expected a dict with 'model' (and 'optimizer', 'step')")
    weights = {{k: v.detach().double().numpy() if v.is_floating_point() else v.numpy() for k, v in saved["model"].items()}}
    names = model_nnx_paths()
    values = dict(nnx.to_flat_state(nnx.state(model)))
    unknown = sorted(set(weights) - set(names))
    if unknown:
        fail(f"--from-torch-checkpoint {{path}}: {{len(unknown)}} weights the model does not have, e.g. {{unknown[0]}}")
    for name, array in weights.items():
        variable = values[names[name]]
        variable.set_value(jnp.asarray(model_layout(model_py, name, array), variable.get_value().dtype))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = saved.get("optimizer")
    steps = {{int(s["step"]) for s in (optimizer or {{}}).get("state", {{}}).values() if "step" in s}}
    step = int(saved["step"]) if "step" in saved else (steps.pop() if len(steps) == 1 else None)
    if step is None:
        fail(f"--from-torch-checkpoint {{path}}: save the optimizer steps taken as 'step'")
    opt_state = state[2]
    if optimizer is not None:
        opt_state = optimizer_state(opt_state, optimizer, param_paths, {{v: k for k, v in names.items()}}, step, order,
                                    lambda name, array: model_layout(model_py, name, array))
    return (jax.tree.leaves(params), jax.tree.leaves(rest), opt_state), step


def model_layout(model_py, name, array):
    """A torch tensor (torch's layout) as model.py holds it: as its load() puts the weights."""
    layouts = getattr(model_py, "CHANNELS_LAST_COLUMNS", {{}})
    return model_py.columns_channels_last(array, layouts[name]) if name in layouts else array


def model_nnx_paths():
    """{{torch name: NNX path}} from weights.safetensors' metadata."""
    with open(os.path.join(HERE, "weights.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return {{name: tuple(int(p) if p.isdigit() else p for p in path.split("/"))
            for name, path in json.loads(header["__metadata__"]["nnx_paths"]).items()}}


def optimizer_state(opt_state, saved, param_paths, torch_names, step, order, layout):
    """The optax state holding torch's optimizer.state_dict(): each moment under its optax field,
    every count at `step`. torch numbers the parameters group by group, in `order`
    (train_step.py's OPTIMIZER_PARAMETERS)."""
    order = {{name: i for i, name in enumerate(order)}}
    names = [torch_names[tuple(int(p) if p.isdigit() else p for p in path.split("/"))] for path in param_paths]
    per_param = [saved["state"].get(order[name], {{}}) for name in names]
    first = next((s for s in per_param if s), {{}})

    def fill(node):
        if isinstance(node, tuple) and hasattr(node, "_fields"):
            node = type(node)(*(fill(v) for v in node))
            updates = {{}}
            for torch_key, field in TORCH_STATE.items():
                if field in node._fields and any(torch_key in s for s in per_param):
                    leaves, tree = jax.tree_util.tree_flatten(getattr(node, field), is_leaf=masked)
                    updates[field] = jax.tree_util.tree_unflatten(tree, [
                        old if masked(old) or torch_key not in s else
                        jnp.asarray(layout(name, s[torch_key].double().numpy()), old.dtype)
                        for old, s, name in zip(leaves, per_param, names)])
            for torch_key, field in TORCH_SCALARS.items():
                if field in node._fields and torch_key in first:
                    updates[field] = jnp.asarray(float(first[torch_key]), getattr(node, field).dtype)
            if "count" in node._fields:
                updates["count"] = jnp.asarray(step, node.count.dtype)
            return node._replace(**updates)
        if isinstance(node, (tuple, list)):
            return type(node)(fill(v) for v in node)
        if isinstance(node, dict):
            return {{k: fill(v) for k, v in node.items()}}
        return node

    return fill(opt_state)


def masked(x):
    return type(x).__name__ == "MaskedNode"


# --------------------------------------------------------------------------- the loop
def main(argv=None):
    args = arguments(argv)
    if args.coordinator or args.num_processes:
        jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    if args.precision == "float64":
        jax.config.update("jax_enable_x64", True)
    if args.resume and args.from_torch_checkpoint:
        fail("--resume and --from-torch-checkpoint: choose one")
    dtype = {{"float64": np.float64}}.get(args.precision, np.float32)
    model_py, train_step_py = load_sibling("model"), load_sibling("train_step")
    model = model_py.load(HERE, seed=args.seed)
    if args.precision == "float64":
        nnx.update(model, jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating)
                                       else a, nnx.state(model)))
    data = loader(args.data)
    mesh = mesh_of(args.mesh)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    param_paths = ["/".join(map(str, path)) for path, _ in nnx.to_flat_state(params)]
    start = 0
    if args.from_torch_checkpoint:
        _, state, _ = train_step_py.make_train_step(model{precision_float})
        state, start = from_torch(args.from_torch_checkpoint, model_py, model, state, param_paths,
                                  train_step_py.OPTIMIZER_PARAMETERS)
    train_step, state0, write_back = train_step_py.make_train_step(model, mesh=mesh{precision_arg})
    state = state0 if not args.from_torch_checkpoint else place(state, state0)
    checkpoints = manager(args.workdir)
    if args.resume and checkpoints.latest_step() is not None:
        state, start = restore(checkpoints, state)
    main_process = jax.process_index() == 0
    os.makedirs(args.workdir, exist_ok=True)
    metrics = open(os.path.join(args.workdir, "metrics.jsonl"), "a") if main_process else None
    stream = batches(data, start, dtype)
    began = tick = time.time()
    last = pending = None  # (step, loss): a step's loss is read once the next step is queued, so the
    # host never waits on the step it just handed to the devices

    def record(step, loss):
        nonlocal tick, last
        loss = float(loss)
        if not np.isfinite(loss):
            print(f"\ntrain.py: the loss is {{loss}} at step {{step}}; stopping (the last checkpoint is kept)",
                  file=sys.stderr)
            sys.exit(3)
        now, last = time.time(), loss
        if main_process:
            metrics.write(json.dumps({{"step": step, "loss": loss, "seconds": round(now - tick, 6)}}) + "\n")
            metrics.flush()
            rate = (step - start) / max(now - began, 1e-9)
            print(f"\rstep {{step}}/{{args.steps}}  loss {{loss:.4f}}  {{rate:.1f}} steps/s", end="", file=sys.stderr)
        tick = now

    for step in range(start + 1, args.steps + 1):
        batch = next(stream)
        state, loss = train_step(state, *batch)
        if pending is not None:
            record(*pending)
        pending = (step, loss)
        if step % args.save_every == 0 or step == args.steps:
            record(*pending)  # a checkpoint only of a step whose loss was finite
            pending = None
            save(checkpoints, step, state)
    if pending is not None:
        record(*pending)
    write_back(state)
    if main_process:
        print(file=sys.stderr)
        print(json.dumps({{"steps": args.steps, "loss": last, "workdir": os.path.abspath(args.workdir)}}))
    return model


def place(state, like):
    """`state` (host arrays) where the train step keeps `like` (its shardings)."""
    return jax.tree.map(lambda a, b: jax.make_array_from_callback(b.shape, b.sharding, lambda i: np.asarray(a)[i])
                        if hasattr(b, "sharding") else a, state, like)


if __name__ == "__main__":
    main()
'''


def train_script_source(root: str, optimizer: str, moments: dict, scalars: dict, input_names, has_targets: bool,
                        bf16: bool) -> str:
    """train.py's text for a translation of `root` trained with torch optimizer `optimizer`."""
    from flaxport.translate import emit

    batch = ", ".join(list(input_names or ["x"]) + (["targets"] if has_targets else []))
    precisions = ["float32", "float64"] + (["bf16"] if bf16 else [])
    text = TEMPLATE.format(
        root=root, run=root.lower(), precisions="bf16" if bf16 else "float64", batch=batch, optimizer=optimizer,
        moments=moments, scalars=scalars, precision_choices=tuple(precisions),
        bf16_help="bf16: torch.autocast's bfloat16 policy (train_step.py's)" if bf16
        else "bf16 needs `flaxport translate --precision bf16`",
        precision_float=', precision="float32"' if bf16 else "",
        precision_arg=', precision="bf16" if args.precision == "bf16" else "float32"' if bf16 else "")
    return emit.format_source(text)
