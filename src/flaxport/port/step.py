"""check_step: the same train steps in torch and in JAX, compared tensor by tensor.

From the torch module's current weights, both frameworks take `steps` optimizer steps on
one batch: torch with the user's optimizer (and LR scheduler), JAX with its optax
translation (optax_from_torch, the optimizer's state carried across) and the torch loss
carried into JAX (port/losses.py). Each step compares the loss, every gradient, the
BatchNorm statistics after the forward pass, every parameter after the update, and the
optimizer's moments (exp_avg, momentum_buffer, ...), all in torch's names and layouts.
Each framework follows its own trajectory, so a difference grows where it starts.

The Flax side is a hand-written Linen twin (a flax.linen.Module; weights through the
port_weights key map) or a translation from flaxport.translate (an object with `.model`
(nnx.Module), `.load_state_dict(torch_state_dict)` and `.state_dict(tree=None)`).
The torch module, optimizer and scheduler are left as they were (copies step), and so is
the translation's model. Dropout: the same masks on both sides, or none (port/dropout.py).
A float32 check with failing rows is repeated in float64 (port/noise.py).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import warnings

import numpy as np
import optax

from flaxport.errors import UserError
from flaxport.port.parity import TorchPrecision, compare
from flaxport.port.report import Row, _Report
from flaxport.port.weights import set_torch_mode


@dataclasses.dataclass
class StepReport(_Report):
    """Rows per step: loss, grad, running_stats, param, moment (in that order)."""

    rows: list
    steps: int
    dtype: str
    optimizer: str  # e.g. "Adam(lr=0.001) + StepLR"
    loss: str  # where the JAX loss came from
    atol: float
    rtol: float
    dropout: str = ""
    recheck: str = ""
    why: list = dataclasses.field(default_factory=list)
    float64_report: "StepReport | None" = None  # the float64 recheck's own report, when one ran
    flax_dtype: str = ""  # the dtype the Flax side's loss came out in

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {"ok": self.ok, "strict_ok": self.strict_ok, "steps": self.steps, "dtype": self.dtype,
                "optimizer": self.optimizer, "loss": self.loss, "atol": self.atol, "rtol": self.rtol,
                "dropout": self.dropout, "recheck": self.recheck, "why": list(self.why),
                "first_divergence": first.to_dict() if first else None, "rows": [r.to_dict() for r in self.rows]}

    def __str__(self) -> str:
        head = (f"train step ({self.steps} step{'s' if self.steps != 1 else ''}, {self.dtype}, {self.optimizer}, "
                f"atol={self.atol:g}, rtol={self.rtol:g}): {self._verdict()}")
        return "\n".join([head] + self.table() + [f"loss: {self.loss}"] + self._footer())


def is_translation(obj) -> bool:
    return all(hasattr(obj, a) for a in ("model", "load_state_dict", "state_dict"))


def check_step(torch_module, torch_optimizer, loss_fn, flax_model_or_translation, batch, steps: int = 3, *,
               scheduler=None, variables=None, flax_loss_fn=None, atol: float = 1e-5, rtol: float = 1e-5,
               flatten_shapes=None, key_map=None, input_layout: str = "auto", flax_kwargs=None, torch_kwargs=None,
               dropout: str = "equal", train: bool = True, recheck_float64: bool = True,
               seed: int = 0, accumulate: int = 1, clip_grad_norm: float | None = None, norm_type: float = 2.0,
               clip_grad_value: float | None = None, scheduler_every: int = 1) -> StepReport:
    """Take `steps` train steps in both frameworks from the same weights and compare them -> StepReport.

    batch: (inputs, targets); inputs an array/tensor or a tuple of them in torch layout,
    targets what `loss_fn(outputs, targets)` takes (e.g. F.cross_entropy and class ids).
    torch_optimizer: a torch.optim optimizer over torch_module's parameters (its state, if
    it has stepped, is carried across); scheduler: its LR scheduler, or None.
    flax_model_or_translation: a Linen twin (its variables from the key map, or `variables`)
    or a flaxport.translate translation. flax_loss_fn: a JAX loss(outputs, targets) to use
    instead of carrying `loss_fn` across (outputs in torch layout). dropout: 'equal' (torch's
    masks, drawn from `seed`, on both sides) or 'off'. train: the modules' mode while stepping.
    flatten_shapes / key_map / input_layout / flax_kwargs / torch_kwargs: as check_parity.

    The training loop around the optimizer, as torch code writes it: accumulate N splits the
    batch into N micro-batches, each forward and backward of loss / N (BatchNorm statistics
    updated by every one) before one optimizer step; clip_grad_norm (norm_type 2 or inf) /
    clip_grad_value clip the summed gradients before it (torch.nn.utils.clip_grad_norm_ /
    clip_grad_value_); scheduler_every: optimizer steps per scheduler.step() (1: per step, the
    steps of an epoch: per epoch). Several param groups become optax.multi_transform by torch
    name. With a scheduler, the learning rate of every group at every step is a row.
    Raises UserError (one line) for what cannot be carried across: the loss, the optimizer,
    the scheduler, a layer without a converter.
    """
    from flaxport.port import noise
    from flaxport.port.dropout import check_mode
    from flaxport.port.weights import as_tuple

    check_mode(dropout)
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise UserError("check_step's batch is (inputs, targets)")
    if int(steps) < 1:
        raise UserError(f"check_step needs steps >= 1, got {steps}")
    if int(accumulate) < 1 or int(scheduler_every) < 1:
        raise UserError(f"check_step needs accumulate >= 1 and scheduler_every >= 1, got {accumulate}, "
                        f"{scheduler_every}")
    inputs, targets = as_tuple(batch[0]), batch[1]
    if not is_translation(flax_model_or_translation) and key_map is None:
        # Built once, at the module's own precision (the abstract init draws float32 kernels), for both runs.
        from flaxport.port.weights import build_key_map

        key_map = build_key_map(torch_module, flax_model_or_translation, inputs, flatten_shapes=flatten_shapes,
                                input_layout=input_layout, flax_kwargs=flax_kwargs, torch_kwargs=torch_kwargs)
    args = dict(steps=int(steps), scheduler=scheduler, variables=variables, flax_loss_fn=flax_loss_fn, atol=atol,
                rtol=rtol, flatten_shapes=flatten_shapes, key_map=key_map, input_layout=input_layout,
                flax_kwargs=flax_kwargs, torch_kwargs=torch_kwargs, dropout=dropout, train=train, seed=seed,
                loop=Loop(int(accumulate), clip_grad_norm, float(norm_type), clip_grad_value, int(scheduler_every)))
    float64 = any(p.is_floating_point() and p.dtype.itemsize == 8 for p in torch_module.parameters())
    run = _check_float64 if float64 else _check
    report = run(torch_module, torch_optimizer, loss_fn, flax_model_or_translation, inputs, targets, **args)
    if report.strict_ok or not recheck_float64 or report.dtype != "float32":
        return report
    import jax

    try:
        with jax.enable_x64(True):
            report64 = _check_float64(torch_module, torch_optimizer, loss_fn, flax_model_or_translation,
                              tuple(noise.array_float64(x) for x in inputs), noise.tree_float64(targets),
                              **{**args, "variables": noise.tree_float64(variables) if variables else None},
                              float64=True)
    except UserError:
        raise
    except Exception as e:  # the model cannot run in float64: keep the float32 verdict, say why
        report.recheck = f"not possible ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return report
    from flaxport.port.optim import optimizer_name
    from flaxport.port.weights import to_torch_input

    if report64.flax_dtype != "float64":
        report.recheck = noise.NOT_FLOAT64.format(report64.flax_dtype)
        return report
    report.recheck = noise.classify(report.rows, report64.rows)
    report.float64_report = report64
    report.why = noise.why(report.rows, torch_module, [to_torch_input(x) for x in inputs], torch_kwargs,
                           optimizer_name(torch_optimizer))
    return report


@dataclasses.dataclass(frozen=True)
class Loop:
    """The training loop around the optimizer (check_step's accumulate / clip / scheduler_every)."""

    accumulate: int = 1
    clip_grad_norm: float | None = None
    norm_type: float = 2.0
    clip_grad_value: float | None = None
    scheduler_every: int = 1

    def clip(self):
        """The optax transformations torch's clipping is (first in the chain), or []."""
        import optax

        from flaxport.port.optimizers.transforms import clip_grad_norm

        out = []
        if self.clip_grad_norm is not None:
            out.append(clip_grad_norm(float(self.clip_grad_norm), self.norm_type))
        if self.clip_grad_value is not None:
            out.append(optax.clip(float(self.clip_grad_value)))
        return out

    def clip_torch(self, parameters):
        import torch

        parameters = list(parameters)
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(parameters, self.clip_grad_norm, norm_type=self.norm_type)
        if self.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(parameters, self.clip_grad_value)


def _check_float64(*args, **kwargs) -> StepReport:
    """_check in float64, torch's optimizer scalars (steps, NAdam's mu_product, ASGD's eta) too:
    torch keeps them in its default dtype."""
    import torch

    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return _check(*args, **kwargs)
    finally:
        torch.set_default_dtype(saved)


def _describe_optimizer(opt, scheduler, loop) -> str:
    groups = opt.param_groups
    lr = float(groups[0]["lr"].item() if hasattr(groups[0]["lr"], "item") else groups[0]["lr"])
    text = f"{type(opt).__name__}(lr={lr:g}{f', {len(groups)} param groups' if len(groups) > 1 else ''})"
    text += f" + {type(scheduler).__name__}" if scheduler is not None else ""
    if loop.clip_grad_norm is not None:
        text += f" + clip_grad_norm_({loop.clip_grad_norm:g}, {loop.norm_type:g})"
    if loop.clip_grad_value is not None:
        text += f" + clip_grad_value_({loop.clip_grad_value:g})"
    return text + (f" + accumulate {loop.accumulate}" if loop.accumulate > 1 else "")


def _check(torch_module, torch_optimizer, loss_fn, flax_side, inputs, targets, *, steps, scheduler, variables,
           flax_loss_fn, atol, rtol, flatten_shapes, key_map, input_layout, flax_kwargs, torch_kwargs, dropout, train,
           seed, loop=Loop(), float64=False) -> StepReport:
    import jax
    import torch

    from flaxport.port import draws, losses, noise
    from flaxport.port.dropout import DropoutLog, describe, silence_recurrent_dropout, torch_dropout
    from flaxport.port.optim import optax_from_torch, optax_state_from_torch, optimizer_name, torch_moments
    from flaxport.port.step_sides import linen_side, nnx_side
    from flaxport.port.weights import to_torch_input

    name = optimizer_name(torch_optimizer)
    tm, opt, sched = copy.deepcopy((torch_module, torch_optimizer, scheduler))
    if float64:
        tm.double()
        for state in opt.state.values():
            for k, v in state.items():
                if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point():
                    state[k] = v.double()
    set_torch_mode(tm, train)
    notes = silence_recurrent_dropout(tm)
    xs_t = [to_torch_input(x) for x in inputs]
    t_targets = _torch_targets(targets)
    dtype = next((str(p.dtype).replace("torch.", "") for p in tm.parameters()), "float32")

    if flax_loss_fn is not None:
        j_loss, loss_source = flax_loss_fn, "flax_loss_fn (given)"
    else:
        j_loss, loss_source = losses.jax_loss(loss_fn)

    if dtype == "float64" and not jax.config.jax_enable_x64:
        raise UserError("the torch module is float64 but jax x64 is off: run check_step inside "
                        "`with jax.enable_x64(True):` (or check in float32; a failing float32 check is rechecked "
                        "in float64 by itself)")
    if is_translation(flax_side):
        side = nnx_side(flax_side, tm, train, dtype == "float64")
    else:
        side = linen_side(flax_side, tm, inputs, train, variables, flatten_shapes, key_map, input_layout,
                          flax_kwargs, torch_kwargs)
    try:
        labels = _group_labels(opt, tm, side)
        tx = optax.chain(*loop.clip(), optax_from_torch(opt, sched, labels, loop.scheduler_every))
        opt_state = optax_state_from_torch(tx, opt, tm, side.params, side.params_from_torch, sched,
                                           loop.scheduler_every)
        frozen = {n for n, p in tm.named_parameters() if not _optimized(opt, p)}
        step_fn = side.step_fn(j_loss, tx, frozen, dropout, loop.accumulate)
        rates = _rates(sched, loop.scheduler_every)
        rows, counts, flax_dtype = [], [], ""
        rng = np.random.default_rng(seed)
        params, rest = side.params, side.rest
        micro_x = _split([x for x in side.inputs(inputs)], loop.accumulate, np.split)
        micro_y = _split(losses.as_jax_targets(targets), loop.accumulate, np.split)
        micro_xt = _split(xs_t, loop.accumulate, lambda x, n: x.chunk(n))
        micro_yt = _split(t_targets, loop.accumulate, lambda x, n: x.chunk(n))
        for s in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            replayed, t_loss = [], 0.0
            for xs_i, ys_i in zip(micro_xt, micro_yt):
                log, drawn = DropoutLog(), draws.Draws()
                with TorchPrecision(), torch.random.fork_rng():
                    with torch_dropout(dropout, rng, log), draws.torch_recording(drawn):
                        out = tm(*xs_i, **(torch_kwargs or {}))
                    micro_loss = loss_fn(out, ys_i) / loop.accumulate if loop.accumulate > 1 else loss_fn(out, ys_i)
                    micro_loss.backward()
                t_loss = t_loss + micro_loss.detach()
                counts.append(len(log.masks))
                # torch's dropout masks and random draws (randn_like, ...) replace the JAX side's
                replayed.append({"dropout": [m for m, _, _ in log.masks], "draws": drawn.standard})
            t_grads = {n: p.grad.detach().cpu().numpy().copy() for n, p in tm.named_parameters() if p.grad is not None}
            t_stats = {k: v.detach().cpu().numpy().copy() for k, v in tm.state_dict().items() if k in side.stat_keys}
            t_rates = [float(g["lr"]) for g in opt.param_groups]
            loop.clip_torch(tm.parameters())
            opt.step()
            if sched is not None and s % loop.scheduler_every == 0:
                with warnings.catch_warnings():  # the copied optimizer's step is not the one the scheduler wrapped
                    warnings.filterwarnings("ignore", message=".*optimizer.step.*")
                    sched.step()
            with jax.default_matmul_precision("highest"):
                f_loss, f_grads, params, rest, opt_state = step_fn(params, rest, opt_state, micro_x, micro_y,
                                                                   replayed, side.rngs)
            rows += [Row("lr", f"lr[group {i}]", f"lr[group {i}]", (),
                         *compare(np.asarray(want), np.asarray(rate(s - 1)), atol, rtol), step=s)
                     for i, (want, rate) in enumerate(zip(t_rates, rates))]
            flax_dtype = flax_dtype or str(np.asarray(f_loss).dtype)
            rows.append(Row("loss", "loss", "loss", (), *compare(t_loss.detach().cpu().numpy(), np.asarray(f_loss),
                                                                  atol, rtol), step=s))
            g = side.params_to_torch(f_grads)
            rows += [_row(s, "grad", k, side.flax_names.get(k, k), v, g[k], atol, rtol) for k, v in t_grads.items()]
            st = side.stats_to_torch(params, rest)
            rows += [_row(s, "running_stats", k, side.flax_names.get(k, k), v, st[k], atol, rtol)
                     for k, v in t_stats.items() if k in st]
            p = side.params_to_torch(params)
            rows += [_row(s, "param", n, side.flax_names.get(n, n), v.detach().cpu().numpy(), p[n], atol, rtol)
                     for n, v in tm.named_parameters()]
            rows += _moment_rows(s, opt, tm, torch_moments(name, opt_state), side, atol, rtol)
    finally:
        side.restore()
    return StepReport(rows, steps, dtype, _describe_optimizer(torch_optimizer, scheduler, loop), loss_source, atol, rtol,
                      dropout=describe(dropout, counts, notes), flax_dtype=flax_dtype)


def _split(values, n: int, split):
    """[values of micro-batch i] for i < n: each array (or a tuple of them) split along axis 0."""
    if n == 1:
        return [values]
    single = not isinstance(values, (tuple, list))
    items = [values] if single else list(values)
    for v in items:
        if v.shape[0] % n:
            raise UserError(f"accumulate={n}: the batch of {v.shape[0]} does not split into {n} equal micro-batches")
    parts = [split(v, n) for v in items]
    return [parts[0][i] if single else type(values)(p[i] for p in parts) for i in range(n)]


def _group_labels(opt, tm, side):
    """A tree like the Flax parameters holding each one's torch param group (None: one group)."""
    if len(opt.param_groups) == 1:
        return None
    import jax

    group = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
    filled = side.params_from_torch({n: np.full(tuple(p.shape), group.get(id(p), 0), np.float64)
                                     for n, p in tm.named_parameters()})
    return jax.tree.map(lambda a: int(np.asarray(a).reshape(-1)[0]) if np.size(a) else 0, filled)


def _rates(sched, every: int) -> list:
    """Each param group's learning rate in the optax chain, as a function of the optimizer steps
    taken here (0, 1, ...), or []."""
    if sched is None:
        return []
    from flaxport.port.optim import learning_rates
    from flaxport.port.optimizers import schedule_links

    start = schedule_links.from_torch(sched).count * every
    return [lambda k, f=lr: f(start + k) for lr, _ in learning_rates(sched, every)]


def _torch_targets(targets):
    import torch

    if isinstance(targets, (tuple, list)):
        return type(targets)(_torch_targets(t) for t in targets)
    return targets if isinstance(targets, torch.Tensor) else torch.from_numpy(np.array(targets))


def _optimized(opt, p) -> bool:
    return any(p is q for g in opt.param_groups for q in g["params"])


def _row(step, phase, tname, fname, t, f, atol, rtol) -> Row:
    t, f = np.asarray(t), np.asarray(f)
    if t.shape != f.shape:
        return Row(phase, tname, fname, tuple(f.shape), math.inf, math.inf, False,
                   f"shape: torch {t.shape} vs flax {f.shape}", step=step)
    return Row(phase, tname, fname, tuple(f.shape), *compare(t, f, atol, rtol), step=step)


def _moment_rows(step, opt, tm, moments, side, atol, rtol) -> list:
    rows = []
    names = {id(p): n for n, p in tm.named_parameters()}
    for moment, tree in moments.items():
        flax = side.params_to_torch(tree)
        for p, state in opt.state.items():
            value = state.get(moment)
            if id(p) in names and hasattr(value, "detach"):
                n = names[id(p)]
                rows.append(_row(step, "moment", f"{moment}[{n}]", f"{moment}[{side.flax_names.get(n, n)}]",
                                 value.detach().cpu().numpy(), flax[n], atol, rtol))
    return rows
