"""PyTorch's operator test suite (OpInfo's op_db) as a coverage source: each sample a module calling one op.

  names(filter=None) -> ["abs", "add", ..., "nn.functional.conv2d", ...]  the 669 entries with
      float32 CPU samples (sparse and CUDA-only entries left out); filter: comma-separated
      regular expressions, a name is kept when one of them finds it (runner.select)
  build(name, dtype=torch.float32, count=3) -> [(module, args, kwargs)]  the entry's first
      `count` samples; module(*args, **kwargs) calls the op as the sample does

A sample's tensors (its input, and every tensor in its args and kwargs, lists included) are
the module's forward arguments, by name (`x`, `arg1`, `dim`, ...), so torch.export sees them
as inputs with sizes it may keep symbolic; everything else in the sample stays a constant of
the call. Importing op_db needs the `expecttest` package; it freezes torch.backends' flags outside
their flags() contexts (torch's test-suite setting), which this module undoes.
"""
from __future__ import annotations

import functools
import inspect
import itertools

from flaxport.bench.coverage.runner import select

LEFT_OUT = ("sparse.", "to_sparse", "jiterator_")  # sparse layouts and CUDA-only (jiterator) entries


@functools.lru_cache(maxsize=1)
def _entries() -> dict:
    """{name: OpInfo} of the entries with float32 CPU samples."""
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    # importing it froze torch.backends' flags (torch's test-suite setting): not this process's
    setattr(torch.backends, "__allow_nonbracketed_mutation_flag", True)

    out = {}
    for op in op_db:
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if name.startswith(LEFT_OUT) or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        out[name] = op
    return out


def entry(name: str):
    """The OpInfo of a name from names() (KeyError naming it if there is none)."""
    try:
        return _entries()[name]
    except KeyError:
        raise KeyError(f"no OpInfo entry {name!r}") from None


def names(filter: str | None = None) -> list:  # noqa: A002 - the interface every coverage source shares
    """Entry names (name.variant), in op_db's order; those `filter` selects."""
    return select(list(_entries()), filter)


def build(name: str, dtype=None, count: int = 3) -> list:
    """[(module, args, kwargs)] for the entry's first `count` CPU samples of `dtype` (float32)."""
    import torch

    op = entry(name)
    dtype = torch.float32 if dtype is None else dtype
    samples = op.sample_inputs("cpu", dtype, requires_grad=False)
    return [sample_module(op, s) for s in itertools.islice(samples, count)]


def sample_module(op, sample):
    """(module, args, {}) for one SampleInput: forward(x, arg1, ...) calls the op on the sample."""
    import torch
    from torch.utils import _pytree

    tree = (sample.input, list(sample.args), dict(sample.kwargs))
    flat = _pytree.tree_flatten_with_path(tree)[0]
    leaves = [leaf for _, leaf in flat]
    where = [i for i, leaf in enumerate(leaves) if torch.is_tensor(leaf)]
    arg_names = _unique([_name(flat[i][0]) for i in where])
    cls = _sample_class(arg_names)
    module = cls(op.op, leaves, _pytree.tree_structure(tree), where)
    return module, tuple(leaves[i].clone() for i in where), {}


def _sample_class(arg_names: list):
    """OpModule with forward(self, <arg_names>): torch.export names the inputs (and their dynamic
    sizes) from the forward's signature."""
    base = _base_class()

    def forward(self, *tensors):
        return self.call(*tensors)

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ["self"] + arg_names]
    forward.__signature__ = inspect.Signature(params)
    return type("OpModule", (base,), {"forward": forward, "__module__": __name__})


@functools.lru_cache(maxsize=1)
def _base_class():
    import torch

    class OpModule(torch.nn.Module):
        """Calls one OpInfo op on a sample: the sample's tensors come in as arguments."""

        def __init__(self, fn, leaves, spec, where):
            super().__init__()
            self.fn, self.leaves, self.spec, self.where = fn, leaves, spec, where

        def call(self, *tensors):
            from torch.utils import _pytree

            leaves = list(self.leaves)
            for i, t in zip(self.where, tensors):
                leaves[i] = t
            x, args, kwargs = _pytree.tree_unflatten(leaves, self.spec)
            return self.fn(x, *args, **kwargs)

    return OpModule


def _name(path) -> str:
    """x (the sample's input), arg1, arg2 ... (its args), the keyword (its kwargs); _i per list element."""
    from torch.utils import _pytree

    top, rest = path[0].idx, path[1:]
    if top == 0:
        base = "x"
    elif top == 1:
        base, rest = f"arg{rest[0].idx + 1}", rest[1:]
    else:
        base, rest = str(rest[0].key), rest[1:]
    for key in rest:
        base += f"_{key.idx if isinstance(key, _pytree.SequenceKey) else key.key}"
    return base if base.isidentifier() else "t"


def _unique(names: list) -> list:
    out = []
    for n in names:
        name, k = n, 1
        while name in out:
            k += 1
            name = f"{n}_{k}"
        out.append(name)
    return out
