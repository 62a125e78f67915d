"""Calls of torch layers that a translation calls as the user called them, tagged in the capture.

torch.export records what a call computes, not how it was called: `attn(h, h, h,
key_padding_mask=pad)` reads two values, in the order its code first uses them. For the layers
whose runtime class takes torch's own arguments (nn.MultiheadAttention), the capture passes each
tensor argument through `flaxport::call_argument` (which forward parameter it is, and the call's
other literal arguments) and each tensor result through `flaxport::call_result` (its position
in what the call returns): identities torch runs as a copy, which tell the plan how to write the
call. Where such a layer is translated op by op instead, they are identities there too.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect

ARGUMENT = "flaxport.call_argument.default"
RESULT = "flaxport.call_result.default"


def ops():
    """(call_argument, call_result): the two ops, defined with torch the first time."""
    import torch

    _library()
    return torch.ops.flaxport.call_argument.default, torch.ops.flaxport.call_result.default


@functools.cache
def _library():
    """The ops' definitions, once a process (they live as long as the library object)."""
    import torch

    library = torch.library.Library("flaxport", "FRAGMENT")
    library.define("call_argument(Tensor self, str parameter, str literals) -> Tensor")
    library.define("call_result(Tensor self, int position) -> Tensor")
    for name in ("call_argument", "call_result"):
        library.impl(name, lambda x, *_: x.clone(), "CompositeExplicitAutograd")
        torch.library.register_fake(f"flaxport::{name}", lambda x, *_: torch.empty_like(x), lib=library)
    return library


@contextlib.contextmanager
def marking(module, marked):
    """Within: every submodule for which marked(submodule) is true tags its calls' tensor arguments
    and results (export the module inside)."""
    argument, result = ops()
    handles = []
    for sub in module.modules():
        if not marked(sub):
            continue
        signature = inspect.signature(type(sub).forward)

        def tag_arguments(mod, args, kwargs, signature=signature):
            import torch

            bound = signature.bind(mod, *args, **kwargs)
            bound.apply_defaults()
            given = dict(list(bound.arguments.items())[1:])
            literals = repr({k: v for k, v in given.items() if isinstance(v, (bool, int, float, str, type(None)))})
            return (), {k: argument(v, k, literals) if torch.is_tensor(v) else v for k, v in given.items()}

        def tag_results(mod, args, kwargs, out):
            import torch

            many = isinstance(out, tuple)
            tagged = [result(o, i) if torch.is_tensor(o) else o for i, o in enumerate(out if many else (out,))]
            return tuple(tagged) if many else tagged[0]

        handles.append(sub.register_forward_pre_hook(tag_arguments, with_kwargs=True))
        handles.append(sub.register_forward_hook(tag_results, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def arguments(frame) -> list:
    """[(forward parameter, the value passed)] of a tagged call, in the forward's order."""
    return [(node.args[1], node.args[0]) for node in _own_nodes(frame) if str(node.target) == ARGUMENT]


def literals(frame) -> dict:
    """{forward parameter: value} of the call's other arguments (numbers, flags, None)."""
    tag = next((node for node in _own_nodes(frame) if str(node.target) == ARGUMENT), None)
    return {} if tag is None else ast.literal_eval(tag.args[2])


def position(node) -> int | None:
    """Where in the call's results a tagged result is (None: not a tagged result)."""
    return node.args[1] if str(node.target) == RESULT else None


def _own_nodes(frame):
    """The nodes that ran in the call itself (not in the calls it made)."""
    import torch.fx

    return [item for item in frame.items if isinstance(item, torch.fx.Node)]
