"""`translate(torch_module, *example_inputs, **example_kwargs) -> Translation`."""
from __future__ import annotations

import linecache
import types
from pathlib import Path

import numpy as np

from flaxport.translate.layout import columns_torch
from flaxport.runtime.functions import columns_channels_last
from flaxport.translate.errors import TranslateError, UnsupportedOpsError


def translate(module, *example_args, layout: str = "nchw", conv: str = "native", check: bool = True,
              example_kwargs=None, **kwargs) -> "Translation":
    """Translate a torch.nn.Module into Flax NNX source, with its weights and the proof.

    module: any torch.nn.Module; it is left as it was (every capture and check runs on
      copies), and `t.model` starts in its train/eval mode with its weights.
    example_args / kwargs: example inputs in torch's layout (tensors; int64 for token ids).
      Sizes export can keep symbolic (batch, sequence length, image side) are read from
      `x.shape` in the generated code, so other sizes work too. Non-tensor arguments are
      fixed at their example values. `layout`, `conv` and `check` are taken as options; pass a
      forward argument with one of those names through `example_kwargs={...}`.
    layout: "nchw" keeps torch's layout throughout; "nhwc" keeps image values channels-last
      inside (convolutions, normalisation, pooling, resampling, elementwise ops), with
      transposes where another op reads them; inputs and outputs stay in torch's layout.
    conv: "native" (the default): the file runs its 1-D and 2-D convolutions on flaxport's
      CPU kernels (float32, on a CPU; docs/cpu.md) where flaxport is installed, and XLA's
      convolution elsewhere; "xla": XLA's convolutions only (the file imports only jax,
      flax, numpy and the standard library).
    check: run the proof (float64 per submodule boundary, float32 beside) into `t.report`.

    Both train and eval mode are captured (Python branches on `self.training` included),
    so the generated model's NNX `train()` / `eval()` both work; train-mode BatchNorm
    updates running statistics and num_batches_tracked as torch does, and dropout draws
    from the model's `dropout` rng stream.

    Raises ForwardError (torch's own forward fails on the example inputs, naming where),
    UnsupportedOpsError (one line per op with no translation), ExportError (the forward
    could not be captured), TranslateError; all are flaxport UserErrors.
    """
    import torch

    if layout not in ("nchw", "nhwc"):
        raise TranslateError(f"layout {layout!r}: choose 'nchw' (torch's layout) or 'nhwc'")
    if conv not in ("xla", "native"):
        raise TranslateError(f"conv {conv!r}: choose 'native' (flaxport's CPU kernels where installed) or 'xla' "
                             "(XLA's convolution)")
    kwargs = {**(example_kwargs or {}), **kwargs}
    args = tuple(example_args)
    if not isinstance(module, torch.nn.Module):
        raise TranslateError(f"translate needs a torch.nn.Module, got {type(module).__name__}")
    _refuse_parametrizations(module)
    from flaxport.translate.preflight import check_forward

    check_forward(module, args, kwargs)  # inputs the model cannot take: named where torch refuses them
    from flaxport.translate.capture import capture
    from flaxport.translate.classes import build_classes
    from flaxport.translate.emit import calls_native_conv, module_source
    from flaxport.translate.plan import Plan

    try:
        # static shapes: it supplies torch's float64 values and which casts follow the dtype
        f64 = capture(module, args, kwargs, train=False, dtype=torch.float64, dynamic=False)
    except TranslateError:
        f64 = None
    primary = "train" if module.training else "eval"
    captures, notes = {}, []
    axes = "all"
    for mode in (primary, "eval" if primary == "train" else "train"):
        try:
            # the other mode asks no more symbolic sizes than the first got (capture.export_program)
            captures[mode] = capture(module, args, kwargs, train=mode == "train", dynamic=axes, reference=f64)
            axes = captures[mode].dynamic or False
        except TranslateError as e:
            if mode == primary:
                raise
            notes.append(f"{mode} mode could not be captured ({e}); the model is translated in {primary} mode only")
    captures = dict(sorted(captures.items(), key=lambda kv: kv[0] != "eval"))
    classes = build_classes(Plan(module, captures, f64, layout=layout, example=(args, kwargs)))
    if classes.modes_differ and len(captures) > 1:
        # a module the forward hands other arrays in the other mode (HF RWKV's blocks get the weights its
        # forward rescales in place when the mode changes): one __call__ cannot take both
        other = next(mode for mode in captures if mode != primary)
        paths = ", ".join(classes.modes_differ[:3]) + (" ..." if len(classes.modes_differ) > 3 else "")
        notes.append(f"{other} mode could not be translated ({paths} given other arrays in {other} mode than in "
                     f"{primary} mode); the model is translated in {primary} mode only")
        captures = {primary: captures[primary]}
        classes = build_classes(Plan(module, captures, f64, layout=layout, example=(args, kwargs)))
    plan = classes.plan
    if classes.problems:
        raise UnsupportedOpsError(list(classes.problems))
    source = module_source(plan, classes, _header(module, captures, plan.flat_weights, conv), conv)
    if calls_native_conv(source):
        notes.append(_native_note())
    else:  # no convolution: the header says nothing of kernels
        source = source.replace(_NATIVE_HEADER, "", 1)
    t = Translation(source, module, plan, classes, primary, args, kwargs, notes)
    if f64 is not None:
        f64.release_weights()
    if check:
        from flaxport.translate.proof import prove

        t.report = prove(t, module)
    return t


