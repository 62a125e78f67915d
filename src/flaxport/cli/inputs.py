"""The --input grammar of `flaxport translate`: what forward takes, as shapes and dtypes.

`2,3,32,32` a float32 tensor (drawn from N(0, 1)), `2,7:int64` token ids (drawn below the
smallest nn.Embedding's size, else below 2), also float64, int32 and bool; `(1,2,16;1,2,16)`
a tuple (an LSTM's (h, c)), `{h=1,2,16;c=1,2,16}` a dict, nested as forward takes them;
`NAME=...` before any of them a keyword argument. A bad text is one UserError line.
"""
from __future__ import annotations

import dataclasses

from flaxport.errors import UserError

DTYPES = ("float32", "float64", "int64", "int32", "bool")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One example tensor: its shape and dtype name."""

    shape: tuple
    dtype: str


def parse_input(text: str):
    """One --input -> (keyword or None, spec). A spec is a TensorSpec ('2,3,32,32', '2,7:int64'),
    a tuple of specs ('(1,2,16;1,2,16)': an LSTM's (h, c)) or a dict of them ('{h=1,2,16;c=1,2,16}');
    'NAME=' before any of them makes it forward's keyword argument NAME."""
    name, eq, value = text.partition("=")
    if eq and name.isidentifier() and not text.startswith(("(", "{")):
        return name, _parse_value(text, value.strip())
    return None, _parse_value(text, text.strip())


def _parse_value(text: str, value: str):
    if value[:1] in ("(", "{"):
        close = {"(": ")", "{": "}"}[value[0]]
        if not value.endswith(close):
            raise UserError(f"--input {text!r}: {value[0]!r} without its {close!r}")
        items = _split_items(text, value[1:-1])
        if value[0] == "(":
            return tuple(_parse_value(text, item) for item in items)
        out = {}
        for item in items:
            key, eq, rest = item.partition("=")
            key = key.strip()
            if not eq or not key.isidentifier():
                raise UserError(f"--input {text!r}: a dict's items are NAME=VALUE, e.g. {{h=1,2,16;c=1,2,16}}")
            if key in out:
                raise UserError(f"--input {text!r}: {key!r} twice")
            out[key] = _parse_value(text, rest.strip())
        return out
    return _parse_tensor(text, value)


def _split_items(text: str, inner: str) -> list:
    """The ';'-separated items of a tuple or dict, brackets nested."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "({"
        depth -= ch in ")}"
        if depth < 0:
            raise UserError(f"--input {text!r}: a closing bracket without its opening one")
        if ch == ";" and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    if depth:
        raise UserError(f"--input {text!r}: an opening bracket without its closing one")
    if any(not item.strip() for item in items):
        raise UserError(f"--input {text!r}: an empty item (items are separated by ';')")
    return [item.strip() for item in items]


def _parse_tensor(text: str, value: str) -> TensorSpec:
    shape_text, _, dtype = value.partition(":")
    dtype = dtype or "float32"
    if dtype not in DTYPES:
        raise UserError(f"--input {text!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    try:
        shape = tuple(int(s) for s in shape_text.split(","))
    except ValueError:
        raise UserError(f"--input {text!r}: a shape is comma-separated sizes, e.g. 2,3,32,32") from None
    if not shape or any(s < 1 for s in shape):
        raise UserError(f"--input {text!r}: every size must be at least 1")
    if any(s >= 2**63 for s in shape):
        raise UserError(f"--input {text!r}: every size must be below 2**63")
    return TensorSpec(shape, dtype)


def _tensors(spec) -> list:
    """The TensorSpecs of a spec, in order."""
    if isinstance(spec, TensorSpec):
        return [spec]
    return [t for item in (spec.values() if isinstance(spec, dict) else spec) for t in _tensors(item)]


def check_input_memory(texts, parsed) -> None:
    """Refuse example inputs that alone need more memory than is free here (before any is made)."""
    import math

    import numpy as np

    from flaxport.workloads.validate import available_bytes, size_text

    sizes = [sum(math.prod(t.shape) * np.dtype(t.dtype).itemsize for t in _tensors(spec)) for _, spec in parsed]
    free = available_bytes()
    if free is not None and sum(sizes) > free:
        worst = max(range(len(sizes)), key=sizes.__getitem__)
        raise UserError(f"--input {texts[worst]}: the example inputs need {size_text(sum(sizes))} of memory, "
                        f"more than the {size_text(free)} free here; translate needs a small example batch")


def make_inputs(parsed, module, seed: int):
    """(args, kwargs) of forward from parse_input's results, drawn in the order given: floats from
    N(0, 1), integers below the smallest nn.Embedding's size (else 2), bools fair."""
    import torch

    g = torch.Generator().manual_seed(seed)
    tables = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    high = min(tables) if tables else 2

    def make(spec):
        if isinstance(spec, dict):
            return {key: make(item) for key, item in spec.items()}
        if isinstance(spec, tuple):
            return tuple(make(item) for item in spec)
        if spec.dtype in ("float32", "float64"):
            return torch.randn(spec.shape, generator=g, dtype=getattr(torch, spec.dtype))
        if spec.dtype == "bool":
            return torch.rand(spec.shape, generator=g) > 0.5
        return torch.randint(0, high, spec.shape, generator=g, dtype=getattr(torch, spec.dtype))

    args, kwargs = [], {}
    for name, spec in parsed:
        if name is None:
            args.append(make(spec))
        else:
            kwargs[name] = make(spec)
    return args, kwargs
