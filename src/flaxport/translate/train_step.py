"""train_step.py beside model.py: the translated model's jitted train step, with the user's
torch optimizer as optax code and their torch loss as JAX code, proven against torch.

`translate ... --optimizer "torch.optim.AdamW(lr=1e-3)" --loss "torch.nn.functional.cross_entropy"`
reads both texts with `ast` (never eval): a class or function from a short list, literal
keyword arguments only. The optimizer becomes the optax chain optax_from_torch builds,
written out as source; the loss goes through translate_function. The file imports only
jax, flax, optax, numpy and the standard library.

The proof (`TrainStep.report`, in parity.md): check_step's per-tensor table (loss, every
gradient, BatchNorm statistics, parameters, moments) for 3 steps with the file's loss, and
the file's own `train_step` run for 3 steps in float64 against torch in `.double()`
(loss and every parameter after each step).
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math

import numpy as np

from flaxport.errors import UserError

OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad")  # those optax_from_torch translates
# Loss functions (torch.nn.functional) and the loss modules that call them.
LOSSES = {"cross_entropy": "CrossEntropyLoss", "nll_loss": "NLLLoss", "mse_loss": "MSELoss", "l1_loss": "L1Loss",
          "smooth_l1_loss": "SmoothL1Loss", "huber_loss": "HuberLoss",
          "binary_cross_entropy_with_logits": "BCEWithLogitsLoss"}
_CLASS_TARGETS = ("cross_entropy", "nll_loss")  # targets are class ids (the rest: tensors like the output)
STEPS = 3
ATOL = RTOL = 1e-5


class TrainStepError(UserError):
    """An --optimizer or --loss text flaxport does not read."""


# --------------------------------------------------------------------------- reading the texts
def _call(text: str, what: str):
    """'a.b.C(k=1)' or 'a.b.c' -> ('a.b.C', the ast.Call or None); read, never run."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise TrainStepError(f"{what} {text!r}: not a Python expression such as {_EXAMPLES[what]}") from None
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    parts = []
    while isinstance(target, ast.Attribute):
        parts.insert(0, target.attr)
        target = target.value
    if not isinstance(target, ast.Name):
        raise TrainStepError(f"{what} {text!r}: write a name such as {_EXAMPLES[what]}")
    return ".".join([target.id] + parts), call


def _kwargs(call, text: str, what: str) -> dict:
    """The literal keyword arguments of `call` (None: no call)."""
    if call is None:
        return {}
    if call.args:
        raise TrainStepError(f"{what} {text!r}: keyword arguments only (the parameters are the model's), "
                             f"e.g. {_EXAMPLES[what]}")
    kwargs = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise TrainStepError(f"{what} {text!r}: no ** arguments, write each keyword out")
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise TrainStepError(f"{what} {text!r}: {kw.arg}= must be a literal (a number, string, "
                                 "True/False/None or a tuple of them)") from None
    return kwargs


_EXAMPLES = {"--optimizer": '"torch.optim.AdamW(lr=1e-3, weight_decay=0.01)"',
             "--loss": '"torch.nn.functional.cross_entropy" or "nn.CrossEntropyLoss(label_smoothing=0.1)"'}


def parse_optimizer(text: str) -> tuple[str, dict]:
    """'torch.optim.AdamW(lr=1e-3)' -> ('AdamW', {'lr': 1e-3}), checked: torch accepts the
    arguments and optax_from_torch translates them (else one line, TrainStepError / UserError)."""
    dotted, call = _call(text, "--optimizer")
    prefix, _, name = dotted.rpartition(".")
    if prefix not in ("", "torch.optim", "optim"):
        raise TrainStepError(f"--optimizer {text!r}: name a torch.optim class ({', '.join(OPTIMIZERS)})")
    if name not in OPTIMIZERS:
        from flaxport.port.optim import CLOSEST

        closest = CLOSEST.get(name.lower())
        raise TrainStepError(f"--optimizer {text!r}: {name} is not translated (translated: {', '.join(OPTIMIZERS)})"
                             + (f"; the closest optax optimizer is {closest}" if closest else ""))
    kwargs = _kwargs(call, text, "--optimizer")
    import torch

    _check_literals("--optimizer", text, kwargs, _defaults(getattr(torch.optim, name)))
    make_torch_optimizer(name, kwargs, [_dummy_parameter()])  # torch's own checks of the arguments
    from flaxport.port.optim import optax_from_torch

    optax_from_torch({"name": name.lower(), **kwargs})  # raises for what has no optax translation
    return name, kwargs


