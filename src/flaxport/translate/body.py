"""One module call's `__call__` body: statements in source order, named as the user named them.

The nodes of a frame (and of the parameter-free torch modules it calls, such as ReLU,
which are inlined) become statements. A value used once, by the next part of the same
source statement, is inlined (`out = jax.nn.relu(self.bn1(self.conv1(x)))`); any other
value gets a name: the assignment target of its source statement where there is one,
else a short name after its op. Sizes are read from a named array's `.shape`.

Numbers that may differ between two instances of one class (channels, strides, eps) are
emitted as slots (`\\x00N\\x00`), so the class planner can tell which instances share a
class and which numbers become constructor arguments.
"""
from __future__ import annotations

import dataclasses
import math

from flaxport.translate import arguments
from flaxport.translate import capture as cap
from flaxport.translate import marks
from flaxport.translate import ops as oplib
from flaxport.translate import source as src
from flaxport.translate.context import OpContext
from flaxport.translate.dataflow import SHAPE_OPS, Dataflow, computed_again
from flaxport.translate.naming import RESERVED, safe_name
from flaxport.translate.sizes import print_size
from flaxport.translate.ops import ATOM, Expr, Outputs, Unsupported, call

SHORT_NAMES = {"scaled_dot_product_attention": "attn", "layer_norm": "normed", "group_norm": "normed",
               "batch_norm": "normed", "linear": "h", "conv2d": "h", "conv1d": "h", "conv3d": "h",
               "getitem": "item", "embedding": "embedded", "softmax": "probs", "log_softmax": "log_probs",
               "unsqueeze": "expanded", "expand": "expanded", "view": "h", "reshape": "h", "transpose": "h",
               "permute": "h", "cat": "joined", "add": "h", "mul": "h", "sub": "h", "div": "h"}




@dataclasses.dataclass
class Body:
    """A rendered __call__: parameter names, statement lines (with slots), and what it needs."""

    params: list  # __call__ parameter names
    lines: list  # statement texts (one per line, no indentation), slot markers inside
    slots: list  # [(value, hint)] for the slot markers \x00i\x00
    helpers: set  # runtime functions used
    synth: dict  # attribute name -> constructor template (dropout modules, rng streams)
    needs_training: bool
    outputs: list  # fx nodes returned, in order
    problems: list  # (what, module path, source) this call cannot be translated for

    def template(self) -> str:
        return "\n".join(self.lines)


