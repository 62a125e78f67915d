"""The texts of `translate --optimizer/--loss/--scheduler`, read with `ast` and never run.

A text names a class or function from torch (`torch.optim.AdamW(lr=1e-3)`,
`nn.CrossEntropyLoss(label_smoothing=0.1)`) with literal keyword arguments only: numbers,
strings, True/False/None and tuples of them.
"""
from __future__ import annotations

import ast
import inspect
import math

from flaxport.errors import UserError


class TrainStepError(UserError):
    """An --optimizer, --loss or --scheduler text (or object) flaxport does not carry into train_step.py."""


EXAMPLES = {"--optimizer": '"torch.optim.AdamW(lr=1e-3, weight_decay=0.01)"',
            "--loss": '"torch.nn.functional.cross_entropy" or "nn.CrossEntropyLoss(label_smoothing=0.1)"',
            "--scheduler": '"torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=1000)"'}


def read_call(text: str, what: str):
    """'a.b.C(k=1)' or 'a.b.c' -> ('a.b.C', the ast.Call or None); read, never run."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise TrainStepError(f"{what} {text!r}: not a Python expression such as {EXAMPLES[what]}") from None
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    parts = []
    while isinstance(target, ast.Attribute):
        parts.insert(0, target.attr)
        target = target.value
    if not isinstance(target, ast.Name):
        raise TrainStepError(f"{what} {text!r}: write a name such as {EXAMPLES[what]}")
    return ".".join([target.id] + parts), call


def literal_kwargs(call, text: str, what: str, positional: str = "the parameters are the model's") -> dict:
    """The literal keyword arguments of `call` (None: no call)."""
    if call is None:
        return {}
    if call.args:
        raise TrainStepError(f"{what} {text!r}: keyword arguments only ({positional}), e.g. {EXAMPLES[what]}")
    kwargs = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise TrainStepError(f"{what} {text!r}: no ** arguments, write each keyword out")
        kwargs[kw.arg] = literal(kw.value, text, what, kw.arg)
    return kwargs


def literal(node, text: str, what: str, name: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise TrainStepError(f"{what} {text!r}: {name}= must be a literal (a number, string, True/False/None or a "
                             "tuple of them)") from None


def split_name(dotted: str, prefixes: tuple) -> tuple[str, str]:
    """'torch.optim.AdamW' -> ('torch.optim', 'AdamW'), or ('?', name) for a prefix not in `prefixes`."""
    prefix, _, name = dotted.rpartition(".")
    return (prefix if prefix in prefixes else "?"), name


def check_literals(what: str, text: str, kwargs: dict, fn) -> None:
    """Every literal keyword argument shaped like the default of `fn` (a torch function or
    class) for it: finite numbers, as many numbers as the default's tuple, True/False for a
    switch (torch checks some of these only when it steps, and a bare inf would land in the
    written file)."""
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}
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