def _dummy_parameter():
    import torch

    return torch.nn.Parameter(torch.zeros(1))


def make_torch_optimizer(name: str, kwargs: dict, params):
    import torch

    try:
        return getattr(torch.optim, name)(params, **kwargs)
    except Exception as e:  # noqa: BLE001 - torch's checks of the arguments (TypeError, ValueError, IndexError)
        raise TrainStepError(f"--optimizer torch.optim.{name}: {(str(e).splitlines() or [type(e).__name__])[0]}") \
            from None


def _defaults(fn) -> dict:
    """{keyword: default} of a torch function or class."""
    return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def _check_literals(what: str, text: str, kwargs: dict, defaults: dict) -> None:
    """Every literal keyword argument shaped like torch's default for it: finite numbers, as
    many numbers as the default's tuple, True/False for a switch (torch checks some of these
    only when it steps, and a bare inf would land in the written file)."""
    for key, value in kwargs.items():
        why = _unlike(value, defaults.get(key))
        if why:
            raise TrainStepError(f"{what} {text!r}: {key}={value!r} {why}")


def _unlike(value, default) -> str | None:
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    values = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
        return "is not a finite number"
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "must be True or False"
    if number(default) and not number(value):
        return f"must be a number (like {default!r})"
    if isinstance(default, tuple) and not (isinstance(value, tuple) and len(value) == len(default)
                                           and all(number(v) for v in value)):
        return f"must be a tuple of {len(default)} numbers (like {default!r})"
    return None


@dataclasses.dataclass
class Loss:
    """A loss read from --loss: F.<name> with fixed keyword arguments."""

    name: str  # the torch.nn.functional name
    kwargs: dict
    text: str  # as the user wrote it

    @property
    def torch_fn(self):
        import torch.nn.functional as F

        fn = getattr(F, self.name)
        return functools.partial(fn, **self.kwargs) if self.kwargs else fn

    def targets(self, outputs, seed: int = 0):
        """Example targets for `outputs` (the model's example output, torch): class ids below
        the class count (axis 1) for cross_entropy / nll_loss, else values shaped like it."""
        import torch

        out = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        g = torch.Generator().manual_seed(seed)
        if self.name in _CLASS_TARGETS:
            shape = (out.shape[0],) + tuple(out.shape[2:])
            return torch.randint(0, out.shape[1], shape, generator=g)
        if self.name == "binary_cross_entropy_with_logits":
            return torch.rand(out.shape, generator=g, dtype=out.dtype)
        return torch.randn(out.shape, generator=g, dtype=out.dtype)


def parse_loss(text: str) -> Loss:
    """'torch.nn.functional.cross_entropy', 'F.mse_loss(reduction="sum")' or
    'nn.CrossEntropyLoss(label_smoothing=0.1)' -> Loss (one line, TrainStepError, otherwise)."""
    dotted, call = _call(text, "--loss")
    prefix, _, name = dotted.rpartition(".")
    modules = {m: f for f, m in LOSSES.items()}
    if prefix in ("", "torch.nn.functional", "nn.functional", "F") and name in LOSSES:
        fn_name = name
    elif prefix in ("", "torch.nn", "nn") and name in modules:
        fn_name = modules[name]
    else:
        raise TrainStepError(f"--loss {text!r}: not one of the losses train_step.py is written for: "
                             f"torch.nn.functional.{{{', '.join(LOSSES)}}} or their modules "
                             f"(nn.{', nn.'.join(LOSSES.values())})")
    kwargs = _kwargs(call, text, "--loss")
    import torch.nn.functional as F

    allowed = set(inspect.signature(getattr(F, fn_name)).parameters) - {"input", "target", "size_average", "reduce"}
    if bad := sorted(set(kwargs) - allowed):
        raise TrainStepError(f"--loss {text!r}: {fn_name} has no option {bad[0]!r} "
                             f"(options: {', '.join(sorted(allowed))})")
    if isinstance(kwargs.get("weight"), (list, tuple)) or isinstance(kwargs.get("pos_weight"), (list, tuple)):
        raise TrainStepError(f"--loss {text!r}: class weights are tensors; pass the loss from Python instead")
    _check_literals("--loss", text, kwargs, _defaults(getattr(F, fn_name)))
    _try_loss(fn_name, kwargs, text)
    return Loss(fn_name, kwargs, text)


