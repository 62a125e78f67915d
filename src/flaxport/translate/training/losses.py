"""Every torch.nn loss as train_step.py sees it: which model outputs and targets it reads, in what
order, the example targets its proof draws, and the few that are refused (and why).

A loss is written as its torch.nn.functional name translated to JAX (translate_function),
called by `loss_fn(outputs, targets)`: one output and the targets for most; two outputs
and the targets for cosine_embedding_loss / margin_ranking_loss; three outputs and no
targets for the triplet losses. Tensor options (weight, pos_weight) are kept as constants.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect

from flaxport.errors import first_line
from flaxport.translate.training.texts import TrainStepError, check_literals, literal_kwargs, read_call, split_name


@dataclasses.dataclass(frozen=True)
class LossSpec:
    module: str  # the torch.nn class
    order: str = "ot"  # the arguments: o the next model output, t the targets
    targets: str = "like"  # the example targets the proof draws (see Loss.targets)


SPECS = {
    "cross_entropy": LossSpec("CrossEntropyLoss", targets="class"),
    "nll_loss": LossSpec("NLLLoss", targets="class"),
    "multi_margin_loss": LossSpec("MultiMarginLoss", targets="class"),
    "mse_loss": LossSpec("MSELoss"), "l1_loss": LossSpec("L1Loss"), "smooth_l1_loss": LossSpec("SmoothL1Loss"),
    "huber_loss": LossSpec("HuberLoss"),
    "binary_cross_entropy": LossSpec("BCELoss", targets="probability"),
    "binary_cross_entropy_with_logits": LossSpec("BCEWithLogitsLoss", targets="probability"),
    "kl_div": LossSpec("KLDivLoss", targets="probability"),
    "poisson_nll_loss": LossSpec("PoissonNLLLoss", targets="count"),
    "hinge_embedding_loss": LossSpec("HingeEmbeddingLoss", targets="sign"),
    "soft_margin_loss": LossSpec("SoftMarginLoss", targets="sign"),
    "multilabel_soft_margin_loss": LossSpec("MultiLabelSoftMarginLoss", targets="binary"),
    "multilabel_margin_loss": LossSpec("MultiLabelMarginLoss", targets="multilabel"),
    "cosine_embedding_loss": LossSpec("CosineEmbeddingLoss", order="oot", targets="row_sign"),
    "margin_ranking_loss": LossSpec("MarginRankingLoss", order="oot", targets="sign"),
    "triplet_margin_loss": LossSpec("TripletMarginLoss", order="ooo", targets="none"),
    "triplet_margin_with_distance_loss": LossSpec("TripletMarginWithDistanceLoss", order="ooo", targets="none"),
}
MODULES = {s.module: f for f, s in SPECS.items()}
# The torch.nn losses train_step.py is not written for, and why (by function and module name).
REFUSED = {
    "gaussian_nll_loss": "it checks `torch.any(var < 0)` on the values, which torch.export cannot capture; write "
                         "0.5 * (log(var) + (input - target) ** 2 / var) out in a loss function of your own",
    "ctc_loss": "torch.export cannot capture aten._ctc_loss (its output size depends on the lengths); optax.ctc_loss "
                "computes it from padded logits and paddings",
    "AdaptiveLogSoftmaxWithLoss": "it holds weights of its own: make it the model's last layer and train its output "
                                  "with nll_loss",
    "LinearCrossEntropyLoss": "it holds weights of its own: make its linear layer the model's last and use "
                              "cross_entropy",
}
REFUSED["GaussianNLLLoss"], REFUSED["CTCLoss"] = REFUSED["gaussian_nll_loss"], REFUSED["ctc_loss"]
TENSOR_OPTIONS = ("weight", "pos_weight")


@dataclasses.dataclass
class Loss:
    """A loss: F.<name> with fixed keyword arguments (tensor options as tuples of numbers)."""

    name: str  # the torch.nn.functional name
    kwargs: dict
    text: str  # as the user wrote it

    @property
    def spec(self) -> LossSpec:
        return SPECS[self.name]

    @property
    def outputs(self) -> int:
        """How many of the model's outputs the loss reads."""
        return self.spec.order.count("o")

    @property
    def has_targets(self) -> bool:
        return "t" in self.spec.order

    def torch_kwargs(self, dtype=None) -> dict:
        import torch

        return {k: torch.tensor(v, dtype=dtype) if k in TENSOR_OPTIONS and v is not None else v
                for k, v in self.kwargs.items()}

    def arguments(self, outputs, targets) -> list:
        """The loss function's positional arguments from the model's outputs and the targets."""
        if hasattr(outputs, "to_tuple"):  # a HuggingFace ModelOutput
            outputs = outputs.to_tuple()
        outs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        taken, args = iter(outs), []
        for kind in self.spec.order:
            args.append(next(taken) if kind == "o" else targets)
        return args

    def torch_call(self, outputs, targets, dtype=None):
        import torch.nn.functional as F

        return getattr(F, self.name)(*self.arguments(outputs, targets), **self.torch_kwargs(dtype))

    @property
    def torch_fn(self):
        return functools.partial(_torch_loss, self)

    def targets(self, outputs, seed: int = 0):
        """Example targets for the model's example `outputs` (torch), drawn as the loss reads them;
        None for a loss without targets."""
        import torch

        out = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        g = torch.Generator().manual_seed(seed)
        kind = self.spec.targets
        if kind == "none":
            return None
        if kind == "class":
            shape = (out.shape[0],) + tuple(out.shape[2:]) if out.ndim > 1 else ()
            return torch.randint(0, out.shape[1] if out.ndim > 1 else out.shape[0], shape, generator=g)
        if kind == "probability":
            if self.name == "kl_div" and self.kwargs.get("log_target"):
                return torch.randn(out.shape, generator=g, dtype=out.dtype)
            return torch.rand(out.shape, generator=g, dtype=out.dtype)
        if kind == "count":
            return torch.floor(torch.rand(out.shape, generator=g, dtype=out.dtype) * 4)
        if kind == "binary":
            return (torch.rand(out.shape, generator=g) > 0.5).to(out.dtype)
        if kind == "sign":
            return (torch.rand(out.shape, generator=g) > 0.5).to(out.dtype) * 2 - 1
        if kind == "row_sign":
            return (torch.rand(out.shape[:1], generator=g) > 0.5).to(out.dtype) * 2 - 1
        if kind == "multilabel":  # class ids up to a -1, the rest ignored
            ids = torch.randint(0, out.shape[-1], out.shape, generator=g)
            ends = torch.randint(1, out.shape[-1] + 1, out.shape[:-1] + (1,), generator=g)
            return torch.where(torch.arange(out.shape[-1]) < ends, ids, -1)
        return torch.randn(out.shape, generator=g, dtype=out.dtype)


