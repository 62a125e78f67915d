"""Regions torch.export wraps in a higher-order op that a translation computes as they are: spliced back in.

`with torch.autocast(device_type=..., enabled=False):` around a module's float32 math (timm's
EfficientViT attention) reaches the graph as `wrap_with_autocast(device, dtype, False, cache,
submod, *args)`, its ops in a sub-graph. With autocast off the region computes what its ops
compute, so its nodes (with their module stacks) take the wrapper's place. An enabled autocast
region casts inside, which the plain ops would not: translate refuses it, naming the module.
"""
from __future__ import annotations

import operator

from flaxport.translate.errors import TranslateError


def splice_regions(graph) -> None:
    """Replace each autocast-off wrapper in `graph` (an ExportedProgram's) by its sub-graph's
    nodes, in place."""
    import torch

    wrapper = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
    if wrapper is None:
        return
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not wrapper:
            continue
        _device, _dtype, enabled, _cache, submod, *args = node.args
        if enabled:
            stack = node.meta.get("nn_module_stack") or {}
            where = next(reversed(stack.values()))[0] if stack else ""
            raise TranslateError(f"{where or 'the top module'} runs ops under torch.autocast(enabled=True), which "
                                 "translate does not carry: translate it without autocast and "
                                 "train in bfloat16 with `translate --precision bf16`")
        sub = getattr(graph.owning_module, submod.target)
        values = dict(zip((n for n in sub.graph.nodes if n.op == "placeholder"), args))
        results = None
        with graph.inserting_before(node):
            for inner in sub.graph.nodes:
                if inner.op == "placeholder":
                    continue
                if inner.op == "output":
                    results = [values[r] if r is not None else None
                               for r in torch.fx.node.map_arg(inner.args[0], lambda n: n)]
                    continue
                values[inner] = graph.node_copy(inner, lambda n: values[n])
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
        graph.erase_node(node)
        if not submod.users:
            graph.erase_node(submod)
