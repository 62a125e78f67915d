"""`translate_function(fn, *example_args, **example_kwargs)`: a torch function (a loss such as
F.cross_entropy, or any tensor code) as a JAX function, checked like a model.

The function is wrapped in a module whose forward takes the tensor arguments by their
names in fn's signature (so sizes stay symbolic, as for a model) and passes the other
keyword arguments as fixed values; that module is translated. The result is called with
JAX arrays in the same positions, works under jax.jit and jax.grad, and carries `source`
(the generated function) and `report` (the float64 proof on the example arguments).
"""
from __future__ import annotations

import inspect


class TranslatedFunction:
    """fn translated: call it with JAX arrays; `.source`, `.report`, `.translation`."""

    def __init__(self, name, translation, source):
        self.__name__ = name
        self.translation = translation
        self.report = translation.report
        self.source = source
        self._model = translation.model

    def __call__(self, *args):
        return self._model(*args)

    def __repr__(self):
        return f"<translated {self.__name__}: {self.report.headline() if self.report else 'not checked'}>"


def translate_function(fn, *example_args, check: bool = True, **example_kwargs) -> TranslatedFunction:
    """A JAX version of the torch function `fn`, from example arguments (tensors in torch's
    layout; non-tensor keyword arguments such as reduction='sum' are fixed at their values).

    Returns a TranslatedFunction: f(*jax_arrays) -> JAX arrays, in the structure fn returns.
    Example: `loss = translate_function(F.cross_entropy, logits, targets)`; then
    `loss(jnp_logits, jnp_targets)` inside a jitted train step.
    """
    import torch

    from flaxport.translate.translation import translate

    tensors = {k: v for k, v in example_kwargs.items() if torch.is_tensor(v)}
    fixed = {k: v for k, v in example_kwargs.items() if not torch.is_tensor(v)}
    names = _parameter_names(fn, len(example_args))
    name = getattr(fn, "__name__", "function")
    name = name if name.isidentifier() else "function"  # a lambda
    module = _wrapper(fn, names, list(tensors), fixed, name)
    t = translate(module, *example_args, check=check, example_kwargs=tensors)
    return TranslatedFunction(name, t, _function_source(t, name) or t.source)


def _function_source(t, name) -> str | None:
    """The translation as a plain function (when the wrapper holds no state): runtime helpers,
    then `def name(...)`; None when it needs a class."""
    from flaxport import runtime
    from flaxport.translate import emit

    classes = t.classes.classes
    if len(classes) != 1 or classes[0].instances[0].init:
        return None
    inst = classes[0].instances[0]
    body = [emit._fill(line, classes[0], "call", li) for li, line in enumerate(inst.call)]
    if any("self" in line for line in body):
        return None
    fname = name if name.isidentifier() and name not in runtime.names() else f"{name}_jax"
    code = [f"def {fname}({', '.join(inst.params)}):",
            f'    """{t.torch_class.__module__}.{name} in JAX (written by flaxport translate)."""']
    code += ["    " + line for line in body]
    runtime = emit.runtime_code(emit.runtime_needed(set(t.classes.helpers)))
    text = "\n\n\n".join(p for p in [runtime, "\n".join(code)] if p)
    return emit.format_source("\n".join(emit._imports(text)) + "\n\n\n" + emit._strip_runtime_imports(text) + "\n")


def _parameter_names(fn, count) -> list:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:count]]
    names += [f"x{i}" for i in range(len(names), count)]
    return [n if n.isidentifier() and n != "self" else f"x{i}" for i, n in enumerate(names)]


def _wrapper(fn, names, tensor_kwargs, fixed, name):
    """An nn.Module whose forward(self, <names>, <tensor kwargs>) calls fn(...)."""
    from torch import nn

    positional = ", ".join(names)
    keywords = ", ".join(f"{k}={k}" for k in tensor_kwargs)
    params = ", ".join(names + list(tensor_kwargs))
    call = ", ".join(p for p in (positional, keywords, "**self.fixed") if p)
    namespace = {}
    exec(f"def forward(self, {params}):\n    return self.fn({call})\n", namespace)  # noqa: S102 - our own text
    import keyword
    import re

    cls_name = "".join(part.capitalize() for part in re.sub(r"\W", "_", name).strip("_").split("_"))
    cls_name = cls_name if cls_name.isidentifier() and not keyword.iskeyword(cls_name.lower()) else "Function"

    def init(self):
        nn.Module.__init__(self)
        self.fn, self.fixed = fn, fixed

    cls = type(cls_name, (nn.Module,), {"__init__": init, "forward": namespace["forward"],
                                        "__module__": getattr(fn, "__module__", None) or "translated"})
    return cls().eval()