def _torch_loss(loss, outputs, targets):
    dtype = (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).dtype
    return loss.torch_call(outputs, targets, dtype)


def refused(name: str) -> str | None:
    return REFUSED.get(name)


def check_options(name: str, kwargs: dict, text: str) -> dict:
    """kwargs checked against F.<name>'s options; tensor options as tuples of floats."""
    import torch
    import torch.nn.functional as F

    allowed = set(inspect.signature(getattr(F, name)).parameters) - {
        "input", "target", "size_average", "reduce", "input1", "input2", "anchor", "positive", "negative"}
    if bad := sorted(set(kwargs) - allowed):
        raise TrainStepError(f"--loss {text!r}: {name} has no option {bad[0]!r} "
                             f"(options: {', '.join(sorted(allowed))})")
    if kwargs.get("distance_function") is not None:
        raise TrainStepError(f"--loss {text!r}: distance_function is code; train_step.py takes the default distance")
    out = dict(kwargs)
    for k in TENSOR_OPTIONS:
        v = out.get(k)
        if v is None:
            continue
        if torch.is_tensor(v):
            v = v.detach().cpu().double().tolist()
        if not isinstance(v, (list, tuple)) or not _numbers(v):
            raise TrainStepError(f"--loss {text!r}: {k}= must be numbers, e.g. {k}=(1.0, 2.0, 0.5)")
        out[k] = _tuple(v)
    return out


def _numbers(v) -> bool:
    return all(_numbers(e) if isinstance(e, (list, tuple)) else isinstance(e, (int, float)) and not isinstance(e, bool)
               for e in v)