def _try_loss(fn_name: str, kwargs: dict, text: str) -> None:
    """torch's own checks of the options (a reduction it does not know, a smoothing above 1):
    the loss on a tiny example, 2 rows of 3 classes or features."""
    import torch
    import torch.nn.functional as F

    target = torch.zeros(2, dtype=torch.long) if fn_name in _CLASS_TARGETS else torch.zeros(2, 3)
    try:
        getattr(F, fn_name)(torch.zeros(2, 3), target, **kwargs)
    except Exception as e:  # noqa: BLE001 - the options the user wrote: one line
        raise TrainStepError(f"--loss {text!r}: torch refuses these options: {type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:200]}") from None


def as_optimizer(optimizer) -> tuple[str, dict]:
    """A torch optimizer object, a (class name, kwargs) pair or an --optimizer text -> (name, kwargs)."""
    if isinstance(optimizer, str):
        return parse_optimizer(optimizer)
    if isinstance(optimizer, tuple):
        return optimizer
    from flaxport.port.optim import TORCH_DEFAULTS, spec_from_torch

    spec = spec_from_torch(optimizer)
    name = type(optimizer).__name__
    if name not in OPTIMIZERS:
        return parse_optimizer(f"torch.optim.{name}()")  # its one line: not translated, and the closest
    defaults = TORCH_DEFAULTS[name.lower()]
    return name, {k: v for k, v in spec.items() if k in defaults and k != "decoupled_weight_decay" and v != defaults[k]}


def as_loss(loss) -> Loss:
    """A torch loss function or loss module from the list, or a --loss text -> Loss."""
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        return parse_loss(loss)
    import torch
    import torch.nn.functional as F

    modules = {m: f for f, m in LOSSES.items()}
    if isinstance(loss, torch.nn.Module) and type(loss).__name__ in modules:
        name = modules[type(loss).__name__]
        params = inspect.signature(getattr(F, name)).parameters
        kwargs = {k: getattr(loss, k) for k in params if hasattr(loss, k) and k not in ("size_average", "reduce")}
        if any(torch.is_tensor(v) for v in kwargs.values()):
            raise TrainStepError(f"{type(loss).__name__} with tensor weights is not written into train_step.py")
        kwargs = {k: v for k, v in kwargs.items() if v != params[k].default}
        return Loss(name, kwargs, f"nn.{type(loss).__name__}")
    name = getattr(loss, "__name__", "")
    if name in LOSSES and getattr(F, name) is loss:
        return Loss(name, {}, f"F.{name}")
    raise TrainStepError(f"the loss {name or type(loss).__name__} is not one train_step.py is written for: "
                         f"torch.nn.functional.{{{', '.join(LOSSES)}}} or their modules")


# --------------------------------------------------------------------------- the optimizer as source
def optimizer_source(name: str, hyper: dict) -> tuple[str, list]:
    """The body of make_optimizer() for torch optimizer `name` (its class name) with `hyper`
    (torch's arguments; torch's defaults fill the rest) -> (code, runtime sources it needs).
    Mirrors port/optim.py's optax_from_torch (no scheduler)."""
    from flaxport.port.optim import _float, _hyper

    key, h = _hyper({"name": name.lower(), **hyper})
    args = ", ".join(f"{k}={v!r}" for k, v in hyper.items())
    lr, wd = _float(h["lr"]), _float(h["weight_decay"])
    lines, extra = [f"# torch.optim.{name}({args})"], []
    chain = []
    if wd and not h.get("decoupled_weight_decay"):
        lines.append("# torch's weight_decay here is L2: added to the gradient before anything else")
        chain.append(f"optax.add_decayed_weights({wd!r})")
    if key == "sgd":
        if _float(h["momentum"]):
            lines.append("# torch's momentum buffer starts at the first gradient: optax.trace")
            chain.append(f"optax.trace(decay={_float(h['momentum'])!r}, nesterov={bool(h['nesterov'])})")
    elif key == "rmsprop":
        lines.append("# torch: eps outside the square root, the mean square starts at 0, alpha is optax's decay")
        scale = "scale_by_stddev" if h["centered"] else "scale_by_rms"
        chain.append(f"optax.{scale}(decay={_float(h['alpha'])!r}, eps={_float(h['eps'])!r}, initial_scale=0.0, "
                     "eps_in_sqrt=False)")
        if _float(h["momentum"]):
            lines.append("# torch's momentum accumulates the unscaled step; the learning rate comes after it")
            chain.append(f"optax.trace(decay={_float(h['momentum'])!r}, nesterov=False)")
    elif key == "adagrad":
        lines.append("# torch: eps outside the square root, the sum starts at initial_accumulator_value")
        chain.append(f"scale_by_torch_adagrad(eps={_float(h['eps'])!r}, "
                     f"initial_accumulator_value={_float(h['initial_accumulator_value'])!r}, "
                     f"lr_decay={_float(h['lr_decay'])!r})")
        from flaxport.port import optim

        extra = [inspect.getsource(optim.ScaleByTorchAdagradState), inspect.getsource(optim.scale_by_torch_adagrad)]
    else:
        b1, b2 = (_float(b) for b in h["betas"])
        lines.append("# torch: eps outside the square root (eps_root=0)")
        chain.append(f"optax.scale_by_adam(b1={b1!r}, b2={b2!r}, eps={_float(h['eps'])!r}, eps_root=0.0)")
        if wd and h["decoupled_weight_decay"]:
            lines.append("# decoupled weight decay from the old parameters, scaled by the learning rate: "
                         "optax.adamw's chain")
            chain.append(f"optax.add_decayed_weights({wd!r})")
    chain.append(f"optax.scale_by_learning_rate({lr!r})")
    body = "\n".join(lines) + "\nreturn optax.chain(\n" + "".join(f"    {c},\n" for c in chain) + ")"
    return body, extra


