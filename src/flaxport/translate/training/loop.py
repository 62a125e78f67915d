"""The torch training loop train_step.py is written for: optimizer (param groups), loss, LR
scheduler and how often it steps, gradient clipping and accumulation; read from the translate
flags or from torch objects, and rebuilt in torch (on a copy of the module) for the proof."""
from __future__ import annotations

import copy
import dataclasses

from flaxport.translate.training.losses import Loss, as_loss
from flaxport.translate.training.optimizer import OptimizerSpec, optimizer_spec
from flaxport.translate.training.texts import TrainStepError


@dataclasses.dataclass
class Training:
    optimizer: OptimizerSpec
    loss: Loss
    scheduler: object = None  # a schedule.SchedulerText, or the user's torch scheduler
    scheduler_every: int = 1
    clip_grad_norm: float | None = None
    norm_type: float = 2.0
    clip_grad_value: float | None = None
    accumulate: int = 1
    torch_objects: tuple | None = None  # (optimizer, scheduler) the user passed, for the proof's copies

    def __post_init__(self):
        if self.accumulate < 1 or self.scheduler_every < 1:
            raise TrainStepError(f"--accumulate and --scheduler-every are at least 1, got {self.accumulate}, "
                                 f"{self.scheduler_every}")
        if self.norm_type not in (2.0, float("inf")) and self.norm_type <= 0:
            raise TrainStepError(f"--clip-norm-type {self.norm_type:g}: a positive number or inf")
        for name, value in (("--clip-grad-norm", self.clip_grad_norm), ("--clip-grad-value", self.clip_grad_value)):
            if value is not None and not value > 0:
                raise TrainStepError(f"{name} {value:g}: clipping needs a positive bound")

    def torch_loop(self, module, dtype=None):
        """(a copy of module, its torch optimizer, its scheduler or None), as the user's loop has them.

        dtype: the copy's floating-point dtype, set before the optimizer makes any state (Adagrad
        makes its sums in its constructor, in the parameters' dtype of that moment)."""
        if self.torch_objects is not None:
            m, opt, sched = copy.deepcopy((module, *self.torch_objects))
            if dtype is not None:
                m.to(dtype)
            if sched is not None and getattr(sched, "last_epoch", 0) > 0:
                raise TrainStepError("the scheduler has stepped already: pass a fresh one (train.py "
                                     "--from-torch-checkpoint continues a torch run where it stopped)")
            opt.state.clear()  # the hyperparameters are read, not the state: the file starts afresh
            return m, opt, sched
        m = copy.deepcopy(module)
        if dtype is not None:
            m.to(dtype)
        opt = self.optimizer.make(m)
        return m, opt, (self.scheduler.make(opt) if self.scheduler is not None else None)

    def schedule_links(self, module):
        """The scheduler's ScheduleLinks (None without one), read from it on an optimizer over module."""
        if self.scheduler is None:
            return None
        from flaxport.translate.training.schedule import links

        _, _, sched = self.torch_loop(module)
        return links(sched, getattr(self.scheduler, "text", ""))

    def clip_links(self) -> list:
        from flaxport.port.optimizers.chains import Link

        out = []
        if self.clip_grad_norm is not None:
            out.append(Link("clip_grad_norm", (("max_norm", float(self.clip_grad_norm)),
                                               ("norm_type", float(self.norm_type))),
                            "torch.nn.utils.clip_grad_norm_: every gradient times min(1, max_norm / (norm + 1e-6)), "
                            "before the optimizer"))
        if self.clip_grad_value is not None:
            out.append(Link("optax.clip", (("max_delta", float(self.clip_grad_value)),),
                            "torch.nn.utils.clip_grad_value_: each gradient clamped to [-v, v], before the optimizer"))
        return out

    def loop(self):
        from flaxport.port.step import Loop

        return Loop(self.accumulate, self.clip_grad_norm, float(self.norm_type), self.clip_grad_value,
                    self.scheduler_every)

    def describe(self) -> str:
        parts = [self.optimizer.text]
        if self.scheduler is not None:
            parts.append(_scheduler_name(self.scheduler))
        if self.clip_grad_norm is not None:
            parts.append(f"clip_grad_norm_({self.clip_grad_norm:g}" + (
                f", norm_type={self.norm_type:g})" if self.norm_type != 2.0 else ")"))
        if self.clip_grad_value is not None:
            parts.append(f"clip_grad_value_({self.clip_grad_value:g})")
        if self.accumulate > 1:
            parts.append(f"{self.accumulate} micro-batches a step")
        return " + ".join(parts)


def _scheduler_name(scheduler) -> str:
    if hasattr(scheduler, "text"):
        return scheduler.text
    from flaxport.port.optimizers.schedule_links import describe

    return describe(scheduler)


def training(optimizer, loss, module, scheduler=None, **loop) -> Training:
    """A Training from texts or torch objects: optimizer (text, (name, kwargs) or a torch optimizer,
    several param groups allowed), loss, scheduler (text or a torch scheduler on that optimizer)."""
    from flaxport.translate.training.schedule import parse_scheduler

    spec = optimizer_spec(optimizer, module)
    objects = None
    if not isinstance(optimizer, (str, tuple)):
        if scheduler is not None and not isinstance(scheduler, str) and scheduler.optimizer is not optimizer:
            raise TrainStepError("the scheduler is attached to another optimizer than the one given")
        objects = (optimizer, None if isinstance(scheduler, str) else scheduler)
    if isinstance(scheduler, str):
        scheduler = parse_scheduler(scheduler, (spec.name, spec.groups[0]))
        if objects is not None:
            objects = None  # rebuilt from the spec: the text's scheduler goes on a fresh optimizer
    return Training(spec, as_loss(loss), scheduler, torch_objects=objects, **loop)
