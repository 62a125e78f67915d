"""Run one ATen op through its op-table entry: how the op table is tested against torch.

`run_op(torch.ops.aten.max_pool2d.default, x, [3, 3], [2, 2], [1, 1])` builds a one-node
graph (tensor arguments become inputs, everything else stays literal), renders the node
with the op's handler, evaluates the code with JAX on the same values and returns
(jax results, torch results, code), one entry per output.
"""
from __future__ import annotations

import contextlib

import numpy as np

from flaxport.port import draws
from flaxport.translate import ops as oplib
from flaxport.translate.ops import Expr, Outputs


class _Body:
    """The parts of BodyRenderer an op handler reaches, for a single node."""

    def __init__(self, names):
        self.names = names
        self.helpers = set()
        self.synth = {}
        self.needs_training = False
        # the op's tensor arguments stand for values a model computes, not for the model's own inputs
        self.capture = type("C", (), {"mode": "eval", "placeholders": {}})()
        self.plan = type("P", (), {"twin": lambda *a: None, "dtype_reference": lambda *a: None,
                                   "wanted": lambda *a: "torch", "layout_of": lambda *a: "torch",
                                   "flattens_channels_last": lambda *a: False})()
        self.frame = None
        self.added_attributes = type("A", (), {"name": lambda self_, frame, node, base: base})()

    def value(self, v) -> Expr:
        return Expr(self.names[v])

    def value_as(self, v, layout) -> Expr:
        return self.value(v)

    def dtype_of(self, v) -> str | None:
        return f"{self.names[v]}.dtype" if v in self.names else None

    def slot(self, value, hint) -> Expr:
        text = repr(value)
        return Expr(text, oplib.UNARY if text.startswith("-") else oplib.ATOM)

    def sym_expr(self, v) -> Expr:
        return Expr(str(int(v)))


def run_op(target, *args, replay: bool = False, **kwargs):
    """(jax outputs [np arrays], torch outputs [np arrays], code) of one op on these arguments.
    A random op draws from its own stream; replay=True gives it torch's draw (flaxport.port.draws)."""
    import jax
    import jax.numpy as jnp
    import torch
    import torch.fx
    from flax import nnx
    from jax import lax

    from flaxport.translate.context import OpContext
    from flaxport.runtime import arrays, functions

    graph = torch.fx.Graph()
    names, inputs, counter = {}, {}, [0]

    def lift(v):
        if torch.is_tensor(v):
            node = graph.placeholder(f"t{counter[0]}")
            node.meta["val"] = v
            names[node] = f"t{counter[0]}"
            inputs[f"t{counter[0]}"] = v
            counter[0] += 1
            return node
        if isinstance(v, (list, tuple)) and any(torch.is_tensor(e) for e in v):
            return type(v)(lift(e) for e in v)
        return v

    fx_args = tuple(lift(a) for a in args)
    fx_kwargs = {k: lift(v) for k, v in kwargs.items()}
    drawn = draws.Draws()
    with torch.no_grad(), draws.torch_recording(drawn):
        expected = target(*args, **kwargs)
    node = graph.call_function(target, fx_args, fx_kwargs)
    node.meta["val"] = expected
    handler = oplib.lookup(node)
    if handler is None:
        raise KeyError(f"no handler for {target}")
    body = _Body(names)
    ctx = OpContext(body, node)
    result = ctx.finish(handler(ctx, node))
    namespace = {"jnp": jnp, "jax": jax, "lax": lax, "np": np, "nnx": nnx, "math": __import__("math")}
    for runtime in (functions, arrays):
        namespace.update({k: getattr(runtime, k) for k in dir(runtime) if not k.startswith("__")})
    namespace.update({k: jnp.asarray(v.numpy()) for k, v in inputs.items()})
    rngs = nnx.Rngs(params=0, dropout=0, noise=0)  # the module attributes the handler asked for (self.noise)
    namespace["self"] = type("Module", (), {a: eval(ctor, {**namespace, "rngs": rngs})  # noqa: S307
                                            for a, ctor in body.synth.items()})()
    replaying = draws.jax_replay(drawn.standard) if replay else contextlib.nullcontext()
    expected_list = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    expected_list = [e.resolve_conj() if torch.is_tensor(e) else e for e in expected_list]  # a lazily conjugated view
    with replaying:
        if isinstance(result, Outputs):
            codes = [r.text if isinstance(r, Expr) else None for r in result]  # None / Unsupported: not computed
            got = [eval(c, namespace) if c is not None else None for c in codes]  # noqa: S307 - our own code
            code = "; ".join(c for c in codes if c)
        else:
            code = result.text
            value = eval(code, namespace)  # noqa: S307
            got = list(value) if isinstance(expected, (tuple, list)) else [value]
    # an output that is a list of tensors (histogramdd's edges) is compared tensor by tensor
    got = [x for g in got for x in (g if isinstance(g, list) else [g])]
    expected_list = [x for e in expected_list for x in (e if isinstance(e, (list, tuple)) else [e])]
    to_np = [None if g is None else np.asarray(g) for g in got]
    return to_np, [e.numpy() if torch.is_tensor(e) else np.asarray(e) for e in expected_list], code
