"""train_step.py beside model.py: the translated model's jitted train step, with the user's
torch optimizer as optax code and their torch loss as JAX code, proven against torch.

`translate ... --optimizer "torch.optim.AdamW(lr=1e-3)" --loss "torch.nn.functional.cross_entropy"`
reads both texts with `ast` (never eval): a torch.optim class and a torch.nn loss, literal
keyword arguments only (training/texts.py). The optimizer becomes the optax chain
port/optimizers/chains.py builds, written out as source; the loss goes through
translate_function. The file imports only jax, flax, optax, numpy and the standard library.

The proof (`TrainStep.report`, in parity.md): check_step's per-tensor table (loss, every
gradient, BatchNorm statistics, parameters, moments) for STEPS steps with the file's loss,
and the file's own `train_step` run for STEPS steps in float64 against torch in `.double()`
(loss and every parameter after each step).
"""
from __future__ import annotations

import ast
import dataclasses

from flaxport.errors import UserError
from flaxport.port.weights import set_torch_mode
from flaxport.translate.training.losses import Loss, as_loss, parse_loss  # noqa: F401 - the module's API
from flaxport.translate.training.optimizer import (as_optimizer, chain_code, make_torch_optimizer,  # noqa: F401
                                                   optimizer_text, parse_optimizer, transform_sources)
from flaxport.translate.training.proof import ATOL, RTOL
from flaxport.translate.training.texts import TrainStepError  # noqa: F401

STEPS = 5


def optimizer_source(name: str, hyper: dict) -> tuple[str, list]:
    """The body of make_optimizer() for torch optimizer `name` (its class name) with `hyper`
    (torch's arguments; torch's defaults fill the rest) -> (code, transforms.py sources it needs).
    The chain is port/optimizers/chains.py's, as optax_from_torch builds it."""
    from flaxport.translate.training.optimizer import OptimizerSpec, make_optimizer_code

    code, extra = make_optimizer_code(OptimizerSpec(name, [hyper]))
    first = ast.parse(code).body[0].body[1].lineno - 1  # below the def and its docstring
    return "\n".join(line[4:] for line in code.splitlines()[first:]), extra


# --------------------------------------------------------------------------- the proof's record
@dataclasses.dataclass
class TrainStep:
    """The generated train step: `source` (train_step.py), `report` (check_step's StepReport),
    `rows` (the file's own step against torch in float64: (step, name, max_abs, ok))."""

    source: str
    report: object
    rows: list
    optimizer: str
    loss: str
    steps: int = STEPS
    bf16: object = None  # training.bf16.BF16Check, for precision="bf16"
    script: str = ""  # train.py
    targets: object = None  # the example batch's targets (torch), None for a loss that reads the outputs only

    @property
    def files(self) -> dict:
        """{file name: text} that Translation.save writes beside model.py."""
        return {"train_step.py": self.source, **({"train.py": self.script} if self.script else {})}

    @property
    def ok(self) -> bool:
        return self.report.ok and all(ok for *_, ok in self.rows) and (self.bf16 is None or self.bf16.ok)

    def headline(self) -> str:
        worst = max((r[2] for r in self.rows), default=0.0)
        verdict = "OK" if self.ok else "FAILED"
        return (f"train step ({self.steps} steps, {self.optimizer}, {self.loss}): {verdict}; check_step "
                f"{'ok' if self.report.ok else 'FAILED'}, train_step.py in float64 within {worst:.2g} of torch"
                + (f"; {self.bf16.line()}" if self.bf16 is not None else ""))

    def markdown(self) -> str:
        n = self.steps
        lines = ["", "## Train step (train_step.py)", "", f"**{self.headline()}**", "",
                 f"train_step.py's own `train_step`, {n} steps from the translated weights on the example batch, "
                 "against torch's optimizer and loss, both in float64 with dropout off (a row passes when "
                 f"max|torch - jax| <= {ATOL:g} + {RTOL:g} x max|torch|):", "",
                 "| step | tensor | max abs (float64) | |", "|---|---|---|---|"]
        lines += [f"| {s} | `{name}` | {d:.2e} | {'ok' if ok else 'FAIL'} |" for s, name, d, ok in self.rows
                  if name == "loss" or not ok or s == n]
        lines += ["", "(every parameter and BatchNorm statistic is compared after every step; the table shows the "
                  f"loss of each step, the tensors after step {n} and any row that fails)", "",
                  f"check_step with train_step.py's loss ({self.report.dtype}; rows that fail are rechecked in "
                  "float64 on their own; its rows that pass are left out here):", "", "```"]
        text = str(self.report).splitlines()
        footer = next((i for i, line in enumerate(text) if line.startswith("loss: ")), len(text))
        lines += text[:2] + [line for line in text[2:footer] if "FAIL" in line] + text[footer:] + ["```"]
        if self.bf16 is not None:
            from flaxport.translate.training.bf16 import FLOOR, GAP_FACTOR

            lines += ["", f"**{self.bf16.line()}**", "",
                      "train_step.py's `make_train_step(model, precision=\"bf16\")` against the same torch loop under "
                      "`torch.autocast(\"cpu\", dtype=torch.bfloat16)`; two correct bfloat16 runs round in different "
                      "places, so the scale is how far torch's own float32 loop is from that run: a check passes within "
                      f"{GAP_FACTOR:g} times that (plus {FLOOR:g})."]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- writing it
