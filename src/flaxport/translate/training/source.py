"""train_step.py's text: the loss translated to JAX, make_optimizer() and make_train_step().

The file imports jax, flax, optax, numpy and the standard library only; the transformations
optax lacks are copied in from port/optimizers/transforms.py.
"""
from __future__ import annotations

import ast

from flaxport.translate.training.losses import TENSOR_OPTIONS, Loss

STEP = '''
def make_train_step(model, optimizer=None, mesh=None{precision_arg}):
    """The model's jitted train step -> (train_step, state, write_back).

    train_step(state, {inputs}{targets}) -> (state, loss): {what}
    `state` is (params, rest, opt_state) with the arrays as flat lists, which jit passes
    fastest; `rest` holds BatchNorm statistics and the dropout rng. The step donates `state`:
    keep only the one it returns. write_back(state) puts the params and statistics into `model`.
    mesh: a jax.sharding.Mesh with a `data` and/or an `fsdp` axis (see shardings()), or None
    for the devices JAX places arrays on by itself (one device).{precision_doc}
    """
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...){paths}
    optimizer = optimizer or make_optimizer({optimizer_args})
    # copies: the step donates its state, and the model keeps its own arrays
    param_leaves, param_tree = jax.tree.flatten(jax.tree.map(lambda a: a.copy(), params))
    rest_leaves, rest_tree = jax.tree.flatten(jax.tree.map(lambda a: a.copy(), rest))
{forward}
    def step(state, {inputs}{targets}):
        params, rest, opt_state = state
{gradients}
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), rest, opt_state), loss

    def gathered(a):
        # a copy on this host (gathered from every process): the next step donates the state's arrays
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):  # a random stream's key: gathered as its bits
            bits = multihost_utils.process_allgather(jax.random.key_data(a), tiled=True)
            return jax.random.wrap_key_data(jnp.array(bits), impl=jax.random.key_impl(a))
        return jnp.array(multihost_utils.process_allgather(a, tiled=True))

    def write_back(state):
        params, rest = jax.tree.map(gathered, (state[0], state[1]))
        nnx.update(model, jax.tree.unflatten(param_tree, params), jax.tree.unflatten(rest_tree, rest))

    state = (param_leaves, rest_leaves, optimizer.init(param_leaves))
    if mesh is None:
        return jax.jit(step, donate_argnums=0), state, write_back
    state_sharding, batch_sharding = shardings(mesh, state)
    state = jax.tree.map(lambda a, s: jax.make_array_from_callback(a.shape, s, lambda index: a[index]),
                         state, state_sharding)
    sharded_step = jax.jit(step, donate_argnums=0, out_shardings=(state_sharding, NamedSharding(mesh, P())))

    def train_step(state, *batch):
        # each process passes its own rows of the global batch (all of them when it is the only one)
        batch = [jax.make_array_from_process_local_data(batch_sharding, np.asarray(b)) for b in batch]
        return sharded_step(state, *batch)

    return train_step, state, write_back
'''
FORWARD = '''
    def loss_of(param_leaves, rest_leaves, {inputs}{targets}):
        model = nnx.merge(graphdef, jax.tree.unflatten(param_tree, param_leaves),
                          jax.tree.unflatten(rest_tree, rest_leaves))
        loss = loss_fn(model({inputs}){targets}){scale}
        return loss, jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param)))
'''
FORWARD_AUTOCAST = '''
    def forward(param_leaves, rest_leaves, {inputs}):
        model = nnx.merge(graphdef, jax.tree.unflatten(param_tree, param_leaves),
                          jax.tree.unflatten(rest_tree, rest_leaves))
        return model({inputs}), jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param)))

    def loss_of(param_leaves, rest_leaves, {inputs}{targets}):
        run = autocast(forward) if precision == "bf16" else forward
        outputs, new_rest = run(param_leaves, rest_leaves, {inputs})
        # torch.autocast computes losses in float32; the statistics keep their dtypes
        outputs = jax.tree.map(lambda o: o.astype(jnp.float32) if o.dtype == jnp.bfloat16 else o, outputs)
        new_rest = [new.astype(old.dtype) for new, old in zip(new_rest, rest_leaves)]
        return loss_fn(outputs{targets}){scale}, new_rest
'''
SHARDINGS = '''
def shardings(mesh, state):
    """(state's shardings, the batch's) on `mesh`: data parallel over its `data` axis and fully
    sharded (FSDP) over its `fsdp` axis, as torch's DistributedDataParallel and FSDP split them.

    The batch is split along its first axis over every mesh axis. Parameters and each
    optimizer array shaped like one are split over `fsdp` along their largest dimension
    that divides evenly (replicated when none does, or without an `fsdp` axis); BatchNorm
    statistics, step counts and the dropout rng are replicated. XLA inserts the
    all-reduces: the gradients and the BatchNorm statistics are those of the global batch.
    """
    fsdp = mesh.shape.get("fsdp", 1)

    def split(leaf):
        shape = getattr(leaf, "shape", ())
        spec = [None] * len(shape)
        dims = [d for d in sorted(range(len(shape)), key=lambda d: -shape[d]) if shape[d] % fsdp == 0]
        if fsdp > 1 and dims and shape[dims[0]] >= fsdp:
            spec[dims[0]] = "fsdp"
        return NamedSharding(mesh, P(*spec))

    params, rest, opt_state = state
    replicated = NamedSharding(mesh, P())
    state_sharding = (jax.tree.map(split, params), jax.tree.map(lambda _: replicated, rest),
                      jax.tree.map(split, opt_state))
    return state_sharding, NamedSharding(mesh, P(mesh.axis_names))
'''
ONE = '''        (loss, rest), grads = jax.value_and_grad(loss_of, has_aux=True)(params, rest, {inputs}{targets})'''
ACCUMULATED = '''
        def micro_batch(carry, batch):
            rest, grads = carry
            (loss, rest), micro_grads = jax.value_and_grad(loss_of, has_aux=True)(params, rest, *batch)
            return (rest, jax.tree.map(jnp.add, grads, micro_grads)), loss

        # torch's loop: ACCUMULATE forwards and backwards of loss / ACCUMULATE (BatchNorm statistics
        # updated by each), the gradients summed, then one optimizer step
        batches = jax.tree.map(lambda a: a.reshape((ACCUMULATE, -1) + a.shape[1:]), {batch})
        zeros = jax.tree.map(jnp.zeros_like, params)
        (rest, grads), losses = lax.scan(micro_batch, (rest, zeros), batches)
        loss = jnp.sum(losses)'''