def _refuse_parametrizations(module) -> None:
    """torch.nn.utils.parametrize other than weight_norm (spectral_norm, orthogonal, your own): one
    line saying how to fold them. weight_norm translates (its ParametrizationList becomes a class)."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.parametrizations import _WeightNorm

    found = [f"{path or 'the top module'}.{attr}" for path, m in module.named_modules()
             if parametrize.is_parametrized(m) for attr, chain in m.parametrizations.items()
             if not all(isinstance(p, _WeightNorm) for p in chain)]
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise TranslateError(f"{shown}: parametrized (spectral_norm, orthogonal, ...), which has no translation "
                             "(weight_norm has); fold it into a plain weight first with "
                             "torch.nn.utils.parametrize.remove_parametrizations(submodule, name)")


def _native_note() -> str:
    from flaxport import kernels

    if not kernels.available():
        return f"conv native: flaxport's CPU kernels are unavailable here ({kernels.unavailable_reason()}); " \
               "every convolution ran on XLA's"
    return ("conv native: the float32 figures ran the convolutions flaxport's CPU kernels can run on them; "
            "the kernels are float32 only, so the float64 figures check XLA's convolution, which the file runs "
            "where the kernels cannot")


def _header(module, captures, flat_weights, conv) -> str:
    cls = type(module)
    held = (
        "Parameters keep torch's names, shapes and layouts, so\n"
        if not flat_weights
        else "Parameters keep torch's names, shapes and layouts (but for the Linear weights in\n"
        "CHANNELS_LAST_COLUMNS, whose columns load() puts in (h, w, c) order), so\n"
    )
    c = next(iter(captures.values()))
    shapes = "".join(f"    {_input_shape(n, p.meta['val'])}\n" for n, p in zip(c.input_access, c.user_inputs))
    return (f"{cls.__qualname__} ({cls.__module__}) in Flax NNX, written by `flaxport translate`.\n\n"
            f"Inputs, in torch's layout (the example's shape):\n{shapes}\n"
            f"{held}"
            "weights.safetensors is torch's state_dict. `load(directory)` returns the model with them;\n"
            "`model.train()` / `model.eval()` switch BatchNorm and dropout as in torch.\n"
            + (_NATIVE_HEADER if conv == "native" else ""))


_NATIVE_HEADER = ("\nConvolutions run on flaxport's native CPU kernels where flaxport is installed and the\n"
                  "kernels can run them (`_convolution`), on XLA's convolution elsewhere.\n")


def _input_shape(name: str, value) -> str:
    """'x (2, 3, 32, 32), any size along axes 0, 2 and 3': the example's shape, and the axes export
    left free (a symbolic size)."""
    sizes, free = [], []
    for axis, size in enumerate(value.shape):
        if str(size).isdigit():
            sizes.append(str(int(size)))
        else:
            free.append(str(axis))
            hint = getattr(getattr(size, "node", None), "hint", None)
            sizes.append(str(hint) if hint is not None else str(size))
    text = f"{name} ({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"
    if free:
        axes = free[0] if len(free) == 1 else ", ".join(free[:-1]) + " and " + free[-1]
        text += f", any size along axis {axes}" if len(free) == 1 else f", any size along axes {axes}"
    return text


class Translation:
    """A translated model: `source` (model.py's text), `model` (the nnx.Module with the torch
    weights, in the torch module's mode), `report` (the proof, a ParityReport), and the way
    back to torch: `state_dict()`.

    Names: `names` maps each torch name (state_dict keys, plus the buffers and constants the
    forward reads that state_dict leaves out) to the NNX variable path it fills.
    """

    def __init__(self, source, module, plan, classes, mode, args, kwargs, notes):
        self.source = source
        self.plan = plan
        self.classes = classes  # classes.Classes: what the file's classes were made from
        self.mode = mode
        self.notes = list(notes)
        self.report = None
        self.train_step = None  # a train_step.TrainStep once write_train_step ran: save() writes train_step.py
        self.example_args, self.example_kwargs = args, kwargs
        from flaxport.translate.capture import signature_arguments

        # the example's forward arguments that hold tensors, in the generated __call__'s order
        self.call_arguments = [v for name, v in signature_arguments(module, args, kwargs)
                               if name in set(next(iter(plan.captures.values())).input_names) or _has_tensor(v)]
        self.torch_class = type(module)
        self.namespace = _load_namespace(source, type(module).__name__)
        self.root_class = classes.classes[-1].name
        self._state_keys = list(module.state_dict().keys())
        # the floating tensors copied once, into immutable JAX arrays that every model new_model makes in
        # their dtype holds (one copy of the weights, not one a model); the rest as NumPy
        self._torch_state = {k: _jax(v) if str(v.dtype) in _JAX_DTYPES else _np(v)
                             for k, v in module.state_dict().items()}
        extra = {}
        for name, b in module.named_buffers():
            if name not in self._torch_state and b is not None:
                extra[name] = _np(b)
        capture = next(iter(plan.captures.values()))
        for name, value in plan.constants(capture).items():
            if hasattr(value, "numel"):
                extra[name] = _np(value)
        self._extra = extra
        self._extra64 = {}
        if plan.f64 is not None:
            for name, value in plan.constants(plan.f64).items():
                if hasattr(value, "numel"):
                    self._extra64[name] = _np(value)
        self.names = {}
        for name in list(self._torch_state) + list(extra):
            owner, _, attr = name.rpartition(".")
            if plan.held(owner):
                self.names[name] = plan.nnx_path(owner) + (plan.attr_name(attr),)
        self._one_path_per_shared_tensor()
        self.model = self.new_model()
        self.unused = [k for k in self._state_keys if k not in self.names]

    def _one_path_per_shared_tensor(self):
        """A tensor torch shares (plan.ties) is one variable in the model, under one of its
        names' paths: every name of it is read and written there."""
        from flax import nnx

        if not self.plan.ties():
            return
        model = abstract_model(self.namespace[self.root_class])
        held = {tuple(p) for p, _ in nnx.to_flat_state(nnx.state(model))}
        for name, path in list(self.names.items()):
            if path not in held:
                home = next((self.names[n] for n in self.plan.aliases.get(name, []) if self.names.get(n) in held), None)
                if home is not None:
                    self.names[name] = home

    # ------------------------------------------------------------------ models
    def new_model(self, dtype=None, seed: int = 0):
        """A fresh nnx.Module holding the torch module's weights (as translated), in its mode.

        dtype: cast floating variables (e.g. jnp.float64 inside `jax.enable_x64(True)`,
        which then also takes the float64 values of tensor constants)."""
        import jax.numpy as jnp

        model = abstract_model(self.namespace[self.root_class], seed)
        values = {**self._torch_state, **self._extra}
        if dtype is not None and jnp.dtype(dtype) == jnp.float64:
            values.update(self._extra64)
        self._set(model, values, dtype)
        model.train() if self.mode == "train" else model.eval()
        return model

    def _set(self, model, values: dict, dtype=None, strict: bool = True):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        variables = dict(nnx.to_flat_state(nnx.state(model)))
        missing = []
        for name, array in values.items():
            path = self.names.get(name)
            if path is None:
                continue
            var = variables.get(path)
            if var is None:
                missing.append(name)
                continue
            if isinstance(array, jax.Array) and dtype is None and name not in self.plan.flat_weights:
                var.set_value(array)  # immutable: the models made here share it
                continue
            a = np.asarray(array)
            if dtype is not None and np.issubdtype(a.dtype, np.floating):
                a = a.astype(dtype)
            if name in self.plan.flat_weights:
                a = columns_channels_last(a, self.plan.flat_weights[name])
            var.set_value(jnp.asarray(a))
        unset = [p for p, v in variables.items() if isinstance(v.get_value(), jax.ShapeDtypeStruct)]
        if unset and strict:
            raise TranslateError(f"no torch value for the variables {', '.join('/'.join(map(str, p)) for p in unset[:5])}")
        if missing and strict:
            raise TranslateError(f"the translated model has no variable for {', '.join(missing[:5])}")

    # ------------------------------------------------------------------ torch names
    def state_dict(self, tree=None) -> dict:
        """{torch state_dict name: NumPy array} of the model's variables (or of `tree`, an
        nnx.State shaped like (part of) the model's state, e.g. gradients or optimizer
        moments: only the names it holds). Shapes and layouts are torch's; the counters
        (num_batches_tracked) come back as int64."""
        from flax import nnx

        state = nnx.state(self.model) if tree is None else tree
        flat = {}
        for path, v in nnx.to_flat_state(state) if isinstance(state, nnx.State) else _flat_dict(state):
            flat[tuple(path)] = v
        out = {}
        for name in self._state_keys:
            path = self.names.get(name)
            if path is None or path not in flat:
                continue
            v = flat[path]
            a = np.asarray(v.get_value() if hasattr(v, "get_value") else v)
            ref = self._torch_state[name]
            if np.issubdtype(ref.dtype, np.integer):
                a = a.astype(ref.dtype)
            if name in self.plan.flat_weights:
                a = columns_torch(a, self.plan.flat_weights[name])
            out[name] = a
        return out

    def load_state_dict(self, state_dict, strict: bool = True) -> None:
        """Set the model's variables from torch names (NumPy arrays or tensors), in place.

        strict: every state_dict key of the torch module must be given and known."""
        values = {k: _np(v) for k, v in state_dict.items()}
        unknown = [k for k in values if k not in self.names]
        if unknown and strict:
            raise TranslateError(f"load_state_dict: no variable for {', '.join(unknown[:5])}")
        missing = [k for k in self._state_keys if k in self.names and k not in values]
        if missing and strict:
            raise TranslateError(f"load_state_dict: missing {', '.join(missing[:5])}")
        self._set(self.model, {k: v for k, v in values.items() if k in self.names})

    # ------------------------------------------------------------------ files
    def save(self, directory) -> Path:
        """Write model.py, weights.safetensors and parity.md (and train_step.py, when
        write_train_step made one) as `directory`, as one set (flaxport.fileset): it then
        holds these files and no others, or, after any failure, what it held before."""
        from flaxport import fileset
        from flaxport.translate.save import FILES

        return fileset.write(directory, self._write_files, FILES, what="--out")

    def _write_files(self, directory: Path) -> None:
        import json

        from flaxport.translate.save import write_safetensors, write_text

        current = self.state_dict()
        arrays = {}
        for name in self.names:
            if name in current:
                arrays[name] = current[name]
            elif name in self._extra:
                arrays[name] = self._extra[name]
        paths = {name: "/".join(str(p) for p in self.names[name]) for name in arrays}
        write_text(directory / "model.py", self.source)
        write_safetensors(directory / "weights.safetensors", arrays,
                          {"nnx_paths": json.dumps(paths), "mode": self.mode,
                           "torch_class": f"{self.torch_class.__module__}.{self.torch_class.__qualname__}"})
        if self.train_step is not None:
            for name, text in self.train_step.files.items():  # train_step.py, train.py
                write_text(directory / name, text)
        write_text(directory / "parity.md", self.parity_markdown())

    def parity_markdown(self) -> str:
        from flaxport.translate.proof import markdown

        text = markdown(self)
        return text + self.train_step.markdown() if self.train_step is not None and self.train_step.report else text

    # ------------------------------------------------------------------ summary
    @property
    def parameter_count(self) -> int:
        import torch  # noqa: F401 - the names come from the torch module

        return int(sum(self._torch_state[k].size for k in self.names if k in self._torch_state
                       and not k.endswith(("running_mean", "running_var", "num_batches_tracked"))))

    @property
    def class_names(self) -> list:
        return [c.name for c in self.classes.classes]

    def summary(self) -> str:
        lines = [f"translated {self.torch_class.__name__}: {len(self.class_names)} classes "
                 f"({', '.join(self.class_names)}), {self.parameter_count:,} parameters, "
                 f"{len(self.source.splitlines())} lines"]
        if self.report is not None:
            lines.append(self.report.headline())
        lines += [f"note: {n}" for n in self.notes]
        if self.unused:
            lines.append(f"note: not used by forward, left out: {', '.join(self.unused[:6])}"
                         + (" ..." if len(self.unused) > 6 else ""))
        return "\n".join(lines)


def _has_tensor(value) -> bool:
    import torch
    from torch.utils import _pytree

    return any(torch.is_tensor(leaf) for leaf in _pytree.tree_leaves(value))


def abstract_model(cls, seed: int = 0):
    """cls(rngs=...) built without computing any initial value (nnx.eval_shape), with real rng
    streams: every other variable is set from the torch weights right after."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    model = nnx.eval_shape(lambda: cls(rngs=nnx.Rngs(params=0, dropout=seed, noise=seed)))
    keys = [v for _, v in nnx.to_flat_state(nnx.state(model, nnx.RngKey))]
    for i, var in enumerate(keys):
        var.set_value(jax.random.fold_in(jax.random.key(seed), i))
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.RngCount)):
        var.set_value(jnp.zeros((), jnp.uint32))
    return model


# the tensor dtypes JAX holds as they are without float64 switched on
_JAX_DTYPES = ("torch.float32", "torch.bfloat16", "torch.float16")


def _jax(v):
    """A floating tensor's values as a JAX array of its dtype (one copy)."""
    import jax.numpy as jnp

    v = v.detach().cpu()
    return jnp.asarray(_np(v) if str(v.dtype) == "torch.bfloat16" else v.numpy())


def _np(v) -> np.ndarray:
    """A tensor's values as NumPy, in its dtype (bfloat16 as JAX's, which NumPy lacks)."""
    if hasattr(v, "detach"):
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":
            import jax.numpy as jnp

            return v.float().numpy().astype(jnp.bfloat16)
        return v.numpy().copy()
    return np.asarray(v)


def _flat_dict(tree, prefix=()):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from _flat_dict(v, prefix + (k,))
        else:
            yield prefix + (k,), v


_COUNTER = [0]


def _load_namespace(source: str, name: str) -> dict:
    """Execute the generated source as a module (its lines registered for tracebacks)."""
    _COUNTER[0] += 1
    filename = f"<flaxport translate {name} #{_COUNTER[0]}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType(f"flaxport_translated_{_COUNTER[0]}")
    module.__file__ = filename
    exec(compile(source, filename, "exec"), module.__dict__)  # noqa: S102 - our own generated code
    return module.__dict__