# --------------------------------------------------------------------------- the file
_STEP = '''
def make_train_step(model, optimizer=None):
    """The model's jitted train step -> (train_step, state, write_back).

    train_step(state, {inputs}, targets) -> (state, loss): a train-mode forward, the loss,
    its gradients and one optimizer step. `state` is (params, rest, opt_state) with the
    arrays as flat lists, which jit passes fastest; `rest` holds BatchNorm statistics and
    the dropout rng. The step donates `state`: keep only the one it returns.
    write_back(state) puts the params and statistics into `model`.
    """
    optimizer = optimizer or make_optimizer()
    model.train()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    # copies: the step donates its state, and the model keeps its own arrays
    param_leaves, param_tree = jax.tree.flatten(jax.tree.map(lambda a: a.copy(), params))
    rest_leaves, rest_tree = jax.tree.flatten(jax.tree.map(lambda a: a.copy(), rest))

    def loss_of(param_leaves, rest_leaves, {inputs}, targets):
        model = nnx.merge(graphdef, jax.tree.unflatten(param_tree, param_leaves),
                          jax.tree.unflatten(rest_tree, rest_leaves))
        loss = loss_fn(model({inputs}){first}, targets)
        return loss, jax.tree.leaves(nnx.state(model, nnx.Not(nnx.Param)))

    @functools.partial(jax.jit, donate_argnums=0)
    def train_step(state, {inputs}, targets):
        params, rest, opt_state = state
        (loss, rest), grads = jax.value_and_grad(loss_of, has_aux=True)(params, rest, {inputs}, targets)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), rest, opt_state), loss

    def write_back(state):
        # copies: the next step donates the state's own arrays
        params, rest = jax.tree.map(lambda a: a.copy(), (state[0], state[1]))
        nnx.update(model, jax.tree.unflatten(param_tree, params), jax.tree.unflatten(rest_tree, rest))

    return train_step, (param_leaves, rest_leaves, optimizer.init(param_leaves)), write_back
'''


def train_step_source(t, loss_source: str, loss_name: str, optimizer_body: str, extra: list, header: str,
                      first_output: bool = False) -> str:
    """train_step.py's text: imports, the loss, make_optimizer, make_train_step.
    first_output: the model returns a tuple and the loss takes its first element."""
    from flaxport.translate import emit

    names = list(next(iter(t.plan.captures.values())).input_names) or ["x"]
    inputs = ", ".join(names)
    loss_code = emit._strip_runtime_imports(loss_source).strip()
    # the loss's own imports are re-collected below with everything else
    loss_code = "\n".join(line for line in loss_code.splitlines() if not line.startswith(("import ", "from ")))
    parts = [loss_code.strip(), f"loss_fn = {loss_name}"]
    parts += [e.strip() for e in extra]
    parts.append("def make_optimizer():\n" + "\n".join("    " + line for line in optimizer_body.splitlines()))
    step = _STEP.replace("{first}", "[0]" if first_output else "")  # a tuple: the loss of its first output
    parts.append(step.replace("{inputs}", inputs).strip())
    code = "\n\n\n".join(parts) + "\n"
    imports = [line for line in emit._imports(code) if line]
    third = [line for line in imports if not line.startswith(("import functools", "import json", "import math",
                                                               "import os"))]
    std = [line for line in imports if line not in third]
    if "NamedTuple" in code:
        std.append("from typing import NamedTuple")
    third.insert(next((i for i, line in enumerate(third) if line.startswith("from ")), len(third)), "import optax")
    text = f'"""{header}"""\n' + "\n".join(std) + "\n\n" + "\n".join(third) + "\n\n\n" + code
    return emit.format_source(text)