def loss_function_name(jax_loss_source: str) -> str | None:
    """The name of the function translate_function wrote (the last def), None if it needs a class."""
    tree = ast.parse(jax_loss_source).body
    defs = [n.name for n in tree if isinstance(n, ast.FunctionDef)]
    classes = [n for n in tree if isinstance(n, ast.ClassDef)]
    return defs[-1] if defs and not classes else None


def loss_adapter(loss: Loss, fn: str, tuple_output: bool) -> str:
    """`loss_fn(outputs[, targets])` calling the translated `fn` as torch calls F.<name>."""
    constants = {k: v for k, v in loss.kwargs.items() if k in TENSOR_OPTIONS and v is not None}
    if loss.outputs == 1 and not tuple_output and not constants:
        return f"loss_fn = {fn}"
    outs = iter(f"outputs[{i}]" for i in range(loss.outputs)) if tuple_output or loss.outputs > 1 else iter(["outputs"])
    first = "outputs[0]" if tuple_output or loss.outputs > 1 else "outputs"
    args = [next(outs) if kind == "o" else "targets" for kind in loss.spec.order]
    args += [f"jnp.asarray({k.upper()}, {first}.dtype)" for k in constants]
    lines = [f"{k.upper()} = {v!r}  # the loss's {k}=, as torch was given it" for k, v in constants.items()]
    signature = "outputs, targets" if loss.has_targets else "outputs"
    what = f"torch.nn.functional.{loss.name}"
    lines += ["", "", f"def loss_fn({signature}):",
              f'    """{what} of the model\'s output{"s" if loss.outputs > 1 else ""}'
              + (" and the targets" if loss.has_targets else "") + '."""',
              f"    return {fn}({', '.join(args)})"]
    return "\n".join(lines).strip()


def optimizer_function(body: str, doc: str) -> str:
    return f"def make_optimizer():\n    \"\"\"{doc}\"\"\"\n" + "\n".join("    " + line for line in body.splitlines())


