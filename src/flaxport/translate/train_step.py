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

import dataclasses

from flaxport.errors import UserError
from flaxport.translate.training.losses import Loss, as_loss, parse_loss  # noqa: F401 - the module's API
from flaxport.translate.training.optimizer import (as_optimizer, chain_code, make_torch_optimizer,  # noqa: F401
                                                   optimizer_text, parse_optimizer, transform_sources)
from flaxport.translate.training.proof import ATOL, RTOL, namespace as _namespace  # noqa: F401
from flaxport.translate.training.texts import TrainStepError  # noqa: F401

STEPS = 5


def optimizer_source(name: str, hyper: dict) -> tuple[str, list]:
    """The body of make_optimizer() for torch optimizer `name` (its class name) with `hyper`
    (torch's arguments; torch's defaults fill the rest) -> (code, transforms.py sources it needs).
    The chain is port/optimizers/chains.py's, as optax_from_torch builds it."""
    from flaxport.port.optimizers import chains

    key = name.lower()
    h = chains.hyper(key, hyper)
    chain = chains.links(key, h)
    lines = [f"learning_rate = {float(h['lr'])!r}",
             "return " + chain_code(chain)]
    return "\n".join(lines), transform_sources(chains.custom(chain))


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

    @property
    def ok(self) -> bool:
        return self.report.ok and all(ok for *_, ok in self.rows)

    def headline(self) -> str:
        worst = max((r[2] for r in self.rows), default=0.0)
        verdict = "OK" if self.ok else "FAILED"
        return (f"train step ({self.steps} steps, {self.optimizer}, {self.loss}): {verdict}; check_step "
                f"{'ok' if self.report.ok else 'FAILED'}, train_step.py in float64 within {worst:.2g} of torch")

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
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- writing it
def write_train_step(t, module, optimizer, loss, batch=None, check: bool = True, steps: int = STEPS) -> TrainStep:
    """Generate train_step.py for translation `t` of `module`, prove it, set `t.train_step`
    (so `t.save(directory)` writes it) and return it.

    optimizer: a torch optimizer (any torch.optim class but LBFGS and SparseAdam; its
    hyperparameters are read, its state is not), or a text such as "torch.optim.AdamW(lr=3e-4)".
    loss: a torch.nn loss function or module, or its text. batch: (inputs, targets) in torch's
    layout; by default the translation's example inputs and targets drawn for the loss.
    """
    import copy

    import torch

    from flaxport.translate.function import translate_function
    from flaxport.translate.training import proof
    from flaxport.translate.training.source import loss_function_name, optimizer_function, train_step_source

    name, kwargs = as_optimizer(optimizer)
    loss = as_loss(loss)
    inputs = tuple(t.call_arguments) if batch is None else tuple(batch[0]) if isinstance(batch[0], (tuple, list)) \
        else (batch[0],)
    with torch.no_grad():
        example_out = copy.deepcopy(module).eval()(*inputs)
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
    body, extra = optimizer_source(name, kwargs)
    opt_text = optimizer_text(name, kwargs)
    loss_text = f"torch.nn.functional.{loss.name}" + (
        f"({', '.join(f'{k}={v!r}' for k, v in loss.kwargs.items())})" if loss.kwargs else "")
    targets_arg = ", targets" if loss.has_targets else ""
    header = (f"Train step of {t.root_class} (model.py), written by `flaxport translate`.\n\n"
              f"Optimizer: {opt_text}, as optax. Loss: {loss_text}, in JAX.\n\n"
              "    model = model_py.load(directory)\n"
              "    train_step, state, write_back = make_train_step(model)\n"
              f"    for inputs{targets_arg} in batches:\n"
              f"        state, loss = train_step(state, inputs{targets_arg})\n"
              "    write_back(state)\n")
    input_names = list(next(iter(t.plan.captures.values())).input_names)
    source = train_step_source(input_names, loss, jax_loss.source, loss_name,
                               optimizer_function(body, f"{opt_text} as optax: torch's steps, in torch's order."),
                               extra, header, tuple_output)
    step = TrainStep(source, None, [], opt_text, f"F.{loss.name}", steps)
    if check:
        step.report, step.rows = proof.prove(t, module, (name, kwargs), loss, source, inputs, targets, steps)
    t.train_step = step
    return step