# --------------------------------------------------------------------------- the proof
@dataclasses.dataclass
class TrainStep:
    """The generated train step: `source` (train_step.py), `report` (check_step's StepReport),
    `rows` (the file's own step against torch in float64: (step, name, max_abs, ok))."""

    source: str
    report: object
    rows: list
    optimizer: str
    loss: str

    @property
    def ok(self) -> bool:
        return self.report.ok and all(ok for *_, ok in self.rows)

    def headline(self) -> str:
        worst = max((r[2] for r in self.rows), default=0.0)
        verdict = "OK" if self.ok else "FAILED"
        return (f"train step ({STEPS} steps, {self.optimizer}, {self.loss}): {verdict}; check_step "
                f"{'ok' if self.report.ok else 'FAILED'}, train_step.py in float64 within {worst:.2g} of torch")

    def markdown(self) -> str:
        lines = ["", "## Train step (train_step.py)", "", f"**{self.headline()}**", "",
                 f"train_step.py's own `train_step`, {STEPS} steps from the translated weights on the example batch, "
                 "against torch's optimizer and loss, both in float64 with dropout off (a row passes when "
                 "max|torch - jax| <= "
                 f"{ATOL:g} + {RTOL:g} x max|torch|):", "",
                 "| step | tensor | max abs (float64) | |", "|---|---|---|---|"]
        lines += [f"| {s} | `{n}` | {d:.2e} | {'ok' if ok else 'FAIL'} |" for s, n, d, ok in self.rows
                  if n == "loss" or not ok or s == STEPS]
        lines += ["", "(every parameter and BatchNorm statistic is compared after every step; the table shows the "
                  f"loss of each step, the tensors after step {STEPS} and any row that fails)", "",
                  f"check_step with train_step.py's loss ({self.report.dtype}; rows that fail are rechecked in "
                  "float64 on their own; its rows that pass are left out here):", "", "```"]
        text = str(self.report).splitlines()
        footer = next((i for i, line in enumerate(text) if line.startswith("loss: ")), len(text))
        lines += text[:2] + [line for line in text[2:footer] if "FAIL" in line] + text[footer:] + ["```"]
        return "\n".join(lines) + "\n"


def write_train_step(t, module, optimizer, loss, batch=None, check: bool = True) -> TrainStep:
    """Generate train_step.py for translation `t` of `module`, prove it, set `t.train_step`
    (so `t.save(directory)` writes it) and return it.

    optimizer: a torch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad; its hyperparameters are
    read, its state is not), or a text such as "torch.optim.AdamW(lr=3e-4)". loss: a torch
    loss function or module (cross_entropy, nll_loss, mse_loss, l1_loss, smooth_l1_loss,
    huber_loss, binary_cross_entropy_with_logits), or its text. batch: (inputs, targets) in
    torch's layout; by default the translation's example inputs and targets drawn for the loss.
    """
    import torch

    from flaxport.translate.function import translate_function

    name, kwargs = as_optimizer(optimizer)
    loss = as_loss(loss)
    inputs = tuple(t.call_arguments) if batch is None else tuple(batch[0]) if isinstance(batch[0], (tuple, list)) \
        else (batch[0],)
    with torch.no_grad():
        example_out = _copy(module).eval()(*inputs)
    if hasattr(example_out, "to_tuple"):  # a HuggingFace ModelOutput: the translation returns its tuple
        example_out = example_out.to_tuple()
    targets = loss.targets(example_out) if batch is None else batch[1]
    out0 = example_out[0] if isinstance(example_out, (tuple, list)) else example_out
    jax_loss = translate_function(getattr(torch.nn.functional, loss.name), out0, targets, check=False, **loss.kwargs)
    body, extra = optimizer_source(name, kwargs)
    opt_text = f"torch.optim.{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    loss_text = f"torch.nn.functional.{loss.name}" + (
        f"({', '.join(f'{k}={v!r}' for k, v in loss.kwargs.items())})" if loss.kwargs else "")
    header = (f"Train step of {t.root_class} (model.py), written by `flaxport translate`.\n\n"
              f"Optimizer: {opt_text}, as optax. Loss: {loss_text}, in JAX.\n\n"
              "    model = model_py.load(directory)\n"
              "    train_step, state, write_back = make_train_step(model)\n"
              "    for inputs, targets in batches:\n"
              "        state, loss = train_step(state, inputs, targets)\n"
              "    write_back(state)\n")
    tree = ast.parse(jax_loss.source).body
    defs = [n.name for n in tree if isinstance(n, ast.FunctionDef)]
    classes = [n for n in tree if isinstance(n, ast.ClassDef)]
    loss_name = defs[-1] if defs and not classes else None  # the function is written last
    if loss_name is None:
        raise UserError(f"--loss {loss.text!r}: its translation needs state; pass a plain loss function")
    first_output = isinstance(example_out, (tuple, list))
    source = train_step_source(t, jax_loss.source, loss_name, body, extra, header, first_output)
    step = TrainStep(source, None, [], opt_text, f"F.{loss.name}")
    if check:
        step.report, step.rows = _prove(t, module, name, kwargs, loss, source, inputs, targets, first_output)
    t.train_step = step
    return step