def step_code(input_names, loss: Loss, accumulate: int = 1, param_groups: bool = False,
              precision: str = "float32") -> str:
    """make_train_step's source (and ACCUMULATE's line, when it accumulates)."""
    inputs = ", ".join(input_names or ["x"])
    targets = ", targets" if loss.has_targets else ""
    what = ("a train-mode forward, the loss, its gradients and one optimizer step." if accumulate == 1 else
            "the batch split into ACCUMULATE micro-batches, a train-mode\n    forward and the gradients of "
            "loss / ACCUMULATE for each, summed, then one optimizer\n    step; the loss returned is their sum.")
    paths = ("\n    # each parameter's NNX path, in the order of the leaves below\n"
             '    param_paths = ["/".join(map(str, path)) for path, _ in nnx.to_flat_state(params)]'
             if param_groups else "")
    code = STEP.replace("{forward}", FORWARD_AUTOCAST if precision == "bf16" else FORWARD)
    code = code.replace("{gradients}", ONE if accumulate == 1 else ACCUMULATED)
    code = code.replace("{precision_arg}", ', precision="bf16"' if precision == "bf16" else "")
    code = code.replace("{precision_doc}", "\n    precision: 'bf16' runs the forward under torch.autocast's bfloat16 policy "
                        "(autocast()),\n    'float32' as the model is." if precision == "bf16" else "")

    code = code.replace("{what}", what).replace("{paths}", paths)
    code = code.replace("{optimizer_args}", "param_paths" if param_groups else "")
    code = code.replace("{scale}", " / ACCUMULATE" if accumulate > 1 else "")
    arrays = (input_names or ["x"]) + (["targets"] if loss.has_targets else [])
    code = code.replace("{batch}", f"({arrays[0]},)" if len(arrays) == 1 else f"({', '.join(arrays)})")
    code = code.replace("{inputs}", inputs).replace("{targets}", targets).strip()
    if accumulate > 1:
        code = (f"ACCUMULATE = {accumulate}  # micro-batches per optimizer step, as the torch loop accumulates them"
                "\n\n\n" + code)
    return code


def train_step_source(input_names, loss: Loss, loss_source: str, loss_name: str, optimizer_code: str, extra: list,
                      header: str, tuple_output: bool = False, accumulate: int = 1, param_groups: bool = False,
                      precision: str = "float32") -> str:
    """train_step.py's text: imports, the loss, make_optimizer, make_train_step."""
    from flaxport.translate import emit

    loss_code = emit._strip_runtime_imports(loss_source).strip()
    # the loss's own imports are re-collected below with everything else
    loss_code = "\n".join(line for line in loss_code.splitlines() if not line.startswith(("import ", "from ")))
    parts = [loss_code.strip(), loss_adapter(loss, loss_name, tuple_output)]
    parts += [e.strip() for e in extra]
    parts.append(optimizer_code)
    if precision == "bf16":
        parts.append(autocast_source())
    parts.append(SHARDINGS.strip())
    parts.append(step_code(input_names, loss, accumulate, param_groups, precision))
    code = "\n\n\n".join(parts) + "\n"
    imports = [line for line in emit._imports(code) if line]
    third = [line for line in imports if not line.startswith(("import functools", "import json", "import math",
                                                               "import os"))]
    std = [line for line in imports if line not in third]
    if "NamedTuple" in code:
        std.append("from typing import NamedTuple")
    third.insert(next((i for i, line in enumerate(third) if line.startswith("from ")), len(third)), "import optax")
    third.append("from jax.experimental import multihost_utils")
    third.append("from jax.sharding import NamedSharding, PartitionSpec as P")
    if "import numpy as np" not in third:
        third.insert(third.index("import optax"), "import numpy as np")
    if precision == "bf16":
        third.append("from jax.extend import core as jcore")
    third = [line for line in third if not line.startswith("from ")] + sorted(
        line for line in dict.fromkeys(third) if line.startswith("from "))
    head = "\n".join(dict.fromkeys(std)) + "\n\n" + "\n".join(dict.fromkeys(third))
    text = f'"""{header}"""\n' + head + "\n\n\n" + code
    return emit.format_source(text)


def autocast_source() -> str:
    """port/autocast.py's policy, as train_step.py carries it (the module's constants and functions)."""
    import inspect

    from flaxport.port import autocast

    source = inspect.getsource(autocast)
    body = source[source.index("MATMULS = "):]
    return body.strip()