class BodyRenderer:
    """Renders one frame of one capture. `plan` answers questions about other frames
    (kinds, attribute paths, inputs and outputs, twin nodes in the other captures)."""

    def __init__(self, plan, capture, frame, class_path: str, call_constants, sizes_asked, added_attributes):
        self.plan, self.capture, self.frame = plan, capture, frame
        self.call_constants = call_constants  # what this frame's calls of modules pass (calls.py)
        self.sizes_asked = sizes_asked  # the sizes calls ask their callers for (sizes.SizesAsked)
        self.added_attributes = added_attributes  # naming.AddedAttributes: dropout modules, rng streams
        self.path = class_path  # the module path this class renders (== frame.path)
        # what the rendering writes
        self.slots: list = []
        self.helpers: set = set()
        self.problems: list = []
        self.synth: dict = {}
        self.needs_training = False
        self.lines: list = []
        self.decomposed: set = set()  # ops whose decomposition this body has said it writes
        # values: names, inline expressions, multi-output results, what is defined and live
        self.names: dict = {}  # fx node -> variable name
        self.exprs: dict = {}  # fx node -> Expr for values rendered inline or precomputed
        self.multi: dict = {}  # multi-output node -> Outputs
        self.defined: set = set()
        self.holder: dict = {}  # variable name -> the value it holds now
        # where rendering is: the unit and op being written, and the sizes read inside that op
        self.current_unit = None
        self.current_op = None
        self.sym_cache: dict = {}
        self.inputs, self.outputs = self._io(frame)  # inputs are in scope at every line (plan.dtype_reference)
        self.flow = Dataflow(plan, capture, frame, self._io)
        params = self._param_names(frame)
        for v, name in zip(self.inputs, params):
            if not isinstance(v, cap.Frame):
                self.names[v] = name
        self.live = {name: math.inf for name in params}  # variable name -> the position of its last use
        self.listed = plan.list_parameter(frame)  # (list parameter, length) for a call given one list
        for v, name in zip(self.inputs, params):
            if not isinstance(v, str) and not name.endswith("]"):  # a list's element is never reassigned
                self.live[name] = math.inf if cap.is_sym(v) else self.flow.last_use(v)
        if self.listed:
            self.live[self.listed[0]] = math.inf
        # sizes the call is given (plan._sizes_passed_in): {sympy text of the size: parameter name}
        self.size_params = {str(v.meta["val"].node.expr): name for v, name in zip(self.inputs, params)
                            if not isinstance(v, str) and cap.is_sym(v)}
        self._assign_names(set(self.outputs))
        for v, name in zip(self.inputs, params):
            if not isinstance(v, str):
                self.holder[name] = v
        self.entry = [(v, name) for v, name in zip(self.inputs, params) if not isinstance(v, (str, cap.Frame))]
        self.entry_sizes: dict = {}  # size symbol -> the name _read_at_entry read it into
        self.entry_dtypes: dict = {}  # input -> the name dtype_of read its dtype into
        self.asked: dict = {}  # size expression (text) -> the parameter the caller passes it in

    # ------------------------------------------------------------------ rendering
    def render(self) -> Body:
        for u in self.flow.units:
            self._emit(u)
        for v in self.outputs:
            if v in self.flow.inline and self.flow.producer.get(v) is not None and self.flow.producer[v].kind == "op":
                self._say_decomposed(self.flow.producer[v])
        self.lines.append(self._return(self.outputs))
        if self.frame.parent is not None:
            for v, name in reversed(self.entry):
                if "[" not in name and computed_again(v):
                    self.lines.insert(0, f"{name} = {self._computed_once(v, name)}")
        params = self.capture.input_names if self.frame.parent is None else self._param_names(self.frame)
        if self.listed:  # the list read whole is the parameter itself
            params = arguments.as_one_parameter(params, self.listed)
            self.lines = [arguments.whole_lists(line, *self.listed) for line in self.lines]
        return Body(list(params), self.lines, self.slots, self.helpers, self.synth, self.needs_training,
                    list(self.outputs), self.problems)

    def _computed_once(self, v, name) -> str:
        """`computed_once(x)`; on a feature map in torch's layout computed channels-last, where the
        transposes at its edges meet those of the convolutions around it (in torch's layout XLA
        writes a transposed copy of x)."""
        from flaxport.translate.layout import image_value

        self.helpers.add("computed_once")
        if self.plan.layout_of(self.capture, v) != "last" and image_value(v):
            self.helpers.add("apply_channels_last")
            return f"apply_channels_last(computed_once, {name})"
        return f"computed_once({name})"

    def _io(self, frame):
        """plan.io(frame), with the sizes the call asks its caller for among its inputs (as str)."""
        inputs, outputs = self.plan.io(frame)
        return inputs + self.sizes_asked.of(frame), outputs

    def _param_names(self, frame) -> list:
        taken = src.forward_parameters(type(frame.module))
        return self.plan.param_names(frame) + self.sizes_asked.parameters(frame, taken)


    def _assign_names(self, out_set):
        groups: dict = {}
        for u in self.flow.units:
            if u.kind == "update":
                continue
            named = [v for v in u.outputs if v not in self.flow.inline and self._needs_name(v)
                     and (u.kind != "call" or self.flow.consumers.get(v))]  # a result no one reads: `_`
            if named:
                groups.setdefault(u.key if u.key is not None else ("unit", u.index), []).append((u, named))
        for key, members in groups.items():
            values = [v for _, vs in members for v in vs]
            results = [v for v in values if any(c == "return" or c.key != key for c in self.flow.consumers.get(v, []))]
            if results and len(results) < len(values):
                temps = [v for v in values if v not in results]
                values = results
                for u, vs in members:
                    for v in vs:
                        if v in temps:
                            self._claim(v, self._fallback_name(u, v), self.flow.positions[u])
            stmt = members[0][0].stmt
            targets = list(stmt.targets) if stmt and stmt.targets else []
            wanted = {}
            u0 = members[0][0]
            spec = self.plan.specs.get(u0.frame.path) if u0.kind == "call" else None
            if spec is not None and spec.core and targets and all(v in u0.outputs for v in values):
                for v in values:
                    position = spec.outputs[v.args[1]][1]
                    together = sorted(i for i, (_, p) in spec.outputs.items() if p == position)
                    if len(together) == 1:
                        name = targets[position] if position < len(targets) else None
                    else:  # one of a tuple the layer returns: `out, (h, c) = self.rnn(x)` names it h or c
                        inner = stmt.inner_targets[position] if position < len(stmt.inner_targets) else ()
                        k = together.index(v.args[1])
                        name = inner[k] if k < len(inner) else None
                    if name:
                        wanted[v] = name
            elif targets and len(targets) == len(values):
                wanted = dict(zip(values, targets))
            elif targets and (len(targets) == 1 or len(values) == 1) and targets[0]:
                wanted = {values[-1]: targets[0]}
            for u, vs in members:
                for v in vs:
                    if v in values:
                        self._claim(v, wanted.get(v) or self._fallback_name(u, v), self.flow.positions[u])

    def _needs_name(self, v) -> bool:
        if isinstance(v.meta.get("val"), (list, tuple)):
            return False  # a multi-output node: its getitems are named
        return True

    def _claim(self, v, base: str, pos):
        base = safe_name(base)
        name, k = base, 1
        while name in self.live and self.live[name] > pos or name in RESERVED:
            k += 1
            name = f"{base}{k}"
        self.names[v] = name
        self.live[name] = self.flow.last_use(v)

    def _fallback_name(self, u, v) -> str:
        if u.kind == "call":
            attr = u.frame.path.rsplit(".", 1)[-1]
            return attr if not attr.isdigit() else "h"
        name = cap._target_name(v)
        if name == "<built-in function getitem>" or name == "getitem":
            src_node = v.args[0]
            base = cap._target_name(src_node).split(".")[1] if "." in cap._target_name(src_node) else "item"
            return SHORT_NAMES.get(base, base) if base not in ("split", "chunk", "unbind") else "part"
        base = name.split(".")[1] if name.startswith("aten.") else v.name
        base = base.rstrip("_")
        return SHORT_NAMES.get(base, base)

    # ------------------------------------------------------------------ statements
    def _emit(self, u):
        self._emit_unit(u)
        # what is defined by now (dtype_reference looks only at these): the names are planned
        # ahead, so being named says nothing about being in scope yet
        self.defined.update(v for v in [*(u.outputs or ()), getattr(u, "node", None)] if v is not None)

    def _emit_unit(self, u):
        if u.kind == "update":
            value = self.value(u.node)
            # set_value, as the runtime's BatchNorm writes its statistics (runtime/layers.py says why)
            self.lines.append(f"{self.plan.attr_of_placeholder(self.path, u.target)}.set_value({value.text})")
            return
        if all(v in self.flow.inline for v in u.outputs) and u.outputs:
            return
        if u.kind == "call":
            expr = self._call_expr(u)
            self._bind(*u.outputs)
            spec = self.plan.specs.get(u.frame.path)
            if spec is not None and spec.core:  # LSTM / GRU: destructure (out, (h, c)) as torch returns it
                self.lines.append(f"{self._destructure(spec, u)} = {expr.text}")
                return
            names = [self.names.get(v, "_") for v in u.outputs]
            if not names or set(names) == {"_"}:
                self.lines.append(expr.text)
            elif len(names) == 1:
                self.lines.append(f"{names[0]} = {expr.text}")
            else:
                self.lines.append(f"{', '.join(names)} = {expr.text}")
            return
        node = u.node
        self._say_decomposed(u)
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            result = self._op_expr(node)
            if isinstance(result, Outputs):
                self.multi[node] = result
                return
            used = [g for g in node.users if g.users or self.flow.is_output(g)]
            if node in self.flow.inline or (len(used) == 1 and used[0] in self.flow.inline):
                self.exprs[node] = result
                return
            targets = ["_"] * len(val)
            for g in used:  # outputs read inline get names here: the op runs once, not once per read
                if isinstance(g.args[1], int) and g not in self.names:
                    self._claim(g, self._fallback_name(u, g), u.index)
                    self.live[self.names[g]] = math.inf
            for g in node.users:
                if isinstance(g.args[1], int) and g in self.names:
                    targets[g.args[1]] = self.names[g]
            self.lines.append(f"{', '.join(targets)} = {result.text}")
            for g in node.users:
                if g in self.names:
                    self.exprs[g] = Expr(self.names[g])
                    self._bind(g)
            return
        if node in self.exprs:  # a getitem already bound by a tuple statement
            return
        expr = self._output_of(node) or self._op_expr(node)
        self._bind(node)
        self.lines.append(f"{self.names[node]} = {expr.text}")

    def _say_decomposed(self, u):
        """A comment before the first statement computing (part of) an op the op table has no handler
        for, written as torch decomposes it (flaxport.translate.decompose)."""
        ops, todo, seen = [], [u.node], set()
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.meta.get("decomposed") and node.meta["decomposed"] not in ops:
                ops.append(node.meta["decomposed"])
            todo += [a for a in node.all_input_nodes if a in self.flow.inline and a not in self.names
                     and self.flow.producer.get(a) is not None and self.flow.producer[a].kind == "op"]
        for op in ops:
            if op not in self.decomposed:
                self.decomposed.add(op)
                self.comment(f"{op.removesuffix('.default')}, as torch decomposes it")

    def comment(self, text: str):
        """A comment line before the statement being rendered."""
        self.statement(f"# {text}")

    def statement(self, text: str):
        """A line of its own before the statement being rendered."""
        self.lines.append(text)

    def _bind(self, *values):
        for v in values:
            if v in self.names:
                self.holder[self.names[v]] = v

    def value_as(self, v, want) -> Expr:
        """value(v) in layout `want` (a transpose where v is kept in the other layout)."""
        from flaxport.translate import layout as lay

        e = self.value(v)
        have = self.plan.layout_of(self.capture, v)
        if have == want:
            return e
        perm = lay.TO_TORCH if want == lay.TORCH else lay.TO_LAST
        return Expr(f"{e.at(ATOM)}.transpose{perm}")

    def _destructure(self, spec, u) -> str:
        by_index = {v.args[1]: self.names[v] for v in u.outputs}
        top: dict = {}
        for index, (access, position) in sorted(spec.outputs.items()):
            top.setdefault(position, []).append(by_index.get(index, "_"))
        parts = []
        for position in sorted(top):
            names = top[position]
            if len(names) == 1:
                parts.append(names[0])
            else:
                parts.append("_" if all(n == "_" for n in names) else "(" + ", ".join(names) + ")")
        return ", ".join(parts)

    def value(self, v) -> Expr:
        """The expression for value v where it is used."""
        if v in self.names:
            return Expr(self.names[v])
        if v in self.exprs:
            return self.exprs[v]
        ph = self.capture.placeholders.get(v)
        if ph is not None:
            return self._placeholder(v, ph)
        if cap.is_sym(v):
            return self.sym(v)
        u = self.flow.producer.get(v)
        if u is None:
            raise RuntimeError(f"value {v.name} is not available in {self.frame.name or 'the top module'}")
        if u.kind == "call":
            return self._call_expr(u)
        part = self._output_of(v)
        if part is not None:
            return part
        expr = self._op_expr(v)
        self.exprs[v] = expr
        return expr

    def _output_of(self, v) -> Expr | None:
        """For v = getitem(op, i): the i-th output's expression where the op is one expression per
        output (Outputs) or one unnamed expression; None for anything else."""
        if cap._target_name(v) not in ("<built-in function getitem>", "getitem"):
            return None
        parent = v.args[0]
        if parent not in self.multi and parent not in self.exprs and parent not in self.names:
            rendered = self.value(parent)
            if isinstance(rendered, Outputs):
                self.multi[parent] = rendered
                self.exprs.pop(parent, None)
        if parent in self.multi:
            part = self.multi[parent][v.args[1]]
            if part is None or isinstance(part, Unsupported):  # an output the handler cannot compute
                self._unsupported(parent, str(part or "an output of this op"))
                return Expr(f"unsupported_{safe_name(cap._target_name(parent))}()")
            return part
        if parent in self.exprs:
            return Expr(f"{self.exprs[parent].at(ATOM)}[{v.args[1]}]")
        return None

    def _placeholder(self, v, ph) -> Expr:
        if ph.kind == "input":
            return Expr(self.names.get(v, f"input{ph.index}"))
        return Expr(f"{self.plan.attr_of_placeholder(self.path, self.plan.placeholder_name_from(self.capture, v, self.path))}[...]")

    def _unsupported(self, node, why) -> None:
        self.problems.append((str(node.target) + (f": {why}" if why else ""), self.frame.path, src.user_line(node)))

    def _call_expr(self, u) -> Expr:
        inputs, _ = self._io(u.frame)
        args = []
        saved, self.current_unit = self.current_unit, u
        for v in inputs:
            args.append(self.sym_expr(v).text if isinstance(v, str) else
                        self.value_as(v, self.plan.call_wanted(self.capture, u.frame, v)).text)
        self.current_unit = saved
        # constants this call differs in from the module's other calls (classes.render_bodies)
        args += [self.slot(value, name).text for value, name in
                 self.call_constants.values.get((self.capture.mode, u.frame.key), [])]
        if self.path and not u.frame.path.startswith(self.path + "."):
            # a module handed to this one as an argument (HF PP-DocLayout's decoder is given the
            # top module's `decoder_order_head`): it holds no attribute to reach it by
            self.problems.append((f"{type(u.frame.module).__name__} at {u.frame.path} called by "
                                  f"{self.path}, which does not hold it (a module passed as an argument)",
                                  self.path, ""))
            return Expr(f"unsupported_{safe_name(u.frame.path)}()")
        whole = self.plan.list_parameter(u.frame)
        if whole is not None:  # one list, as the source passes it
            args = [f"[{', '.join(args[:whole[1]])}]", *args[whole[1]:]]
        attr = self.plan.attr_expr(self.path, u.frame.path)
        spec = self.plan.specs.get(u.frame.path)
        if spec is not None and spec.marked:
            return Expr(f"{attr}({', '.join(self._as_called(u))})")
        if spec is not None and spec.state > 1 and len(args) == 1 + spec.state:  # given its state: as one tuple
            args = [args[0], self._whole_input(args[1:]) or f"({', '.join(args[1:])})"]
        return Expr(f"{attr}({', '.join(args)})")

    def _as_called(self, u) -> list:
        """The arguments of a tagged call (marks.py) as the user passed them: the forward's
        parameters without a default by position, the others by name where not at their default."""
        import inspect

        given, literals = dict(marks.arguments(u.frame)), marks.literals(u.frame)
        saved, self.current_unit = self.current_unit, u
        out = []
        for name, parameter in list(inspect.signature(type(u.frame.module).forward).parameters.items())[1:]:
            if name in given:
                wanted = self.plan.call_wanted(self.capture, u.frame, given[name])
                text = self.value_as(given[name], wanted).text
            elif name in literals and literals[name] != parameter.default:
                text = repr(literals[name])
            else:
                continue
            out.append(text if parameter.default is inspect.Parameter.empty else f"{name}={text}")
        self.current_unit = saved
        return out

    def _whole_input(self, items) -> str | None:
        """`state` where items are `state[0]`, `state[1]`, ... and that is the whole of the forward's
        tuple argument `state` (an LSTM given the (h, c) it was called with)."""
        if self.frame.parent is not None or not items or not items[0].endswith("[0]"):
            return None
        whole = items[0][:-3]
        held = [a for a in self.capture.input_access if a.startswith(whole + "[")]
        return whole if list(items) == [f"{whole}[{i}]" for i in range(len(items))] == held else None

    def _op_expr(self, node) -> Expr:
        saved = (self.current_op, self.sym_cache, self.current_unit)
        self.current_op, self.sym_cache = node, {}
        self.current_unit = self.flow.producer.get(node, self.current_unit)
        try:
            self._prepare_symbols(node)
            return self._op_expr_inner(node)
        finally:
            self.current_op, self.sym_cache, self.current_unit = saved

    def _prepare_symbols(self, node):
        """Resolve the sizes this op needs before its arguments are rendered (a resolution may
        need an argument to be a named statement of its own)."""
        import torch

        symbols = []

        def collect(v):
            if isinstance(v, (list, tuple)):
                for e in v:
                    collect(e)
            elif hasattr(v, "op") and cap.is_sym(v):
                symbols.extend(v.meta["val"].node.expr.free_symbols)
            elif isinstance(v, torch.SymInt):
                symbols.extend(v.node.expr.free_symbols)

        collect(list(node.args) + list(node.kwargs.values()))
        if str(node.target) in SHAPE_OPS:
            collect(list(getattr(node.meta.get("val"), "shape", ())))
            for a in node.all_input_nodes:
                collect(list(getattr(a.meta.get("val"), "shape", ()) or ()))
        for sym in dict.fromkeys(symbols):
            found = self._resolve_symbol(sym, ask_caller=False)
            if found is not None:  # else resolved where it is printed (perhaps never: a larger size holds it)
                self.sym_cache[str(sym)] = found

    def _op_expr_inner(self, node) -> Expr:
        handler = oplib.lookup(node)
        if handler is None:
            self._unsupported(node, None)
            return Expr(f"unsupported_{safe_name(cap._target_name(node))}()")
        ctx = OpContext(self, node)
        try:
            _sized_before_running(node)
            empty = _empty_result(ctx, node)
            out = empty if empty is not None else ctx.finish(handler(ctx, node))
        except Unsupported as e:
            self._unsupported(node, str(e))
            return Expr(f"unsupported_{safe_name(cap._target_name(node))}()")
        return out

    def _return(self, outputs) -> str:
        if self.frame.parent is None:
            return "return " + self.plan.root_structure(self.capture, lambda v: self.value_as(v, "torch").text)
        if not outputs:
            return "return None"
        texts = [self.value(v).text for v in outputs]
        return "return " + ", ".join(texts)

    # ------------------------------------------------------------------ sizes
    def sym(self, node) -> Expr:
        return self.sym_expr(node.meta["val"])

    def sym_expr(self, value) -> Expr:
        """A SymInt (or sympy expression, or a size name a call was given) rendered from the shapes
        in scope. A size this call cannot assemble from them is asked of its caller whole (`H`, not
        the image size it is computed from), so the caller passes what its own arrays hold."""
        import sympy

        if isinstance(value, str):
            expr = self.sizes_asked.expr(value)
        elif hasattr(value, "node"):
            expr = value.node.expr
        else:
            expr = value
        if isinstance(expr, (int, sympy.Integer)):
            return self.slot(int(expr), "size")  # a literal like any other: instances that agree share a class
        first = self._op_arguments()

        def held(e):  # a compound size (or part of one) an array in scope holds is read from its shape
            text = str(e)
            return self.size_params.get(text) or self.asked.get(text) or self._shape_holding(text, first) or \
                (self._read_at_entry(text) if self.frame.parent is not None else None)

        def here(sym):
            found = self.sym_cache.get(str(sym)) or self._resolve_symbol(sym, ask_caller=self.frame.parent is None)
            if found is None:
                raise _NotHere
            return found

        try:
            return print_size(expr, here, held)
        except _NotHere:
            name = self._ask_caller(expr)
            self.asked[str(expr)] = name
            return Expr(name)

    def _resolve_symbol(self, symbol, ask_caller: bool = True) -> str | None:
        """`v.shape[d]` for a named array in scope whose dim d is this size symbol: the current
        op's own arguments first, then the most recently computed arrays, then the inputs. An
        argument not yet named is given a name (a statement of its own) to be read from."""
        name = str(symbol)
        if name in self.size_params:
            return self.size_params[name]
        planned = self.flow.sym_source.get((self.current_unit.index, name)) if self.current_unit is not None else None
        if planned is not None and planned in self.names and self.holder.get(self.names[planned]) is planned:
            return f"{self.names[planned]}.shape[{self.flow.dim_of(planned, name)}]"
        first = self._op_arguments()
        held = self._shape_holding(name, first)
        if held is not None:
            return held
        for v in first:
            if v in self.flow.producer and v not in self.names and self.flow.dim_of(v, name) is not None and \
                    not isinstance(v.meta.get("val"), (list, tuple)):
                expr = self.value(v)
                self._claim(v, self._fallback_name(self.flow.producer[v], v), self.flow.producer[v].index)
                self.live[self.names[v]] = math.inf
                self.lines.append(f"{self.names[v]} = {expr.text}")
                self.exprs.pop(v, None)
                self._bind(v)
                return f"{self.names[v]}.shape[{self.flow.dim_of(v, name)}]"
        if self.frame.parent is not None:
            read = self._read_at_entry(name)
            if read is not None:
                return read
        return self._ask_caller(symbol) if ask_caller else None

    def _ask_caller(self, expr) -> str:
        return self.sizes_asked.ask(self.frame, expr, src.forward_parameters(type(self.frame.module)))

    def _read_at_entry(self, name) -> str | None:
        """A size one of the call's own inputs holds, read from it in a statement at the top of the
        body (where no input's name has been reused yet): `size = x.shape[2]`. The caller then
        passes only the arrays, so the class also fits an nnx.Sequential."""
        if name in self.entry_sizes:
            return self.entry_sizes[name]
        for v, param in self.entry:
            d = self.flow.dim_of(v, name)
            if d is None:
                continue
            self.entry_sizes[name] = self._at_entry("size", f"{param}.shape[{d}]")
            return self.entry_sizes[name]
        return None

    def _at_entry(self, base: str, text: str) -> str:
        """A new name (base, base2, ...) for `text`, assigned at the top of the body."""
        var, k = base, 1
        while var in self.live or var in RESERVED or var in self.names.values():
            k += 1
            var = f"{base}{k}"
        self.live[var] = math.inf
        self.lines.insert(0, f"{var} = {text}")
        return var

    def dtype_of(self, v) -> str | None:
        """`x.dtype` of value v where its name still holds it here; for an input whose name a later
        value took over, its dtype read at the top of the body (`x_dtype = x.dtype`)."""
        name = self.names.get(v)
        if name is not None and self.holder.get(name) is v:
            return f"{name}.dtype"
        param = next((p for e, p in self.entry if e is v), None)
        if param is None:
            return None
        if v not in self.entry_dtypes:
            self.entry_dtypes[v] = self._at_entry(f"{param}_dtype", f"{param}.dtype")
        return self.entry_dtypes[v]

    def _op_arguments(self) -> list:
        """The current op's array arguments, and the arrays inside the ones written inline."""
        op = self.current_op
        first, todo = [], [a for a in (op.all_input_nodes if op is not None else []) if not cap.is_sym(a)]
        while todo:
            a = todo.pop(0)
            if a in first:
                continue
            first.append(a)
            if a in self.flow.inline and a in self.flow.producer and a not in self.names:
                todo += [b for b in self.flow.used_by(self.flow.producer[a])
                         if not isinstance(b, str) and not cap.is_sym(b)]
        return first

    def _shape_holding(self, name, first) -> str | None:
        """`v.shape[d]` for a named array whose dim d is the size `name` (a symbol or an expression
        of them): the arrays `first`, then the most recently computed ones; None if none holds it."""
        for v in first + list(reversed(list(self.holder.values()))):
            if v in self.names and self.holder.get(self.names[v]) is v:
                found = self.flow.dim_of(v, name)
                if found is not None:
                    return f"{self.names[v]}.shape[{found}]"
        return None

    # ------------------------------------------------------------------ literals
    def slot(self, value, hint) -> Expr:
        if isinstance(value, bool):
            return Expr(repr(value))
        self.slots.append((value, hint))
        text = f"\x00{len(self.slots) - 1}\x00"
        negative = isinstance(value, (int, float)) and (value < 0 or (isinstance(value, float) and
                                                                       math.copysign(1, value) < 0))
        return Expr(text, oplib.UNARY if negative else ATOM)


