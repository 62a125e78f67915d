"""torch's own decompositions for the ops the op table has no handler for, spliced in where each call was.

`decompose(graph, handled)` replaces every call of an ATen op that `handled(node)` rejects by
the ops torch's decomposition of it runs (torch.export's decomposition table, else the op's
CompositeImplicitAutograd kernel, or a torch.library.custom_op's own Python function), traced on
the call's own example values, so symbolic sizes
stay the export's symbols. Every other node stays as it is (unlike
ExportedProgram.run_decompositions, which re-traces the whole program and rewrites views,
batch_norm and dropout on the way). The new nodes keep the call's source line and module path,
and `meta["decomposed"]` names the op they came from. A decomposition producing ops with no
handler is decomposed again, a few rounds deep; what has no decomposition is left for the
translation to refuse by name.
"""
from __future__ import annotations

import functools

ROUNDS = 6


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    """torch.export's default decomposition table (core ATen decompositions and CompositeImplicitAutograd ops)."""
    from torch.export import default_decompositions

    table = default_decompositions()
    return dict(table.materialize() if hasattr(table, "materialize") else table)


def decomposition(op):
    """torch's decomposition of an OpOverload, or None."""
    import torch

    if not isinstance(op, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in op.tags:
        return None  # a random op's decomposition draws other numbers than torch's kernel
    fn = _table().get(op)
    try:
        composite = op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # an op the dispatcher does not know by that name (aten.size.int)
        composite = False
    if fn is None and composite:
        fn = op.decompose
    if fn is None:
        from torch._decomp import decomposition_table

        fn = decomposition_table.get(op)
    return fn if fn is not None else _custom_op_function(op)


def _custom_op_function(op):
    """The Python function a torch.library.custom_op was made from (its own torch code: traced
    like a decomposition), or None for other ops and custom ops that write into their arguments."""
    from torch._library import custom_ops

    opdef = custom_ops.OPDEFS.get(op._schema.name) if op._overloadname == "default" else None
    if opdef is None or any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return None
    return getattr(opdef, "_init_fn", None)


def decompose(graph, handled, keep=()) -> set:
    """Decompose, in place, the calls `handled(node)` rejects but those in `keep` (see module
    docstring); -> the ops decomposed."""
    done = set()
    for _ in range(ROUNDS):
        todo = [n for n in graph.nodes if n.op == "call_function" and n not in keep and not handled(n)
                and decomposition(n.target) is not None]
        spliced = [n for n in todo if _splice(graph, n)]
        done |= {str(n.target) for n in spliced}
        if not spliced:
            break
    return done


def _splice(graph, node) -> bool:
    """Replace `node` by the graph of its decomposition traced on its example values; False if it cannot be."""
    import torch
    import torch.fx

    traced, inputs = _trace(graph, node)
    if traced is None:
        return False
    output = next(n for n in traced.graph.nodes if n.op == "output").args[0]
    multiple = isinstance(output, (list, tuple))
    if multiple and not all(_is_getitem(u) for u in node.users) or \
            not all(hasattr(o, "op") for o in (output if multiple else [output])):
        return False  # a tuple read other than by index, or an output that is a Python value
    mapping = dict(zip([n for n in traced.graph.nodes if n.op == "placeholder"], inputs))
    with graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "call_function":
                new = graph.call_function(n.target, torch.fx.map_arg(n.args, mapping.get),
                                          torch.fx.map_arg(n.kwargs, mapping.get))
                new.meta = {**node.meta, "val": n.meta.get("val"), "decomposed": node.meta.get("decomposed", str(node.target))}
                mapping[n] = new
    if multiple:
        for user in list(node.users):
            user.replace_all_uses_with(mapping[output[user.args[1]]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(mapping[output])
    graph.erase_node(node)
    return True


def _trace(graph, node):
    """(torch's decomposition of `node` traced on its example values as an fx GraphModule, the node's
    tensor arguments in the order it takes them), or (None, None)."""
    import torch
    import torch.fx
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree

    fn = decomposition(node.target)
    if fn is None or any("val" not in a.meta for a in node.all_input_nodes):
        return None, None
    inputs = []

    def example(a):
        if torch.is_tensor(a.meta["val"]) or isinstance(a.meta["val"], torch.SymInt):
            inputs.append(a)
        return a.meta["val"]

    leaves, spec = _pytree.tree_flatten(torch.fx.map_arg((node.args, node.kwargs), example))
    # tensors and the symbolic sizes other nodes computed (a shape read from another tensor) are the
    # traced function's inputs, so the tracer knows where each comes from
    where = [i for i, v in enumerate(leaves) if torch.is_tensor(v) or isinstance(v, torch.SymInt)]
    fake = detect_fake_mode([leaves[i] for i in where if torch.is_tensor(leaves[i])]) or _graph_fake_mode(graph)
    if fake is None:
        return None, None

    def run(*tensors):
        filled = list(leaves)
        for i, t in zip(where, tensors):
            filled[i] = t
        args, kwargs = _pytree.tree_unflatten(filled, spec)
        out = fn(*args, **kwargs)
        return tuple(out) if isinstance(out, tuple) else out  # a named tuple would become a node of its own

    try:
        with fake, enable_python_dispatcher():
            # functionalized: a decomposition writing into buffers (out=, in place) becomes pure ops
            traced = make_fx(torch.func.functionalize(run, remove="mutations"),
                             tracing_mode="real")(*[leaves[i] for i in where])
    except Exception:  # noqa: BLE001 - torch cannot decompose this call: it stays, and is refused by name
        return None, None
    if any(n.op == "get_attr" for n in traced.graph.nodes):
        return None, None  # the decomposition makes tensor constants of its own
    return traced, inputs


def _is_getitem(node) -> bool:
    import operator

    return node.op == "call_function" and node.target is operator.getitem


def _graph_fake_mode(graph):
    """The FakeTensorMode of the graph's example values (for calls with no tensor argument)."""
    import torch
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if torch.is_tensor(v)])
