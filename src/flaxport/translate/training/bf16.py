"""The bfloat16 check of train_step.py: its bf16 step against torch's loop under
`torch.autocast("cpu", dtype=torch.bfloat16)`, measured by how far torch's own float32 loop is
from that autocast run.

Two correct bfloat16 runs round in different places (torch's fused kernels, XLA's), so they
part by about as much as either parts from float32: that gap is the scale. The check passes
when, at every step, the file's loss is within GAP_FACTOR times the float32 gap of torch's
autocast loss (plus FLOOR), and so are its parameters after the last step (largest relative
difference of any tensor). A bug in the policy (a loss computed in bfloat16, weights kept in
bfloat16 so small updates vanish) parts by several times that.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings

import numpy as np

from flaxport.port.weights import set_torch_mode

GAP_FACTOR = 2.0
FLOOR = 1e-3


@dataclasses.dataclass
class BF16Check:
    steps: int
    loss_gap: float  # max over steps |file - torch autocast| of the loss
    loss_scale: float  # max over steps |torch float32 - torch autocast|
    param_gap: float  # max over tensors of max|file - autocast| / max|autocast| after the last step
    param_scale: float  # the same for torch float32

    @property
    def ok(self) -> bool:
        return (self.loss_gap <= GAP_FACTOR * self.loss_scale + FLOOR
                and self.param_gap <= GAP_FACTOR * self.param_scale + FLOOR)

    def line(self) -> str:
        return (f"bfloat16 ({self.steps} steps against torch.autocast): {'OK' if self.ok else 'FAILED'}; loss within "
                f"{self.loss_gap:.2g} (torch float32 is {self.loss_scale:.2g} from it), parameters within "
                f"{self.param_gap:.2g} relative (float32: {self.param_scale:.2g})")


def _torch_run(training, module, x, y, steps, autocast: bool):
    import torch

    loss, loop = training.loss, training.loop()
    tm, opt, sched = training.torch_loop(module)
    set_torch_mode(tm, True)
    losses = []
    for s in range(1, steps + 1):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(loop.accumulate):
            xs = [a.chunk(loop.accumulate)[i] for a in x] if loop.accumulate > 1 else list(x)
            ys = y.chunk(loop.accumulate)[i] if loop.accumulate > 1 and y is not None else y
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = tm(*xs)
            if hasattr(out, "to_tuple"):
                out = out.to_tuple()
            out = tuple(o.float() for o in out) if isinstance(out, (tuple, list)) else out.float()
            part = loss.torch_call(out, ys, torch.float32) / loop.accumulate  # torch's losses: float32
            part.backward()
            total += float(part.detach())
        loop.clip_torch(tm.parameters())
        opt.step()
        if sched is not None and s % loop.scheduler_every == 0:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*optimizer.step.*")
                sched.step()
        losses.append(total)
    return np.array(losses), {k: v.detach().float().numpy() for k, v in tm.state_dict().items()
                              if v.is_floating_point()}


def file_run(t, ns, x, y, steps, scheduler_every: int, has_targets: bool):
    """The file's bf16 step `steps` times from the translation's weights -> (losses, state_dict)."""
    import inspect

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from flaxport.translate.training.proof import _optimizer

    model = t.new_model()
    params = inspect.signature(ns["make_optimizer"]).parameters
    kwargs = {"scheduler_every": scheduler_every} if "scheduler_every" in params else {}
    train_step, state, write_back = ns["make_train_step"](model, _optimizer(ns, model, kwargs), precision="bf16")
    arrays = [jnp.asarray(a.numpy()) for a in x] + ([jnp.asarray(y.numpy())] if has_targets else [])
    losses = []
    for _ in range(steps):
        state, loss = train_step(state, *arrays)
        losses.append(float(loss))
    write_back(state)
    got = t.state_dict(nnx.state(model))
    return np.array(losses), {k: np.asarray(v, np.float32) for k, v in got.items()}


def _distance(a: dict, b: dict) -> float:
    return max((float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(a[k])) + 1e-12))
                for k in a if k in b and a[k].size), default=0.0)


def torch_runs(training, module, inputs, targets, steps: int) -> tuple:
    """((losses, state_dict) under torch.autocast, the same in float32): the check's references."""
    x = [copy.deepcopy(a) for a in inputs]
    return _torch_run(training, module, x, targets, steps, True), _torch_run(training, module, x, targets, steps, False)


def check_bf16(t, module, training, source, inputs, targets, steps: int, references=None) -> BF16Check:
    """BF16Check of train_step.py `source` (written with precision="bf16") over `steps` steps
    (references: torch_runs(...) of the same loop, computed here when not given)."""
    from flaxport.translate.training.proof import namespace

    (ac_losses, ac_state), (f32_losses, f32_state) = references or torch_runs(training, module, inputs, targets,
                                                                                steps)
    x = [copy.deepcopy(a) for a in inputs]
    losses, state = file_run(t, namespace(source), x, targets, steps, training.scheduler_every,
                             training.loss.has_targets)
    params = {k for k in ac_state if "running" not in k}
    only = lambda d: {k: v for k, v in d.items() if k in params}  # noqa: E731
    return BF16Check(steps, float(np.max(np.abs(losses - ac_losses))), float(np.max(np.abs(f32_losses - ac_losses))),
                     _distance(only(ac_state), state), _distance(only(ac_state), f32_state))
