"""The LR scheduler of train_step.py: read from --scheduler (or a torch scheduler object), built on
the torch optimizer for the proof, and written out as the schedule functions make_optimizer uses.

`--scheduler "torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=1000)"`: a class
of torch.optim.lr_scheduler with literal keyword arguments (the optimizer is the model's);
SequentialLR / ChainedScheduler take `schedulers=[...]` of such calls, LambdaLR a
`lr_lambda=lambda step: ...` of arithmetic (read with `ast`, evaluated node by node for torch,
translated for JAX; never run).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect

from flaxport.translate.training.texts import TrainStepError, literal, read_call, split_name

PREFIXES = ("", "torch.optim.lr_scheduler", "lr_scheduler", "optim.lr_scheduler")


@dataclasses.dataclass
class SchedulerText:
    """A --scheduler text read: class name, literal kwargs (nested SchedulerTexts in `schedulers`)."""

    name: str
    kwargs: dict
    text: str

    def make(self, optimizer):
        """The torch scheduler on `optimizer` (the proof's)."""
        import torch

        cls = getattr(torch.optim.lr_scheduler, self.name)
        kwargs = dict(self.kwargs)
        if "schedulers" in kwargs:
            kwargs["schedulers"] = [s.make(optimizer) for s in kwargs["schedulers"]]
        if "lr_lambda" in kwargs:
            kwargs["lr_lambda"] = kwargs["lr_lambda"].fn
        try:
            if self.name == "ChainedScheduler":
                return cls(kwargs.pop("schedulers"), **kwargs)
            return cls(optimizer, **kwargs)
        except (TypeError, ValueError, KeyError) as e:
            raise TrainStepError(f"--scheduler {self.text!r}: torch refuses it: {str(e).splitlines()[0]}") from None


def parse_scheduler(text: str, optimizer=("SGD", {"lr": 0.1, "momentum": 0.9})) -> SchedulerText:
    """'torch.optim.lr_scheduler.StepLR(step_size=10)' -> SchedulerText, checked: torch accepts it
    on `optimizer` ((class name, kwargs)) and its schedule translates (else one line, TrainStepError)."""
    from flaxport.translate.training.optimizer import make_torch_optimizer

    spec = _read(text, text)
    import torch

    name, kwargs = optimizer
    probe = make_torch_optimizer(name, kwargs, [torch.nn.Parameter(torch.zeros(2, 2))])
    links(spec.make(probe), text)
    return spec


def _read(text: str, whole: str, node=None) -> SchedulerText:
    import torch

    if node is None:
        dotted, call = read_call(text, "--scheduler")
    else:
        call = node if isinstance(node, ast.Call) else None
        dotted = ast.unparse(call.func if call else node)
    prefix, name = split_name(dotted, PREFIXES)
    known = [n for n, c in vars(torch.optim.lr_scheduler).items()
             if inspect.isclass(c) and issubclass(c, torch.optim.lr_scheduler.LRScheduler) and not n.startswith("_")
             and n != "LRScheduler"] + ["ReduceLROnPlateau"]
    if prefix == "?" or name not in known:
        raise TrainStepError(f"--scheduler {whole!r}: {dotted} is not a torch.optim.lr_scheduler class")
    kwargs = {}
    if call is not None:
        if call.args:
            raise TrainStepError(f"--scheduler {whole!r}: keyword arguments only (the optimizer is the model's), "
                                 "e.g. StepLR(step_size=10, gamma=0.5)")
        for kw in call.keywords:
            if kw.arg is None:
                raise TrainStepError(f"--scheduler {whole!r}: no ** arguments, write each keyword out")
            if kw.arg == "schedulers":
                if not isinstance(kw.value, (ast.List, ast.Tuple)):
                    raise TrainStepError(f"--scheduler {whole!r}: schedulers= is a list of scheduler calls")
                kwargs["schedulers"] = [_read(ast.unparse(e), whole, e) for e in kw.value.elts]
            elif kw.arg == "lr_lambda" and isinstance(kw.value, ast.Lambda):
                from flaxport.port.optimizers.lambdas import translate_text_lambda
                from flaxport.port.schedules import UnsupportedSchedulerError

                try:
                    kwargs["lr_lambda"] = translate_text_lambda(kw.value)
                except UnsupportedSchedulerError as e:
                    raise TrainStepError(f"--scheduler {whole!r}: {e}") from None
            else:
                kwargs[kw.arg] = literal(kw.value, whole, "--scheduler", kw.arg)
    return SchedulerText(name, kwargs, text)


def links(torch_scheduler, text: str = ""):
    """schedule_links.from_torch, its refusal as one line naming the scheduler."""
    from flaxport.port.optimizers import schedule_links
    from flaxport.port.schedules import UnsupportedSchedulerError

    try:
        return schedule_links.from_torch(torch_scheduler)
    except UnsupportedSchedulerError as e:
        raise TrainStepError(f"--scheduler {text!r}: {e}" if text else str(e)) from None
