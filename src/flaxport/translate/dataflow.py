"""How values flow in one module call's body, worked out before any line is written.

The units of the body (op nodes, calls of child modules, buffer updates) in source order; which
unit produces each value and which units (or the return) read it; which values are written
inline, inside their one reader's expression (`jax.nn.relu(self.bn1(self.conv1(x)))`); where
each unit is written; and which array each size a unit reads is read from. body.py names the
values and writes the statements from it.
"""
from __future__ import annotations

import math

from flaxport.translate import capture as cap
from flaxport.translate import marks
from flaxport.translate import source as src

# Ops whose handlers read sizes from their output's or inputs' shapes.
SHAPE_OPS = {"aten.expand.default", "aten.flatten.using_ints", "aten.unflatten.int", "aten.expand_copy.default"}
# Matrix products (besides convolutions) as captured.
PRODUCTS = {f"aten.{name}" for name in ("linear.default", "matmul.default", "mm.default", "bmm.default",
                                        "addmm.default", "baddbmm.default", "addbmm.default", "einsum.default")}


class Unit:
    """A step of the body: an op node, a child call, or a buffer update."""

    def __init__(self, kind, index, node=None, frame=None, outputs=(), key=None, stmt=None):
        self.kind, self.index, self.node, self.frame = kind, index, node, frame
        self.outputs = list(outputs)  # values it produces
        self.key, self.stmt = key, stmt
        self.target = None  # buffer update: the buffer's torch name

