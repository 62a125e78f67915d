"""flaxport translate FACTORY --input SHAPE[:DTYPE] ... --out DIR: a torch model as Flax NNX source.

FACTORY is `path/to/file.py:name` or `package.module:name`; `name` is a function (or class)
that returns the torch.nn.Module, called with no arguments. Importing the file runs it: it
is the user's own code, which is the point of the command. Weights (--weights) are read
without running anything: .safetensors, or a torch file through torch.load(weights_only=True)
(a state_dict, or a dict holding one under "state_dict" or "model").

--input gives one example input per positional argument of forward, in torch's layout:
`2,3,32,32` (float32 from N(0, 1)), `2,7:int64` (token ids drawn below the smallest
nn.Embedding's size, else below 2), also float64, int32, bool; `(1,2,16;1,2,16)` a tuple of
inputs (an LSTM's (h, c)), `{h=1,2,16;c=1,2,16}` a dict, nested as forward takes them;
`NAME=...` before any of them a keyword argument (`--input attention_mask=2,7:bool`).

Writes DIR/model.py (imports only jax, flax, numpy and the standard library, and
flaxport's CPU convolution kernels where flaxport is installed, unless --conv xla; `load(DIR)`),
DIR/weights.safetensors (torch's state_dict names) and DIR/parity.md, and prints a summary.
With --optimizer and --loss (texts read with `ast`, never run: a torch.optim class and a
torch.nn loss, literal keyword arguments) it also writes DIR/train_step.py, the jitted train
step with the optimizer as optax (and --scheduler, --clip-grad-norm/--clip-grad-value,
--accumulate, --precision bf16 as the torch loop has them), and DIR/train.py, a training
program for it (the user's loader, a mesh of devices, checkpoints, continuing a torch run);
the step is proven against torch for --proof-steps steps (docs/translate.md).
Then the written files are run as a user runs them: model.py's own load(), jitted, in eval mode
against torch's float32 outputs and once in train mode (translate/written.py).
Exit 0 when the float64 check and the files pass, 1 when one does not (the files are written,
and the first submodule that differs is named), 2 for bad input (an unknown factory, a bad --input,
weights that do not fit, ops with no translation: one line each).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from flaxport.cli import common
from flaxport.cli.inputs import check_input_memory, make_inputs, parse_input
from flaxport.errors import UserError, first_line

def add_parser(sub):
    p = sub.add_parser("translate", help="translate a torch.nn.Module into Flax NNX source, weights and proof")
    p.add_argument("factory", metavar="FACTORY", help="file.py:name or package.module:name returning the nn.Module")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]", required=False,
                   help="an example input per positional forward argument, e.g. 2,3,32,32 or 2,7:int64; a tuple "
                        "'(1,2,16;1,2,16)', a dict '{h=1,2,16;c=1,2,16}'; NAME=... for a keyword argument")
    p.add_argument("--out", required=False, metavar="DIR", help="where to write model.py, weights.safetensors, parity.md")
    p.add_argument("--weights", default=None, metavar="FILE", help="load these torch weights first (.pt, .safetensors)")
    p.add_argument("--layout", default="nchw", choices=("nchw", "nhwc"),
                   help="nchw: torch's layout (default); nhwc: image models keep channels last inside")
    p.add_argument("--conv", default="native", choices=("native", "xla"),
                   help="native (default): model.py runs its convolutions on flaxport's CPU kernels where flaxport "
                        "is installed, XLA's elsewhere; xla: XLA's convolutions only (docs/translate.md)")
    p.add_argument("--train", action="store_true", help="the model starts in train mode (torch's module.train())")
    p.add_argument("--optimizer", default=None, metavar="TEXT",
                   help='also write train_step.py (with this torch optimizer as optax) and train.py, e.g. '
                        '"torch.optim.AdamW(lr=1e-3, weight_decay=0.01)" (any torch.optim class but LBFGS and '
                        'SparseAdam; literal keyword arguments; needs --loss)')
    p.add_argument("--loss", default=None, metavar="TEXT",
                   help='the loss of train_step.py, a torch.nn loss function or module, e.g. '
                        '"torch.nn.functional.cross_entropy" or "nn.MSELoss(reduction=\'sum\')"')
    p.add_argument("--scheduler", default=None, metavar="TEXT",
                   help='the LR scheduler of train_step.py, e.g. "torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, '
                        'total_steps=1000)" (literal keyword arguments; the optimizer is --optimizer\'s)')
    p.add_argument("--scheduler-every", type=int, default=1, metavar="N",
                   help="optimizer steps per scheduler.step(): 1 (default) where torch steps it every batch, the "
                        "batches of an epoch where it steps once an epoch")
    p.add_argument("--clip-grad-norm", type=float, default=None, metavar="MAX",
                   help="clip the gradients' total norm to MAX before each step (torch.nn.utils.clip_grad_norm_)")
    p.add_argument("--clip-norm-type", type=float, default=2.0, metavar="P",
                   help="the norm --clip-grad-norm measures: 2 (default) or inf")
    p.add_argument("--clip-grad-value", type=float, default=None, metavar="V",
                   help="clamp each gradient to [-V, V] before each step (torch.nn.utils.clip_grad_value_)")
    p.add_argument("--accumulate", type=int, default=1, metavar="N",
                   help="micro-batches per optimizer step: loss / N, backward N times, then one step (the --input "
                        "batch must split into N)")
    p.add_argument("--precision", default="float32", choices=("float32", "bf16"),
                   help="bf16: train_step.py also runs the forward under torch.autocast's bfloat16 policy "
                        "(make_train_step(..., precision='bf16')), checked against torch under autocast")
    p.add_argument("--proof-steps", type=int, default=5, metavar="N",
                   help="train steps the proof of train_step.py takes in both frameworks (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the example inputs")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    if not args.input:
        raise UserError("translate needs --input SHAPE[:DTYPE] for each positional input of forward")
    if not args.out:
        raise UserError("translate needs --out DIR")
    parsed = [parse_input(text) for text in args.input]  # before anything slow runs
    names = [name for name, _ in parsed if name is not None]
    if len(set(names)) < len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise UserError(f"--input {twice}=...: given twice")
    common.check_seed(args.seed)
    optimizer = loss = None
    if (args.optimizer is None) != (args.loss is None):
        raise UserError("train_step.py needs both --optimizer and --loss")
    training = {}
    if args.optimizer is None and (args.scheduler or args.clip_grad_norm or args.clip_grad_value or
                                   args.accumulate != 1):
        raise UserError("--scheduler, --clip-grad-norm, --clip-grad-value and --accumulate are train_step.py's: "
                        "they need --optimizer and --loss")
    if args.optimizer is not None:
        from flaxport.translate.train_step import parse_loss, parse_optimizer
        from flaxport.translate.training.loop import Training
        from flaxport.translate.training.optimizer import OptimizerSpec
        from flaxport.translate.training.schedule import parse_scheduler

        optimizer, loss = parse_optimizer(args.optimizer), parse_loss(args.loss)
        if args.proof_steps < 1:
            raise UserError(f"--proof-steps {args.proof_steps}: at least 1")
        training = dict(scheduler=parse_scheduler(args.scheduler, optimizer) if args.scheduler else None,
                        scheduler_every=args.scheduler_every, clip_grad_norm=args.clip_grad_norm,
                        norm_type=args.clip_norm_type, clip_grad_value=args.clip_grad_value,
                        accumulate=args.accumulate)
        Training(OptimizerSpec(*optimizer[:1], [optimizer[1]]), loss, **training)  # the flags' one-line checks
    from flaxport import fileset
    from flaxport.translate.save import FILES

    out = fileset.check(args.out, FILES, "--out")  # an unusable or foreign folder: refused before any work
    check_input_memory(args.input, parsed)
    module = load_factory(args.factory)
    if args.weights:
        load_weights(module, args.weights)
    module.train(args.train)
    inputs, keywords = make_inputs(parsed, module, args.seed)
    from flaxport.translate import translate
    from flaxport.translate.preflight import ForwardError

    try:
        t = translate(module, *inputs, layout=args.layout, conv=args.conv, example_kwargs=keywords)
    except ForwardError as e:
        raise UserError(f"--input {' --input '.join(args.input)}: {e}") from e
    if optimizer is not None:
        from flaxport.translate.train_step import write_train_step

        write_train_step(t, module, optimizer, loss, steps=args.proof_steps, precision=args.precision, **training)
    t.save(out)
    print(t.summary())
    if t.train_step is not None:
        print(t.train_step.headline())
    written = ["model.py", "weights.safetensors"] + (list(t.train_step.files) if t.train_step is not None else [])
    print(f"wrote {', '.join(str(out / n) for n in written + ['parity.md'])}")
    if t.train_step is not None and not t.train_step.ok:
        print(f"flaxport: the train step differs from torch's; see {out / 'parity.md'}", file=sys.stderr)
        return 1
    if not t.report.ok:
        first = t.report.first_divergence
        why = (f"at {first.torch_name!r}: {first.note}" if "NaN/inf" in first.note else
               f"the translation of {first.torch_name!r} computes something else (max |diff| {first.max_abs:.3g})")
        print(f"flaxport: parity failed: {why}; see {out / 'parity.md'}", file=sys.stderr)
        return 1
    from flaxport.translate.written import check_written

    written_check = check_written(t, module, out)  # the files as the user will run them
    if written_check.problem:
        print(f"flaxport: the written files do not run as proved: {written_check.problem} ({out / 'model.py'})",
              file=sys.stderr)
        return 1
    if written_check.note:
        print(f"note: {written_check.note}")
    stepped = "; train_step.py took a step, loss finite" if getattr(t, "train_step", None) is not None else ""
    print(f"ran {out / 'model.py'} with its load(): eval mode within {written_check.float32:.2g} of torch "
          f"(float32), train mode finite{stepped}")
    return 0


def load_factory(spec: str):
    """The nn.Module a FACTORY spec names (file.py:name or module:name)."""
    import torch

    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise UserError(f"FACTORY {spec!r}: write it as file.py:name or package.module:name")
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UserError(f"FACTORY {spec!r}: no such file {target}")
        sys.path.insert(0, str(path.resolve().parent))  # the user's sibling imports
        mod_name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else f"user_{path.stem}"
        try:
            loader = importlib.util.spec_from_file_location(mod_name, path)
            mod = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = mod
            loader.loader.exec_module(mod)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's file: one line, not a traceback
            raise UserError(f"FACTORY {spec!r}: importing {target} failed: {_what(e)}") from e
    else:
        try:
            mod = importlib.import_module(target)
        except (Exception, SystemExit) as e:  # noqa: BLE001
            raise UserError(f"FACTORY {spec!r}: cannot import {target}: {_what(e)}") from e
    if not hasattr(mod, name):
        raise UserError(f"FACTORY {spec!r}: {target} has no {name!r}")
    obj = getattr(mod, name)
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise UserError(f"FACTORY {spec!r}: {name} is neither a function nor an nn.Module")
    try:
        module = obj()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        raise UserError(f"FACTORY {spec!r}: calling {name}() failed: {_what(e)}") from e
    if not isinstance(module, torch.nn.Module):
        raise UserError(f"FACTORY {spec!r}: {name}() returned a {type(module).__name__}, not a torch.nn.Module")
    return module


def load_weights(module, path) -> None:
    """Load a checkpoint into module without unpickling code (safetensors or weights_only)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--weights {path}: no such file")
    if path.suffix == ".safetensors":
        from flaxport.runtime.loader import read_safetensors

        try:
            arrays, _ = read_safetensors(path)
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"--weights {path}: not a readable safetensors file ({first_line(e)})") from e
        state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - refusing a pickle with code is the point
            raise UserError(f"--weights {path}: cannot read it as plain tensors (torch.load weights_only): "
                            f"{first_line(e)}") from e
        if isinstance(state, dict) and not all(torch.is_tensor(v) for v in state.values()):
            state = state.get("state_dict") or state.get("model") or state
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserError(f"--weights {path}: holds no state_dict (a dict of tensor names to tensors)")
    result_missing, result_unexpected = _diff_keys(module.state_dict(), state)
    if result_missing or result_unexpected:
        raise UserError(f"--weights {path} does not fit {type(module).__name__}: "
                        f"{len(result_missing)} missing ({', '.join(result_missing[:3])}), "
                        f"{len(result_unexpected)} unexpected ({', '.join(result_unexpected[:3])})")
    own = module.state_dict()
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        k = bad[0]
        raise UserError(f"--weights {path} does not fit {type(module).__name__}: {len(bad)} shape(s) differ, "
                        f"e.g. {k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}")
    module.load_state_dict(state)


def _diff_keys(own, given):
    return [k for k in own if k not in given], [k for k in given if k not in own]


def _what(e: BaseException) -> str:
    """'RuntimeError: needs a GPU', or what a sys.exit() in the user's code said."""
    if isinstance(e, SystemExit):
        return f"it called sys.exit({e.code!r}) (translate needs the module returned, not the process ended)"
    return f"{type(e).__name__}: {first_line(e)}"
