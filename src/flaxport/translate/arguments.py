"""How each module call was called, from one eager run: which forward parameter each array
came in as, and the literal arguments (numbers, strings, None) it was given.

The capture knows what a call reads, not how it was called: TransformerEncoderLayer's `src` is
first read through `x = src` on a line naming only `src_mask` and `src_key_padding_mask`. An eager
run of the model (a copy, in eval mode) records each call's arguments: for a tensor its
parameter, shape, kind and identity (one tensor passed as `query`, `key` and `value` is one
array), for a literal its value. A call's input whose shape and kind one argument alone has (or
one tensor passed under several names) is named after that parameter, the plan reading the source
where this leaves a choice; the literals name the constants a module's calls differ in (calls.py).
A call given one list of tensors and reading all of it (DenseNet's layer, handed every feature
map so far) takes the list as one parameter: its class is one code whatever the list's length.
"""
from __future__ import annotations

import dataclasses
import inspect


@dataclasses.dataclass(frozen=True)
class Call:
    """One recorded call: {parameter: (shape, kind, tensor id)} of its tensors, {parameter: value}
    of its literals, {parameter: [(shape, kind, tensor id)]} of its lists (tuples) of tensors."""

    tensors: dict
    literals: dict
    sequences: dict = dataclasses.field(default_factory=dict)


def recorded_calls(module, example) -> dict:
    """{module path: [Call, in call order]} for every submodule (a module torch reaches by several
    paths: its calls from all of them, under each path), from one eval-mode forward of a copy ({}
    where the model does not run again). A train-mode capture calls its modules with the same arrays."""
    import torch

    from flaxport.translate.copies import WritesShared, on_copy

    def forward(model):
        paths: dict = {}
        for path, sub in model.named_modules(remove_duplicate=False):
            paths.setdefault(id(sub), []).append(path)
        calls: dict = {}
        handles = []
        for sub in model.modules():
            made = []  # one list, under each of the module's paths
            for path in paths[id(sub)]:
                calls[path] = made
            signature = inspect.signature(type(sub).forward)

            def record(mod, args, kwargs, made=made, signature=signature):
                try:
                    bound = signature.bind(mod, *args, **kwargs).arguments
                except TypeError:
                    return
                made.append(Call({name: _described(v) for name, v in bound.items() if torch.is_tensor(v)},
                                 {name: v for name, v in bound.items() if _is_literal(v)},
                                 {name: [_described(t) for t in v] for name, v in bound.items()
                                  if isinstance(v, (list, tuple)) and v and all(torch.is_tensor(t) for t in v)}))

            handles.append(sub.register_forward_pre_hook(record, with_kwargs=True))
        try:
            with torch.no_grad(), torch.random.fork_rng():  # its dropout leaves torch's generator where it was
                model(*example[0], **example[1])
        except WritesShared:
            raise
        except Exception:  # noqa: BLE001 - a model that will not run again keeps the names read from source
            return {}
        finally:
            for handle in handles:
                handle.remove()
        return calls

    # a forward that writes its own weights (HF RWKV rescales them in place) runs on a copy of its own
    return on_copy(module, forward, training=False)


def _described(tensor) -> tuple:
    return tuple(tensor.shape), _kind(tensor), id(tensor)


def sequence_of(values, call: Call) -> str | None:
    """The parameter whose list (or tuple) of tensors the captured `values` are, whole and in
    order, where they are everything the call was given (DenseNet's layer, called with the list of
    every feature map so far): each element matching in shape and kind, no tensor twice; else None."""
    if call.tensors or len(call.sequences) != 1:
        return None
    (name, items), = call.sequences.items()
    if len(items) != len(values) or len({ident for _, _, ident in items}) != len(items):
        return None
    for value, (shape, kind, _) in zip(values, items):
        if _shape_and_kind(value) != (shape, kind):
            return None
    return name


def as_one_parameter(params, whole: tuple[str, int]) -> list:
    """__call__'s parameters with the list's elements (plan.list_parameter: name, length) as the
    one list parameter."""
    return [whole[0], *params[whole[1]:]]


def whole_lists(text: str, name: str, count: int) -> str:
    """`text` with the list of every element, `[features[0], ..., features[n-1]]`, written `features`."""
    return text.replace("[" + ", ".join(f"{name}[{i}]" for i in range(count)) + "]", name)


def _shape_and_kind(value):
    """(concrete shape, kind) of a captured value, None where it is not a tensor."""
    import torch

    val = value.meta.get("val") if hasattr(value, "meta") else None
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(d.node.hint if isinstance(d, torch.SymInt) else int(d) for d in val.shape), _kind(val)


def _is_literal(value) -> bool:
    """A value generated code writes as itself: numbers, strings, None and tuples of them."""
    if isinstance(value, (list, tuple)):
        return all(_is_literal(v) for v in value)
    return value is None or isinstance(value, (int, float, str))


def parameter_of(value, call: Call, taken) -> str | None:
    """The parameter of `call` that the captured `value` came in as, where its shape and kind tell
    it apart from every other tensor argument not `taken`; None where they do not."""
    described = _shape_and_kind(value)
    if described is None:
        return None
    matches = [(name, ident) for name, (s, kind, ident) in call.tensors.items()
               if name not in taken and (s, kind) == described]
    if not matches or len({ident for _, ident in matches}) != 1:
        return None
    return matches[0][0]


def _kind(tensor) -> str:
    """float / complex / bool / int: what a float64 capture and a float32 run agree on."""
    import torch

    if tensor.is_complex():
        return "complex"
    if tensor.is_floating_point():
        return "float"
    return "bool" if tensor.dtype == torch.bool else "int"