def _tuple(v):
    return tuple(_tuple(e) if isinstance(e, (list, tuple)) else float(e) for e in v)


def from_object(loss) -> Loss:
    """A torch loss function or loss module -> Loss (one line, TrainStepError, otherwise)."""
    import torch
    import torch.nn.functional as F

    if isinstance(loss, torch.nn.Module):
        cls = type(loss).__name__
        if cls in REFUSED:
            raise TrainStepError(f"nn.{cls} is not written into train_step.py: {REFUSED[cls]}")
        if cls not in MODULES:
            raise TrainStepError(f"the loss {cls} is not a torch.nn loss train_step.py is written for")
        name = MODULES[cls]
        params = inspect.signature(getattr(F, name)).parameters
        kwargs = {k: getattr(loss, k) for k in params if hasattr(loss, k) and k not in ("size_average", "reduce")}
        kwargs = {k: v for k, v in kwargs.items()
                  if torch.is_tensor(v) or v is None or v != params[k].default}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return Loss(name, check_options(name, kwargs, f"nn.{cls}"), f"nn.{cls}")
    name = getattr(loss, "__name__", "")
    if name in REFUSED and getattr(F, name, None) is loss:
        raise TrainStepError(f"F.{name} is not written into train_step.py: {REFUSED[name]}")
    if name in SPECS and getattr(F, name) is loss:
        return Loss(name, {}, f"F.{name}")
    raise TrainStepError(f"the loss {name or type(loss).__name__} is not a torch.nn loss train_step.py is written "
                         "for; pass a torch.nn.functional loss or a torch.nn loss module")


def parse_loss(text: str) -> Loss:
    """'torch.nn.functional.cross_entropy', 'F.mse_loss(reduction="sum")' or
    'nn.CrossEntropyLoss(label_smoothing=0.1)' -> Loss (one line, TrainStepError, otherwise)."""
    dotted, call = read_call(text, "--loss")
    prefix, name = split_name(dotted, ("", "torch.nn.functional", "nn.functional", "F", "torch.nn", "nn"))
    functional = prefix in ("", "torch.nn.functional", "nn.functional", "F")
    if prefix != "?" and name in REFUSED:
        raise TrainStepError(f"--loss {text!r}: {name} is not written into train_step.py: {REFUSED[name]}")
    if functional and name in SPECS:
        fn_name = name
    elif prefix in ("", "torch.nn", "nn") and name in MODULES:
        fn_name = MODULES[name]
    else:
        raise TrainStepError(f"--loss {text!r}: not one of the losses train_step.py is written for: "
                             f"torch.nn.functional.{{{', '.join(SPECS)}}} or their torch.nn modules")
    kwargs = literal_kwargs(call, text, "--loss")
    import torch.nn.functional as F

    check_literals("--loss", text, {k: v for k, v in kwargs.items() if k not in TENSOR_OPTIONS}, getattr(F, fn_name))
    loss = Loss(fn_name, check_options(fn_name, kwargs, text), text)
    _try_options(loss)
    return loss


def _try_options(loss: Loss) -> None:
    """torch's own checks of the options (a reduction it does not know, a smoothing above 1):
    the loss on a tiny example with the options and, to tell them apart from the example, without."""
    import torch

    widths = [len(v) for k, v in loss.kwargs.items() if k in TENSOR_OPTIONS and isinstance(v, (tuple, list))]
    out = torch.rand(2, widths[0] if widths else 3, generator=torch.Generator().manual_seed(0),
                     dtype=torch.float64) * 0.8 + 0.1
    outputs = tuple(out for _ in range(loss.outputs)) if loss.outputs > 1 else out

    def error(options: Loss):
        try:
            options.torch_call(outputs, options.targets(outputs), torch.float64)
        except Exception as e:  # noqa: BLE001 - the options the user wrote: one line
            return e
        return None

    e = error(loss)
    if e is not None and error(Loss(loss.name, {}, loss.text)) is None:
        raise TrainStepError(f"--loss {loss.text!r}: torch refuses these options: {type(e).__name__}: "
                             f"{first_line(e)}")


def as_loss(loss) -> Loss:
    """A torch loss function or loss module, or a --loss text -> Loss."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        return parse_loss(loss)
    return from_object(loss)