def _empty_result(ctx, node):
    """An op whose every result is an empty array (a size 0 that export fixed): the zeros of that shape,
    whatever the op (JAX refuses some ops on empty arrays, such as a reshape to -1). Random ops still
    draw (their draws are counted)."""
    import torch

    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (list, tuple)) else [val]
    if not vals or not all(torch.is_tensor(v) and 0 in [ctx.static(s) for s in v.shape] for v in vals) or \
            torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return None
    zeros = [call("jnp.zeros", ctx.size(list(v.shape)), ctx.dtype(v.dtype)) for v in vals]
    return Outputs(tuple(zeros)) if isinstance(val, (list, tuple)) else zeros[0]


def _sized_before_running(node):
    """Refuse an op whose result's size depends on tensor values (a slice at `t.item()`, nonzero,
    masked_select): jit compiles for sizes known before the model runs."""
    import torch
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils import _pytree

    tensors = [v for v in _pytree.tree_leaves(node.meta.get("val")) if torch.is_tensor(v)]
    if any(free_unbacked_symbols(tuple(t.shape)) for t in tensors):
        raise Unsupported("its result's size depends on tensor values, which a jitted JAX function cannot have")


class _NotHere(Exception):
    """A size symbol no array of this call holds (sym_expr then asks the caller)."""
