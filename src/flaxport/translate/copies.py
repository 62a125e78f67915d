"""Copies of the user's torch module for the captures and checks: cast as they are copied, or
sharing its tensors while no op writes them.

The captures, the proof and the file checks each run the model on a copy, so the user's module is
never changed. A plain deep copy holds the weights once more each time: for a model of 600M
parameters, 2.5 GB a copy. A copy in the model's own dtype that only reads its weights needs none
of its own: `on_copy` runs it sharing them and stops the first op that would write one.
"""
from __future__ import annotations

import contextlib
import copy

PARAMETERS, BUFFERS = "parameters", "buffers"


def copy_as(module, dtype=None, share=()):
    """A deep copy of the torch module.

    dtype: its floating parameters and buffers cast as they are copied (the model once in the new
      dtype, not once more in its own first); None keeps them.
    share: PARAMETERS and/or BUFFERS the copy holds as the module's own tensors rather than copies
      (dtype None only): run it where nothing writes them (`on_copy` makes sure)."""
    import torch

    if share and dtype is not None:
        raise ValueError("a copy cast to another dtype cannot share the module's tensors")
    memo = {}
    if PARAMETERS in share:
        memo.update({id(p): p for p in module.parameters()})
    if BUFFERS in share:
        memo.update({id(b): b for b in module.buffers()})
    if dtype is not None:
        def cast(t):
            return t.detach().to(dtype) if t.is_floating_point() else t.detach().clone()

        for p in module.parameters():
            memo[id(p)] = torch.nn.Parameter(cast(p), requires_grad=p.requires_grad)
        for b in module.buffers():
            memo[id(b)] = cast(b)
    return copy.deepcopy(module, memo)


def on_copy(module, forward, training: bool | None, share=(PARAMETERS,), dtype=None):
    """forward(copy) for a copy of `module` in train or eval mode (None: each submodule in its own)
    that holds what `share` names as the module's own tensors (by default the parameters: the
    buffers, which a train-mode forward updates, are small and copied). An op that would write a
    shared tensor (a forward that rescales its weights in place) is stopped before it writes, and
    forward runs again on a copy of its own: the module is left as it was either way.
    dtype: the copy cast to it instead, its own from the start (nothing shared)."""
    from flaxport.port.weights import set_torch_mode

    def mode(m):
        return m if training is None else set_torch_mode(m, training)

    if dtype is None:
        shared = mode(copy_as(module, share=share))
        tensors = [*(shared.parameters() if PARAMETERS in share else ()),
                   *(shared.buffers() if BUFFERS in share else ())]
        refused = []
        try:
            with writes_refused(tensors, refused):
                out = forward(shared)
            if not refused:  # a forward that caught the refusal itself ran on without the write
                return out
        except WritesShared:
            pass
        del shared
    return forward(mode(copy_as(module, dtype)))


class WritesShared(RuntimeError):
    """An op would write into a tensor the copy shares with the user's module."""


@contextlib.contextmanager
def writes_refused(tensors, refused: list):
    """Inside: an op that would write into the storage of one of `tensors` (through any view of it)
    raises WritesShared before it writes, and its name is appended to `refused`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    storages = {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta"} - {0}  # 0: empty

    def written(func, args, kwargs):
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            for v in value if isinstance(value, (list, tuple)) else (value,):
                if torch.is_tensor(v) and v.untyped_storage().data_ptr() in storages:
                    return True
        return False

    class RefuseWrites(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func._schema.is_mutable and written(func, args, kwargs):
                refused.append(str(func))
                raise WritesShared(f"{func} writes a tensor the copy shares with the module")
            return func(*args, **kwargs)

    if not storages:
        yield
        return
    with RefuseWrites():
        yield