def write_train_step(t, module, optimizer, loss, batch=None, check: bool = True, steps: int = STEPS, *,
                     scheduler=None, scheduler_every: int = 1, clip_grad_norm: float | None = None,
                     norm_type: float = 2.0, clip_grad_value: float | None = None, accumulate: int = 1,
                     precision: str = "float32") -> TrainStep:
    """Generate train_step.py for translation `t` of `module`, prove it, set `t.train_step`
    (so `t.save(directory)` writes it) and return it.

    optimizer: a torch optimizer over module's parameters (any torch.optim class but LBFGS and
    SparseAdam; several param groups allowed; its hyperparameters are read, its state is not),
    or a text such as "torch.optim.AdamW(lr=3e-4)". loss: a torch.nn loss function or module,
    or its text. scheduler: a torch LR scheduler on that optimizer, or a text such as
    "torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=1000)"; scheduler_every:
    optimizer steps per scheduler.step(). clip_grad_norm / norm_type / clip_grad_value: torch's
    clipping before each step; accumulate: micro-batches per step. precision: "bf16" also writes
    torch.autocast's bfloat16 policy (make_train_step(..., precision="bf16"), the default then)
    and checks it against torch under autocast (TrainStep.bf16). batch: (inputs, targets)
    in torch's layout; by default the translation's example inputs and targets drawn for the
    loss (the batch must split into `accumulate` equal micro-batches).
    """
    import copy

    import torch

    from flaxport.translate.function import translate_function
    from flaxport.translate.training import proof
    from flaxport.translate.training.loop import training
    from flaxport.translate.training.optimizer import make_optimizer_code
    from flaxport.translate.training.source import loss_function_name, train_step_source

    plan = training(optimizer, loss, module, scheduler, scheduler_every=int(scheduler_every),
                    clip_grad_norm=clip_grad_norm, norm_type=float(norm_type), clip_grad_value=clip_grad_value,
                    accumulate=int(accumulate))
    loss = plan.loss
    inputs = tuple(t.call_arguments) if batch is None else tuple(batch[0]) if isinstance(batch[0], (tuple, list)) \
        else (batch[0],)
    if inputs and inputs[0].shape[0] % plan.accumulate:
        raise TrainStepError(f"--accumulate {plan.accumulate}: the example batch of {inputs[0].shape[0]} does not split "
                             f"into {plan.accumulate} equal micro-batches (give --input a batch that does)")
    with torch.no_grad():
        example_out = set_torch_mode(copy.deepcopy(module), False)(*inputs)
    if hasattr(example_out, "to_tuple"):  # a HuggingFace ModelOutput: the translation returns its tuple
        example_out = example_out.to_tuple()
    tuple_output = isinstance(example_out, (tuple, list))
    if loss.outputs > 1 and (not tuple_output or len(example_out) < loss.outputs):
        raise TrainStepError(f"--loss {loss.text!r}: {loss.name} reads {loss.outputs} outputs of the model, which "
                             f"returns {len(example_out) if tuple_output else 1}")
    targets = loss.targets(example_out) if batch is None else batch[1]
    arguments = loss.arguments(example_out, targets)
    tensors = {k: torch.tensor(v, dtype=arguments[0].dtype) for k, v in loss.kwargs.items()
               if k in ("weight", "pos_weight") and v is not None}
    fixed = {k: v for k, v in loss.kwargs.items() if k not in tensors}
    jax_loss = translate_function(getattr(torch.nn.functional, loss.name), *arguments, check=False, **fixed, **tensors)
    loss_name = loss_function_name(jax_loss.source)
    if loss_name is None:
        raise UserError(f"--loss {loss.text!r}: its translation needs state; pass a plain loss function")
    schedule = plan.schedule_links(module)
    optimizer_code, extra = make_optimizer_code(plan.optimizer, schedule, plan.clip_links(), t.names)
    loss_text = f"torch.nn.functional.{loss.name}" + (
        f"({', '.join(f'{k}={v!r}' for k, v in loss.kwargs.items())})" if loss.kwargs else "")
    targets_arg = ", targets" if loss.has_targets else ""
    header = (f"Train step of {t.root_class} (model.py), written by `flaxport translate`.\n\n"
              f"Optimizer: {plan.describe()}, as optax. Loss: {loss_text}, in JAX.\n\n"
              "    model = model_py.load(directory)\n"
              "    train_step, state, write_back = make_train_step(model)\n"
              f"    for inputs{targets_arg} in batches:\n"
              f"        state, loss = train_step(state, inputs{targets_arg})\n"
              "    write_back(state)\n")
    input_names = list(next(iter(t.plan.captures.values())).input_names)
    if precision not in ("float32", "bf16"):
        raise TrainStepError(f"--precision {precision!r}: float32 or bf16")
    order = [n for names in plan.optimizer.members for n in names] if plan.optimizer.members else \
        [n for n, _ in module.named_parameters()]
    extra.append("# torch's optimizer numbers the parameters in this order (the keys of its state_dict()['state'])\n"
                 f"OPTIMIZER_PARAMETERS = {tuple(order)!r}")
    source = train_step_source(input_names, loss, jax_loss.source, loss_name, optimizer_code, extra, header,
                               tuple_output, plan.accumulate, len(plan.optimizer.groups) > 1, precision)
    from flaxport.port.optimizers.chains import MOMENTS, SCALARS
    from flaxport.translate.training.script import train_script_source

    key = plan.optimizer.name.lower()
    script = train_script_source(t.root_class, plan.optimizer.name, MOMENTS[key], SCALARS.get(key, {}), input_names,
                                 loss.has_targets, precision == "bf16")
    step = TrainStep(source, None, [], plan.describe(), f"F.{loss.name}", steps, script=script,
                     targets=targets if loss.has_targets else None)
    if check:
        step.report, step.rows = proof.prove(t, module, plan, source, inputs, targets, steps)
        if precision == "bf16":
            from flaxport.translate.training.bf16 import check_bf16

            step.bf16 = check_bf16(t, module, plan, source, inputs, targets, steps)
    t.train_step = step
    return step
