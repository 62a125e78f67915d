"""The proof of train_step.py: check_step with the file's loss, and the file's own `train_step`
run in float64 beside torch's optimizer and loss in `.double()`, step after step."""
from __future__ import annotations

import contextlib
import inspect
import copy
import math
import warnings

import numpy as np

ATOL = RTOL = 1e-5


def namespace(source: str) -> dict:
    """train_step.py's names: the text written by source.py, run as the user will import it."""
    ns = {"__name__": "train_step"}
    exec(compile(source, "<train_step.py>", "exec"), ns)  # noqa: S102 - the text flaxport wrote
    return ns


@contextlib.contextmanager
def torch_default_dtype(dtype):
    """torch keeps optimizer scalars (steps, NAdam's mu_product, ASGD's eta) in the default dtype."""
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def _float64(x):
    return x.double() if x is not None and x.is_floating_point() else x


def prove(t, module, training, source, inputs, targets, steps: int):
    """(check_step's StepReport, rows [(step, name, max_abs, ok)] of the file's own steps in float64).

    training: a loop.Training (its torch optimizer, scheduler, clipping and accumulation are
    rebuilt on copies of `module`)."""
    import jax
    import torch

    from flaxport.port import check_step, draws
    from flaxport.port.dropout import DropoutLog, FlaxMasks, silence_recurrent_dropout, torch_dropout
    from flaxport.port.parity import compare
    from flaxport.port.weights import set_torch_mode

    ns = namespace(source)
    loss, loop = training.loss, training.loop()
    jax_loss = ns["loss_fn"] if loss.has_targets else _no_targets(ns["loss_fn"])
    dummy = targets if loss.has_targets else torch.zeros(())
    tm, opt, sched = training.torch_loop(module)
    report = check_step(set_torch_mode(tm, True), opt, loss.torch_fn, t, (inputs, dummy), steps=steps, flax_loss_fn=jax_loss,
                        scheduler=sched, accumulate=loop.accumulate, clip_grad_norm=loop.clip_grad_norm,
                        norm_type=loop.norm_type, clip_grad_value=loop.clip_grad_value,
                        scheduler_every=loop.scheduler_every)
    rows = []
    # dropout off on both sides (check_step above made the masks equal instead)
    with jax.enable_x64(True), torch_default_dtype(torch.float64), torch_dropout("off", None, DropoutLog()), \
            FlaxMasks([], "off", False).nnx():
        tm64, opt, sched = training.torch_loop(module, torch.float64)
        set_torch_mode(tm64, True)
        silence_recurrent_dropout(tm64)
        xs64 = [_float64(x) for x in inputs]
        y64 = _float64(targets)
        model = t.new_model(dtype=np.float64)
        kwargs = {"scheduler_every": loop.scheduler_every} if sched is not None else {}
        precision = {"precision": "float32"} if "precision" in inspect.signature(ns["make_train_step"]).parameters \
            else {}  # the float64 proof is of the model's own numerics; training/bf16.py checks bfloat16
        train_step, state, write_back = ns["make_train_step"](model, _optimizer(ns, model, kwargs), **precision)
        xs_j = [jax.numpy.asarray(x.numpy()) for x in xs64]
        ys_j = [jax.numpy.asarray(y64.numpy())] if loss.has_targets else []
        micro = loop.accumulate
        replaying = None  # the file's step compiled once with torch's draws as arguments, when it draws
        for s in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            drawn = draws.Draws()
            t_loss = 0.0
            for i in range(micro):
                xs_i = [x.chunk(micro)[i] for x in xs64] if micro > 1 else xs64
                y_i = y64.chunk(micro)[i] if micro > 1 and y64 is not None else y64
                with draws.torch_recording(drawn):
                    out64 = tm64(*xs_i)
                if hasattr(out64, "to_tuple"):
                    out64 = out64.to_tuple()
                part = loss.torch_call(out64, y_i, torch.float64)
                part = part / micro if micro > 1 else part
                part.backward()
                t_loss = t_loss + part.detach()
            loop.clip_torch(tm64.parameters())
            opt.step()
            if sched is not None and s % loop.scheduler_every == 0:
                with warnings.catch_warnings():  # a copied optimizer's step is not the one the scheduler wrapped
                    warnings.filterwarnings("ignore", message=".*optimizer.step.*")
                    sched.step()
            if drawn.standard:  # a forward that draws (randn_like, ...) takes torch's draws of this step
                replaying = replaying or _replaying(train_step)
                state, j_loss = replaying(state, drawn.standard, *xs_j, *ys_j)
            else:
                state, j_loss = train_step(state, *xs_j, *ys_j)
            d, _, ok = compare(t_loss.numpy(), np.asarray(j_loss), ATOL, RTOL)[:3]
            rows.append((s, "loss", d, ok))
            write_back(state)
            from flax import nnx

            got = t.state_dict(nnx.state(model))
            for n, p in tm64.state_dict().items():  # parameters and BatchNorm statistics
                if n not in got:
                    continue
                d, _, ok = compare(p.detach().numpy(), got[n], ATOL, RTOL)[:3]
                rows.append((s, n, d if math.isfinite(d) else math.inf, ok))
    return report, rows


def _replaying(train_step):
    """train_step with the random draws its forward makes as an argument: jax.random's samplers
    return them while the file's own step function (the one its jax.jit wraps) is traced, so it
    compiles once and every step takes that step's draws."""
    import jax

    from flaxport.port import draws

    step = train_step.__wrapped__

    def replayed(state, standard, *batch):
        with draws.jax_replay(standard):
            return step(state, *batch)

    return jax.jit(replayed, donate_argnums=0)


def _optimizer(ns, model, kwargs):
    """make_optimizer(...) as make_train_step calls it, with the proof's scheduler_every."""
    from flax import nnx

    if "param_paths" in inspect.signature(ns["make_optimizer"]).parameters:
        _, params, _ = nnx.split(model, nnx.Param, ...)
        kwargs = {"param_paths": ["/".join(map(str, path)) for path, _ in nnx.to_flat_state(params)], **kwargs}
    return ns["make_optimizer"](**kwargs)


def _no_targets(loss_fn):
    def with_targets(outputs, targets):
        del targets  # the loss reads the model's outputs only
        return loss_fn(outputs)

    return with_targets