class Dataflow:
    """The flow of one frame of one capture. io(frame) -> (inputs, outputs) of a call, with the
    sizes it asks its caller for. Fixed once built: the renderer only reads it."""

    def __init__(self, plan, capture, frame, io):
        self.plan, self.capture, self.frame, self._io = plan, capture, frame, io
        self.cls_file = src.class_file(type(frame.module))
        inputs, outputs = io(frame)
        self.inputs = inputs
        self.units = self._units()
        self.producer = {v: u for u in self.units for v in u.outputs}
        # consumers of each produced value: units of this body, or "return"
        self.consumers: dict = {v: [] for v in self.producer}
        for v in inputs:
            if not isinstance(v, str):
                self.consumers.setdefault(v, [])
        for u in self.units:
            for v in self.used_by(u):
                if v in self.consumers and u not in self.consumers[v]:
                    self.consumers[v].append(u)
        for v in outputs:
            if v in self.consumers:
                self.consumers[v].append("return")
        out_set = set(outputs)
        self.inline = {v for v in self.producer if self._inlinable(v, out_set)}
        self._limit_depth()
        self.sym_source: dict = {}  # (unit index, size symbol) -> the array its shape is read from
        self._plan_symbols()
        self.positions = self._positions()  # unit -> where it is written

    def _units(self):
        units = []

        def visit(frame):
            for item in frame.items:
                if isinstance(item, cap.Frame):
                    if self.plan.kind(item) == "inline":
                        visit(item)
                    else:
                        u = Unit("call", len(units), frame=item, outputs=self._io(item)[1])
                        u.stmt = self._stmt_of_frame(item)
                        u.key = u.stmt.key if u.stmt else None
                        units.append(u)
                else:
                    if cap.is_sym(item):
                        continue
                    u = Unit("op", len(units), node=item, outputs=[item])
                    u.stmt = src.statement(item, self.cls_file)
                    u.key = u.stmt.key if u.stmt else None
                    units.append(u)
                    for target, value in self.capture.buffer_updates.items():
                        if value is item and self.plan.owns_update(self.frame, target):
                            up = Unit("update", len(units), node=item, key=u.key, stmt=u.stmt)
                            up.target = target
                            units.append(up)

        visit(self.frame)
        self._split_iterations(units)
        return units

    def _split_iterations(self, units):
        """A statement run again by a loop (`for layer in self.layers: x = layer(x)`) makes more
        module calls than it has call expressions: each run becomes a statement of its own. Not
        a statement outside a loop calling a method of its own (`mu, logvar = self.encode(x)`):
        the method's module calls are one run."""
        children = {name for name, _ in self.frame.module.named_children()}
        calls: dict = {}
        current: dict = {}
        for u in units:
            if u.key is None:
                continue
            helper = any(a not in children for a in u.stmt.self_calls)  # a key comes with its statement
            if u.kind == "call" and (u.stmt.loops or not helper):
                k = calls.get(u.key, 0)
                calls[u.key] = k + 1
                current[u.key] = k // u.stmt.calls
            u.key = u.key + (current.get(u.key, 0),)

    def _stmt_of_frame(self, frame):
        """The statement of this class's code that called the child frame."""
        nodes = list(frame.all_nodes())
        stmt = src.call_statement(nodes, type(self.frame.module))
        if stmt is not None:
            return stmt
        for n in nodes:
            s = src.statement(n, self.cls_file)
            if s is not None:
                return s
        return None

    def used_by(self, u) -> list:
        if u.kind == "call":
            return [v for v in self._io(u.frame)[0] if not isinstance(v, str)]
        if u.kind == "update":
            return [u.node]
        return list(u.node.all_input_nodes)

    def _inlinable(self, v, out_set) -> bool:
        u = self.producer[v]
        if u.kind == "update" or u.key is None:
            return False
        if u.kind == "call" and (len(u.outputs) != 1 or self.plan.specs.get(u.frame.path) is not None
                                 and self.plan.specs[u.frame.path].core):
            return False
        if u.kind == "op" and isinstance(v.meta.get("val"), (list, tuple)):
            return self._multi_inlinable(v)
        users = self.consumers[v]
        if len(users) != 1:
            return False
        user = users[0]
        if user == "return":
            return bool(u.stmt and u.stmt.is_return) and v in out_set and len(self._io(self.frame)[1]) == 1
        if user.key != u.key or user.kind == "update" and False:
            return False
        if user.kind == "call" and self.plan.specs.get(user.frame.path) is not None and \
                self.plan.specs[user.frame.path].marked and \
                [value for _, value in marks.arguments(user.frame)].count(v) > 1:
            return False  # `attn(h, h, h)`: one name, not the expression three times
        if user.kind == "op" and self.plan.flattens_channels_last(self.capture, user.node):
            return False  # the flatten checks its (H, W) on a name: `assert h.shape[1:3] == ...`
        if user.kind == "op" and isinstance(user.node.meta.get("val"), (list, tuple)) and \
                len([g for g in user.node.users if g.users]) > 1:
            return False  # its outputs are separate expressions: do not repeat v in each
        return True

    def _plan_symbols(self):
        """Choose, for every size a unit reads, the array whose shape it is read from, and count
        that read as a use (so the array keeps its name until then)."""
        import torch

        earlier = [v for v in self.inputs if not isinstance(v, str)]
        for u in self.units:
            symbols = []

            def collect(v):
                if isinstance(v, (list, tuple)):
                    for e in v:
                        collect(e)
                elif isinstance(v, str):
                    symbols.append(v)
                elif hasattr(v, "op") and cap.is_sym(v):
                    sizes(v.meta["val"].node.expr)
                elif isinstance(v, torch.SymInt):
                    sizes(v.node.expr)

            def sizes(expr):
                # a compound size too ((s0 - 1)//2 + 1): an input holding it whole keeps its name until here
                symbols.extend([str(s) for s in expr.free_symbols] + ([] if expr.is_Symbol else [str(expr)]))

            if u.kind == "call":
                collect(self._io(u.frame)[0])
            elif u.kind == "op":
                node = u.node
                collect(list(node.args) + list(node.kwargs.values()))
                if str(node.target) in SHAPE_OPS:
                    collect(list(getattr(node.meta.get("val"), "shape", ())))
                    for a in node.all_input_nodes:
                        collect(list(getattr(a.meta.get("val"), "shape", ()) or ()))
            args, todo = [], [a for a in self.used_by(u) if not isinstance(a, str) and not cap.is_sym(a)]
            while todo:
                a = todo.pop(0)
                if a in args:
                    continue
                args.append(a)
                if a in self.inline and a in self.producer:
                    todo += [b for b in self.used_by(self.producer[a]) if not isinstance(b, str) and not cap.is_sym(b)]
            for name in dict.fromkeys(symbols):
                candidates = [a for a in args if a not in self.inline] + list(reversed(earlier))
                source = next((v for v in candidates if self.dim_of(v, name) is not None), None)
                if source is None:
                    continue
                self.sym_source[(u.index, name)] = source
                if source in self.consumers and u not in self.consumers[source]:
                    self.consumers[source].append(u)
            earlier += [v for v in u.outputs if v not in self.inline and not isinstance(v.meta.get("val"), (list, tuple))]

    def _limit_depth(self, limit: int = 4):
        """Name the inner part of a nested expression deeper than `limit` calls (torch functions
        such as F.multi_head_attention_forward put dozens of ops in one source statement)."""
        depth = {}
        for u in self.units:
            args = [a for a in self.used_by(u) if a in self.inline]
            d = 1 + max((depth.get(a, 0) for a in args), default=0)
            if d > limit:
                deepest = max(args, key=lambda a: depth.get(a, 0))
                self.inline.discard(deepest)
                d = 1 + max((depth.get(a, 0) for a in args if a in self.inline), default=0)
            for v in u.outputs:
                depth[v] = d

    def _multi_inlinable(self, v) -> bool:
        used = [g for g in v.users if (g.users or self.is_output(g))]
        return len(used) <= 1

    def is_output(self, g):
        return g in set(self._io(self.frame)[1])

    def _positions(self) -> dict:
        """Emission position of each unit: an inlined unit is emitted with its consumer."""
        pos = {}
        for u in reversed(self.units):
            vals = [v for v in u.outputs if v in self.inline]
            if vals:
                user = self.consumers[vals[0]][0]
                pos[u] = math.inf if user == "return" else pos.get(user, user.index)
            else:
                pos[u] = u.index
        return pos

    def last_use(self, v) -> float:
        last = -1
        for user in self.consumers.get(v, []):
            last = math.inf if user == "return" else max(last, self.positions[user])
            if user != "return" and user.kind == "op" and isinstance(user.node.meta.get("val"), (list, tuple)):
                # a multi-output op may be one expression per output (Outputs), each reading v where it is
                # written (an inlined getitem: in its consumer's statement)
                for item in user.node.users:
                    last = max(last, self.positions.get(self.producer.get(item), -1))
        return last

    def dim_of(self, v, name):
        """The axis of v's array holding size symbol `name` (its layout considered)."""
        from flaxport.translate import layout as lay

        val = v.meta.get("val") if hasattr(v, "meta") else None
        for d, s in enumerate(getattr(val, "shape", ()) or ()):
            if hasattr(s, "node") and str(s.node.expr) == name:
                return lay.to_layout_dim(d) if self.plan.layout_of(self.capture, v) == lay.LAST else d
        return None


def computed_again(v) -> bool:
    """Would XLA:CPU compute the value v again in a fusion? So it does where an element-wise op
    reads v (XLA copies the cheap ops that made v into that op's fusion) and a convolution or a
    matrix product reads it too (it reads v written out, so v is computed twice): a residual
    block's input, which the block's first convolution and its own sum read. runtime
    computed_once. Not the model's inputs and weights, which nothing makes."""
    val = v.meta.get("val") if hasattr(v, "meta") else None
    if not (hasattr(val, "dtype") and val.dtype.is_floating_point) or v.op in ("placeholder", "get_attr"):
        return False
    readers = list(v.users)
    return any(_is_pointwise(r) for r in readers) and any(_reads_written_out(r) for r in readers)


def _is_pointwise(node) -> bool:
    """An element-wise aten op (torch tags them: add, mul, relu, where, ...)."""
    import torch

    return torch.Tag.pointwise in getattr(node.target, "tags", ())


def _reads_written_out(node) -> bool:
    """A convolution or a matrix product: XLA:CPU runs it on its operands written out in memory
    (flaxport's kernels, a library's product), never fused with the ops that made them."""
    target = str(node.target)
    return target.startswith(("aten.conv", "aten._convolution")) or target in PRODUCTS