def _first(loss_fn, outputs, targets):
    return loss_fn(outputs[0], targets)


def _copy(module):
    import copy

    return copy.deepcopy(module)


def _namespace(source: str) -> dict:
    namespace = {"__name__": "train_step"}
    exec(compile(source, "<train_step.py>", "exec"), namespace)  # noqa: S102 - the text written above
    return namespace


def _prove(t, module, name, kwargs, loss, source, inputs, targets, first_output):
    import jax
    import torch

    from flaxport.port import check_step, draws
    from flaxport.port.parity import compare

    ns = _namespace(source)
    torch_loss, jax_loss = loss.torch_fn, ns["loss_fn"]
    if first_output:
        torch_loss = functools.partial(_first, torch_loss)
        jax_loss = functools.partial(_first, jax_loss)
    tm = _copy(module).train()
    report = check_step(tm, make_torch_optimizer(name, kwargs, tm.parameters()), torch_loss, t, (inputs, targets),
                        steps=STEPS, flax_loss_fn=jax_loss)
    from flaxport.port.dropout import DropoutLog, FlaxMasks, silence_recurrent_dropout, torch_dropout

    rows = []
    # dropout off on both sides (check_step above made the masks equal instead)
    with jax.enable_x64(True), torch_dropout("off", None, DropoutLog()), FlaxMasks([], "off", False).nnx():
        tm64 = _copy(module).double().train()
        silence_recurrent_dropout(tm64)
        opt = make_torch_optimizer(name, kwargs, tm64.parameters())
        xs64 = [x.double() if x.is_floating_point() else x for x in inputs]
        y64 = targets.double() if targets.is_floating_point() else targets
        model = t.new_model(dtype=np.float64)
        train_step, state, write_back = ns["make_train_step"](model)
        xs_j = [jax.numpy.asarray(x.numpy()) for x in xs64]
        y_j = jax.numpy.asarray(y64.numpy())
        for s in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            drawn = draws.Draws()
            with draws.torch_recording(drawn):
                out64 = tm64(*xs64)
            t_loss = torch_loss(out64, y64)
            t_loss.backward()
            opt.step()
            # a forward that draws (randn_like, ...) takes torch's draws: traced afresh each step
            with jax.disable_jit(bool(drawn.standard)), draws.jax_replay(drawn.standard):
                state, j_loss = train_step(state, *xs_j, y_j)
            d, _, ok = compare(t_loss.detach().numpy(), np.asarray(j_loss), ATOL, RTOL)[:3]
            rows.append((s, "loss", d, ok))
            write_back(state)
            got = t.state_dict(nnx_state(model))
            for n, p in tm64.state_dict().items():  # parameters and BatchNorm statistics
                if n not in got:
                    continue
                d, _, ok = compare(p.detach().numpy(), got[n], ATOL, RTOL)[:3]
                rows.append((s, n, d if math.isfinite(d) else math.inf, ok))
    return report, rows


def nnx_state(model):
    from flax import nnx

    return nnx.state(model)
