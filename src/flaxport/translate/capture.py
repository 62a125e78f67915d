"""Capture a torch module's forward with torch.export and cut it into module calls.

`capture(module, args, kwargs, train=...)` exports a copy of the module (non-strict, the
training IR: high-level ATen ops such as conv2d, batch_norm, lstm), with every input
dimension marked `Dim.AUTO` so sizes that may vary (batch, sequence, image side) stay
symbols and the translation reads them from `x.shape`; where export specialises a
dimension (or refuses dynamic shapes) it is a literal. Then:

- in-place ops are made functional: `relu_` and `out += identity` become plain ops, a
  write into a slice (`y[:, 0] = 1`) becomes select_scatter / slice_scatter back into the
  base, and a write into a buffer (`num_batches_tracked.add_(1)`) is recorded as a
  buffer update;
- each node is assigned to the module call it ran in (`nn_module_stack`), giving a tree
  of `Frame`s: one per call of a submodule, in execution order, with the nodes and child
  calls inside it. A module called twice has two frames (`relu`, `relu@1`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import operator
import re
import time
import warnings

from flaxport.port.weights import set_torch_mode
from flaxport.translate.copies import BUFFERS, PARAMETERS, copy_as
from flaxport.translate import layers as layer_table
from flaxport.translate import marks
from flaxport.translate.decompose import decompose
from flaxport.translate.errors import ExportError, TranslateError
from flaxport.translate.regions import splice_regions

# Ops that only check or copy: dropped (their input stands for their output).
PASS_THROUGH = {"aten.contiguous.default", "aten.clone.default", "aten.lift_fresh_copy.default",
                "aten.alias.default", "aten.detach_.default", "aten._assert_tensor_metadata.default"}
ASSERTS = {"aten._assert_scalar.default", "aten.sym_constrain_range_for_size.default",
           "aten._assert_tensor_metadata.default", "aten.sym_constrain_range.default",
           "aten._assert_async.msg", "aten._assert_async.default"}
# View ops whose in-place writes can be scattered back into the base.
SCATTERABLE_VIEWS = {"aten.slice.Tensor", "aten.select.int"}
VIEW_OPS = SCATTERABLE_VIEWS | {"aten.view.default", "aten.reshape.default", "aten.transpose.int",
                                "aten.permute.default", "aten.unsqueeze.default", "aten.squeeze.dim",
                                "aten.squeeze.dims", "aten.squeeze.default", "aten.expand.default", "aten.t.default",
                                "aten.unflatten.int", "aten.flatten.using_ints", "aten.narrow.default",
                                "aten.diagonal.default", "aten.as_strided.default", "aten.unbind.int",
                                "aten.split.Tensor", "aten.chunk.default", "aten.split_with_sizes.default",
                                "aten.view_as.default", "aten.expand_as.default"}


@dataclasses.dataclass
class Frame:
    """One call of a module: the nodes that ran directly in it and the calls it made, in order."""

    key: str  # nn_module_stack key: unique per call ('L__self__layer1.0', '...relu@1')
    path: str  # module path, '' for the top module
    module: object  # the torch module (of the captured copy)
    parent: "Frame | None"
    call_index: int = 0  # this module's k-th call
    items: list = dataclasses.field(default_factory=list)  # fx nodes and child Frames, execution order

    @property
    def children(self):
        return [i for i in self.items if isinstance(i, Frame)]

    def all_nodes(self):
        """Nodes in this call and every call inside it, in execution order."""
        for item in self.items:
            if isinstance(item, Frame):
                yield from item.all_nodes()
            else:
                yield item

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    @property
    def name(self) -> str:
        """'layer1.0.conv1', '' for the top module; '@k' for repeated calls."""
        return self.path + (f"@{self.call_index}" if self.call_index else "")


@dataclasses.dataclass
class Placeholder:
    kind: str  # 'param', 'buffer', 'constant', 'input'
    target: str | None  # torch name: 'layer1.0.conv1.weight' (params, buffers), 'lifted_tensor_0', or None
    persistent: bool = True
    value: object = None  # the tensor (constants) or None
    index: int = 0  # user inputs: position among the user inputs


@dataclasses.dataclass
class Capture:
    """An exported forward, functional, cut into frames."""

    mode: str  # 'eval' or 'train'
    program: object  # torch.export.ExportedProgram
    graph: object  # its fx graph (rewritten in place: functional)
    root: Frame
    placeholders: dict  # fx node -> Placeholder
    user_inputs: list  # fx placeholder nodes of the tensor inputs, in order
    input_names: list  # the generated __call__'s parameters: forward arguments holding tensors
    input_access: list  # per user input, how to read it from those parameters ('x', 'batch[0]')
    outputs: list  # flat outputs: fx node, or a python constant
    out_spec: object  # torch.utils._pytree.TreeSpec of the forward's output
    buffer_updates: dict  # buffer target -> fx node holding its new value
    dynamic: object  # the axes exported with symbolic sizes: "all", "batch" (axis 0) or False
    module: object  # the module copy that was exported
    float_casts: dict = dataclasses.field(default_factory=dict)  # node_keys key -> dtype, casts that change it
    nodes_by_key: dict = dataclasses.field(default_factory=dict)  # node_keys key -> node (before dropping)
    export_seconds: float | None = None  # CPU seconds torch.export took

    def release_weights(self) -> None:
        """Drop the exported copy's parameters and buffers, keeping their shapes and dtypes (meta
        tensors) and its modules, whose types and attributes the frames read. The float64 capture
        holds the model twice over in a copy of its own; the proof casts a fresh one while it runs."""
        import torch

        for sub in self.module.modules():
            for name, p in sub._parameters.items():
                if p is not None:
                    sub._parameters[name] = torch.nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
            for name, b in sub._buffers.items():
                if b is not None:
                    sub._buffers[name] = b.to("meta")
        self.program.state_dict.clear()  # the same tensors, by name

    def node_frames(self) -> dict:
        """fx node -> the Frame it ran in."""
        out = {}
        for frame in self.root.walk():
            for item in frame.items:
                if not isinstance(item, Frame):
                    out[item] = frame
        return out


# --------------------------------------------------------------------------- export
@contextlib.contextmanager
def _quiet():
    """torch.export prints graphs and logs warnings (0/1 specialisation, guards) while it
    tries: the user gets translate's own one-line messages instead."""
    import logging

    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)  # its fake-tensor errors log at ERROR, with tracebacks
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


# CPU seconds torch.export may spend on symbolic sizes for every axis: window attention (DaViT,
# Swin, MaxViT, Hiera) makes its sympy reasoning grow without bound where the batch axis alone
# is quick, so past this the export keeps only the batch axis free. Where a static export of the
# same forward was timed, the budget is DYNAMIC_EXPORT_FACTOR times that (at least
# DYNAMIC_EXPORT_FLOOR): every axis free costs 1.5-4x a static export in the zoos where it ends
# (ResNet, ViT, ConvNeXt, BERT, Llama, T5), and Swin's is still going at 20x.
DYNAMIC_EXPORT_SECONDS = 60.0
DYNAMIC_EXPORT_FACTOR = 6.0
DYNAMIC_EXPORT_FLOOR = 10.0


def dynamic_budget(static_seconds: float | None) -> float:
    """CPU seconds for an export with every axis free, given a static export's (None: untimed)."""
    if static_seconds is None:
        return DYNAMIC_EXPORT_SECONDS
    return min(DYNAMIC_EXPORT_SECONDS, max(DYNAMIC_EXPORT_FLOOR, DYNAMIC_EXPORT_FACTOR * static_seconds))


def export_program(module, args, kwargs, *, dynamic="all", budget=DYNAMIC_EXPORT_SECONDS):
    """(ExportedProgram, which axes are free) of module(*args, **kwargs): "all" asks symbolic sizes
    for every axis, "batch" for axis 0 only (also where "all" fails or runs past `budget` CPU
    seconds), False (or where those fail) for none."""
    with _quiet():
        return _export_program(module, args, kwargs, dynamic=dynamic, budget=budget)


def _export_program(module, args, kwargs, *, dynamic="all", budget=DYNAMIC_EXPORT_SECONDS):
    import torch
    from torch.export import Dim, export

    tries = {"all": ["all", "batch"], "batch": ["batch"]}.get(dynamic, [])
    for axes in tries:
        shapes = _dynamic_shapes(module, args, kwargs, Dim.AUTO, axes)
        if shapes is None:
            break
        # copies: export marks the tensors it is given as dynamic, and a static export of marked
        # tensors after a failed dynamic one would fail the same way
        fresh_args, fresh_kwargs = torch.utils._pytree.tree_map_only(
            torch.Tensor, torch.Tensor.clone, (tuple(args), dict(kwargs)))
        try:
            with _cpu_time_limit(budget if axes == "all" else None):
                return export(module, fresh_args, fresh_kwargs, dynamic_shapes=shapes, strict=False), axes
        except Exception:  # noqa: BLE001 - some models only export with fewer symbolic sizes: try that next
            torch._dynamo.reset()
    try:
        return export(module, tuple(args), dict(kwargs), strict=False), False
    except Exception as e:  # noqa: BLE001
        raise ExportError(describe_export_error(e)) from e
    finally:
        torch._dynamo.reset()


class _OverTime(Exception):
    pass


@contextlib.contextmanager
def _cpu_time_limit(seconds):
    """Raise _OverTime inside the block once it has used `seconds` of CPU time (None, or off the
    main thread, where signals cannot reach: no limit)."""
    import signal
    import threading

    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def over(signum, frame):
        raise _OverTime(f"over {seconds:.0f} CPU seconds")

    previous = signal.signal(signal.SIGVTALRM, over)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def _dynamic_shapes(module, args, kwargs, auto, axes="all"):
    try:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
    except TypeError:
        return None
    shapes = {}
    for name, value in bound.arguments.items():
        kind = inspect.signature(module.forward).parameters[name].kind
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return None
        if hasattr(value, "ndim"):
            shapes[name] = {i: auto for i in range(value.ndim if axes == "all" else min(value.ndim, 1))}
        else:
            shapes[name] = None
    return shapes


def describe_export_error(e) -> str:
    """One line: what torch.export refused, where, and what to change."""
    text = str(e)
    where = _user_frame(text)
    if "data-dependent" in text or "GuardOnDataDependent" in type(e).__name__:
        return (f"{where}: forward branches on a tensor's value, which torch.export cannot capture; "
                "use torch.where or torch.cond, or decide the branch outside forward")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    return (f"torch.export could not capture the forward{' at ' + where if where else ''}: "
            f"{type(e).__name__}: {first[:200]} (rewrite that line with torch ops, or rerun with --debug)")


def _user_frame(text: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', text)
    frames = [f for f in frames if "/torch/" not in f[0]] or frames
    if not frames:
        return ""
    file, line, code = frames[-1]
    return f"{file}:{line} `{code.strip()}`"


# --------------------------------------------------------------------------- capture
def cast_floating(tree, dtype):
    """tree with its floating tensors, inside tuples, lists and dicts too (an LSTM's (h, c) state),
    cast to dtype (None: as it is)."""
    import torch

    if dtype is None:
        return tree
    return torch.utils._pytree.tree_map_only(torch.Tensor, lambda a: a.to(dtype) if a.is_floating_point() else a,
                                             tree)


def capture(module, args, kwargs=None, *, train: bool, dtype=None, dynamic="all", reference=None) -> Capture:
    """Export a deep copy of `module` in train or eval mode (cast to `dtype` with its float
    inputs when given) and return the functional, framed Capture. The module is untouched.

    reference: the float64 capture. A cast to the dtype a value already has computes nothing and
    is dropped, unless the reference casts there: `logits.to(torch.float32)` is a no-op in a
    float32 capture but pins float32 (a router's top-k, a position encoding) where the model runs
    in float64 or bfloat16, so it is kept, marked with the reference's dtype (Plan.dtype_reference)."""
    import torch

    kwargs = dict(kwargs or {})
    # the copy shares the weights (export reads them, never writes them): a copy per mode would
    # hold the model's size again each time; a copy to cast owns its own
    m = set_torch_mode(copy_as(module, dtype) if dtype is not None else copy_as(module, share=(PARAMETERS, BUFFERS)),
                       train)
    if train:
        for sub in m.modules():
            # BatchNorm(momentum=None) reads float(num_batches_tracked) in train mode, which export
            # cannot capture; its layer class takes momentum from the torch module, not the graph
            if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm) and sub.momentum is None:
                sub.momentum = 0.1
    if dtype is not None:
        args, kwargs = cast_floating((tuple(args), dict(kwargs)), dtype)
    started = time.process_time()
    with torch.no_grad(), marks.marking(m, layer_table.marks_calls):
        program, is_dynamic = export_program(m, args, kwargs, dynamic=dynamic,
                                             budget=dynamic_budget(reference and reference.export_seconds))
    export_seconds = time.process_time() - started
    if any(n.op == "call_function" and getattr(n.target, "__module__", "") == "torch._functorch.predispatch"
           for n in program.graph.nodes):
        # torch.vmap inside forward is captured as batch-dim markers around per-example ops; an
        # empty decomposition table applies torch's batching rules and keeps every other op as it is
        with torch.no_grad():
            program = program.run_decompositions({})
    graph = program.graph
    splice_regions(graph)
    placeholders, user_inputs = _placeholders(program)
    names, access = input_paths(m, args, kwargs, len(user_inputs))
    buffer_updates = functionalize(graph, placeholders)
    while decompose(graph, has_translation, keep=set(buffer_updates.values())):
        functionalize(graph, placeholders)  # decompositions write in place too (out.clamp_min_(0))
    buffer_updates.update(running_statistics(graph, placeholders, m))
    keys = node_keys(graph)
    for node, k in keys.items():
        node.meta[KEY] = k
    nodes_by_key = {k: node for node, k in keys.items()}
    float_casts = {k: node.meta["val"].dtype for node, k in keys.items()
                   if is_cast(node) and not _same_dtype_and_layout(node)}
    changing = reference.float_casts if reference is not None else {}
    twins = {node: reference.nodes_by_key.get(k) for node, k in keys.items()} if reference is not None else {}
    _drop_pass_through(graph, {node: changing[k] for node, k in keys.items() if k in changing}, twins)
    _eliminate_dead_code(graph, set(buffer_updates.values()))
    output = next(n for n in graph.nodes if n.op == "output")
    outputs = list(output.args[0])
    root = build_frames(graph, m)
    return Capture("train" if train else "eval", program, graph, root, placeholders, user_inputs, names, access, outputs,
                   program.call_spec.out_spec, buffer_updates, is_dynamic, m, float_casts, nodes_by_key,
                   export_seconds)


def _placeholders(program):
    sig = program.graph_signature
    by_name = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    out, inputs = {}, []
    for spec in sig.input_specs:
        node = by_name[spec.arg.name]
        kind = spec.kind.name
        if kind == "PARAMETER":
            out[node] = Placeholder("param", spec.target)
        elif kind == "BUFFER":
            out[node] = Placeholder("buffer", spec.target, bool(spec.persistent))
        elif kind in ("CONSTANT_TENSOR",):
            out[node] = Placeholder("constant", spec.target, False, program.constants[spec.target])
        elif kind == "USER_INPUT":
            val = node.meta.get("val")
            if not hasattr(val, "shape"):  # a Python value (use_cache=False): fixed at its example value
                if node.users:
                    raise TranslateError(f"input {node.name!r} is a {type(val).__name__} the forward computes with; "
                                         "pass tensors, or fix it inside a wrapper module")
                out[node] = Placeholder("literal", None, value=val)
                continue
            out[node] = Placeholder("input", None, index=len(inputs))
            inputs.append(node)
        else:
            raise TranslateError(f"torch.export gave an input of kind {kind} ({spec.arg.name}); "
                                 "custom objects and tokens cannot be translated")
    return out, inputs


def signature_arguments(module, args, kwargs):
    """[(name, value)] of the forward's arguments in signature order (keywords after the
    positional ones, in the order forward declares them, as torch.export reads them)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    out = [(positional[i].name if i < len(positional) else f"input{i}", a) for i, a in enumerate(args)]
    order = [p.name for p in params]
    out += sorted(kwargs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    return out


def input_paths(module, args, kwargs, count):
    """(the generated __call__'s parameter names, how each tensor input is read from them).

    Tensors nested in an argument (a tuple, a dict, a HF ModelOutput) are read by indexing:
    `outputs[0]`, `batch['pixels']`."""
    import torch
    from torch.utils import _pytree

    names, access = [], []
    for name, value in signature_arguments(module, args, kwargs):
        if hasattr(value, "to_tuple"):  # a HF ModelOutput arrives as the tuple the translation returns
            value = value.to_tuple()
        leaves = _pytree.tree_flatten_with_path(value)[0]
        tensors = [(path, leaf) for path, leaf in leaves if torch.is_tensor(leaf)]
        if not tensors:
            continue
        ident = _identifier(name)
        names.append(ident)
        for path, _ in tensors:
            access.append(ident + "".join(_key_text(k) for k in path))
    if len(access) != count:
        return [f"input{i}" for i in range(count)], [f"input{i}" for i in range(count)]
    return names, access


def _key_text(key) -> str:
    from torch.utils import _pytree

    if isinstance(key, _pytree.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, _pytree.MappingKey):
        return f"[{key.key!r}]"
    if isinstance(key, _pytree.GetAttrKey):
        return f".{key.name}"
    return str(key)


def _identifier(name: str) -> str:
    name = re.sub(r"\W", "_", name)
    return name if name and not name[0].isdigit() else "x_" + name


# --------------------------------------------------------------------------- functional rewrite
def _target_name(node) -> str:
    return str(node.target) if node.op == "call_function" else node.op


def _is_inplace(node) -> bool:
    if node.op != "call_function" or not hasattr(node.target, "_schema"):
        return False
    schema = node.target._schema
    return bool(schema.arguments) and schema.arguments[0].alias_info is not None and \
        schema.arguments[0].alias_info.is_write and not schema.name.endswith("_out")


def _functional_op(node):
    """The out-of-place ATen overload of an in-place node: add_.Tensor -> add.Tensor, and where
    the names differ the one taking the same arguments (normal_ -> normal_functional,
    bernoulli_.float -> bernoulli.p)."""
    import torch

    schema = node.target._schema
    base = schema.name.split("::")[1]
    name = base[:-1] if base.endswith("_") else base
    overload = node.target._overloadname
    packet = getattr(torch.ops.aten, name, None)
    if packet is not None and overload in packet.overloads():
        return getattr(packet, overload)
    wanted = _arguments(schema)
    for packet in (getattr(torch.ops.aten, n, None) for n in (name, name + "_functional")):
        for candidate in (getattr(packet, o) for o in (packet.overloads() if packet is not None else ())):
            if _arguments(candidate._schema) == wanted:
                return candidate
    return None


def _defaults_it_lacks(node, func) -> dict:
    """node's keyword arguments, plus those it leaves at a default that `func` has no default for:
    `x.bernoulli_(0.5)` reaches the graph as bernoulli_.float(x), p=0.5 being its default, and
    bernoulli.p takes p without one."""
    kwargs = dict(node.kwargs)
    required = {a.name for a in func._schema.arguments if not a.has_default_value()}
    for i, arg in enumerate(node.target._schema.arguments):
        if i >= len(node.args) and arg.name not in kwargs and arg.name in required and arg.has_default_value():
            kwargs[arg.name] = arg.default_value
    return kwargs


def _arguments(schema) -> tuple:
    """(name, type, keyword-only) of each argument: what an overload takes, aliasing aside."""
    return tuple((a.name, str(a.type), a.kwarg_only) for a in schema.arguments)


def functionalize(graph, placeholders) -> dict:
    """Rewrite in-place ops as functional ones (see module docstring); -> {buffer target: new node}."""
    import torch

    base_of = {}  # view node -> (its input, op) for views of other values
    replaced = {}  # mutated value -> the node that now holds its value
    buffer_updates = {}
    for node in list(graph.nodes):
        if node.op not in ("call_function", "output"):
            continue
        if replaced:  # the output too: a forward returns the tensor it wrote into (`new[..., :n] = x`)
            node.args = _substitute(node.args, replaced)
            node.kwargs = _substitute(node.kwargs, replaced)
        if node.op == "output":
            continue
        name = _target_name(node)
        if name in VIEW_OPS or name == "getitem" and _target_name(node.args[0]) in VIEW_OPS:
            base_of[node] = node.args[0]
        if not _is_inplace(node):
            continue
        target = node.args[0]
        func = _functional_op(node)
        if func is None:
            continue  # reported as an unsupported op later (with its name)
        with graph.inserting_after(node):
            new = graph.call_function(func, node.args, _defaults_it_lacks(node, func))
        new.meta = dict(node.meta)
        new.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        # Scatter back through a chain of slice/select views into the first non-view value.
        value, view = new, target
        while view in base_of and _target_name(view) in SCATTERABLE_VIEWS:
            base = base_of[view]
            with graph.inserting_after(value):
                if _target_name(view) == "aten.select.int":
                    scattered = graph.call_function(torch.ops.aten.select_scatter.default,
                                                    (base, value) + tuple(view.args[1:]))
                else:
                    scattered = graph.call_function(torch.ops.aten.slice_scatter.default,
                                                    (base, value) + tuple(view.args[1:]))
            scattered.meta = dict(new.meta)
            scattered.meta["val"] = base.meta.get("val")
            replaced[view] = value
            value, view = scattered, base
        if view in base_of and _later_uses(view, value, graph):
            raise TranslateError(
                f"an in-place write through a `{_target_name(view).split('.')[1]}` view ({_source(new)}) changes "
                "a tensor read later; write the result to a new tensor instead (torch.where, torch.cat, .clone())")
        replaced[view] = value
        if view in placeholders and placeholders[view].kind == "buffer":
            buffer_updates[placeholders[view].target] = value
    return buffer_updates


# Functional batch norms that update running statistics they are given, in place, in train mode.
RUNNING_STATISTICS = {"aten.batch_norm.default", "aten.native_batch_norm.default",
                      "aten._native_batch_norm_legit.default"}


def running_statistics(graph, placeholders, module) -> dict:
    """F.batch_norm(x, running_mean, running_var, training=True) in a module's own forward: the training IR
    hides its in-place update of the two buffers; -> {buffer target: node of its new value}
    (running = (1 - momentum) * running + momentum * batch statistic, the variance unbiased). Running
    statistics that are not the module's buffers (tensors the caller passes in) are left as they are:
    a JAX function returns new arrays, it does not write its arguments. A torch BatchNorm layer's
    own call is left to its layer class, which updates them itself."""
    import torch

    aten = torch.ops.aten
    updates = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or str(node.target) not in RUNNING_STATISTICS or _in_batch_norm_layer(node, module):
            continue
        x, running_mean, running_var, training, momentum = (node.args[0],) + tuple(node.args[3:7])
        if not training:
            continue
        ndim = x.meta["val"].ndim
        axes = [0] + list(range(2, ndim))
        for running, statistic in ((running_mean, aten.mean.dim), (running_var, aten.var.correction)):
            ph = placeholders.get(running)
            if ph is None or ph.kind != "buffer":
                continue
            with graph.inserting_after(node):
                kwargs = {"correction": 1} if statistic is aten.var.correction else {}
                batch = _call_like(graph, node, statistic, (x, axes), kwargs)
            with graph.inserting_after(batch):
                kept = _call_like(graph, node, aten.mul.Tensor, (running, 1 - momentum))
            with graph.inserting_after(kept):
                added = _call_like(graph, node, aten.mul.Tensor, (batch, momentum))
            with graph.inserting_after(added):
                updates[ph.target] = _call_like(graph, node, aten.add.Tensor, (kept, added))
    return updates


def _in_batch_norm_layer(node, module) -> bool:
    """Is `node` the call of a torch BatchNorm layer's own forward (not a subclass's)?"""
    from torch.nn.modules.batchnorm import _BatchNorm

    stack = list((node.meta.get("nn_module_stack") or {}).values())
    if not stack:
        return False
    try:
        layer = module.get_submodule(stack[-1][0])
    except AttributeError:
        return False
    return isinstance(layer, _BatchNorm) and type(layer).forward is _BatchNorm.forward


def _call_like(graph, like, target, args, kwargs=None):
    """A new call node with `like`'s source line and module path, its example value computed."""
    import torch
    import torch.fx
    from torch._guards import detect_fake_mode

    node = graph.call_function(target, tuple(args), kwargs or {})
    node.meta = {k: v for k, v in like.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")}
    values = torch.fx.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    with detect_fake_mode([like.args[0].meta["val"]]):
        node.meta["val"] = target(*values[0], **values[1])
    return node


def has_translation(node) -> bool:
    """Is the node translated as it is (a handler in the op table, or dropped or rendered by capture
    and body), rather than through torch's decomposition of it?"""
    import torch

    from flaxport.translate import ops

    if not isinstance(node.target, torch._ops.OpOverload) or _is_sym(node):
        return True
    name = str(node.target)
    return name in PASS_THROUGH or name in ASSERTS or _is_inplace(node) or ops.lookup(node) is not None


def _later_uses(view, after, graph) -> bool:
    seen = False
    for node in graph.nodes:
        if node is after:
            seen = True
        elif seen and view in node.all_input_nodes:
            return True
    return False


def _substitute(args, replaced):
    import torch.fx

    return torch.fx.node.map_arg(args, lambda n: _resolve(n, replaced))


def _resolve(node, replaced):
    while node in replaced:
        node = replaced[node]
    return node


KEY = "flaxport_key"  # node.meta entry holding the node's node_keys key


def node_keys(graph) -> dict:
    """{op node: (module path, op, source line, occurrence)}: the same key in another capture of
    the same forward (the other mode, float64), where node names shift with the ops only one has."""
    keys, seen = {}, {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        key = (_module_path(node), _target_name(node), _source(node))
        keys[node] = key + (seen.get(key, 0),)
        seen[key] = seen.get(key, 0) + 1
    return keys


def twin_key(node):
    """The key that finds node's twin in another capture of the same forward: its node_keys key
    (kept in its meta), the name for inputs, weights and buffers (the same in every capture)."""
    return node.meta.get(KEY, ("name", node.name))


def is_cast(node) -> bool:
    name = _target_name(node)
    return (name == "aten._to_copy.default" or name.startswith("aten.to.")) and bool(node.args)


def _drop_pass_through(graph, kept_casts: dict, twins: dict):
    """kept_casts: {cast node: the dtype the float64 capture casts to there} for casts kept even
    where they change no dtype here; twins: {node: the float64 capture's node of the same key}."""
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        name = _target_name(node)
        if name in ASSERTS and not node.users:
            graph.erase_node(node)
        elif name in PASS_THROUGH and node.args and hasattr(node.args[0], "op"):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif is_cast(node):
            if node in kept_casts:
                node.meta["float64_capture_dtype"] = kept_casts[node]
                if _same_dtype_and_layout(node):
                    _reads_of_the_input(node, twins)
            elif _same_dtype_and_layout(node):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
    for node in list(graph.nodes):  # sym nodes feeding only dropped asserts
        if node.op == "call_function" and not node.users and _is_sym(node):
            graph.erase_node(node)


def _module_path(node) -> str:
    """The path of the innermost module the node ran in ('' for the top module)."""
    stack = node.meta.get("nn_module_stack") or {}
    return next(reversed(stack.values()))[0] if stack else ""


def _reads_of_the_input(cast, twins: dict):
    """A cast to the dtype its input has returns the input itself in torch, so the export gives
    every later read of that tensor the cast's node (`x.float()` ... `.type_as(x)`, the residual
    `x + ...` around an RMSNorm). The float64 capture, where the cast makes a new tensor, says
    which reads are of the input: those get it back. A read with no twin there is taken to be of
    the input where it is outside the cast's module."""
    twin = twins.get(cast)
    home = _module_path(cast)
    for user in list(cast.users):
        other = twins.get(user)
        if twin is not None and other is not None:
            if twin not in other.all_input_nodes:
                user.replace_input_with(cast, cast.args[0])
            continue
        where = _module_path(user) if user.op != "output" else ""
        if home and where != home and not where.startswith(home + "."):
            user.replace_input_with(cast, cast.args[0])


def _eliminate_dead_code(graph, keep: set):
    """Remove ops nobody reads (export keeps some, e.g. from mask-building helpers); the new
    values of updated buffers are kept."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if node.op == "call_function" and not node.users and node not in keep:
                graph.erase_node(node)
                changed = True


def _same_dtype_and_layout(node) -> bool:
    src, out = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None, node.meta.get("val")
    return hasattr(src, "dtype") and hasattr(out, "dtype") and src.dtype == out.dtype


def _is_sym(node) -> bool:
    """Does the node compute a size (read from arrays' shapes where it is used)? `.item()` computes a
    number from an array's value: an op like any other."""
    import torch

    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)) and \
        str(node.target) not in ("aten.item.default", "aten._local_scalar_dense.default")


def _source(node) -> str:
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.*)', trace)
    user = [f for f in frames if "/torch/" not in f[0]] or frames
    if not user:
        return ""
    file, line, code = user[-1]
    return f"{file}:{line} `{code.strip()}`"


source_of = _source


# --------------------------------------------------------------------------- frames
def build_frames(graph, module) -> Frame:
    """The tree of module calls, from each node's nn_module_stack."""
    root = Frame("", "", module, None)
    frames = {"": root}
    calls: dict = {}
    modules = dict(module.named_modules(remove_duplicate=False))  # a shared module: called at each of its paths
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        stack = node.meta.get("nn_module_stack") or {}
        entries = [(k, v[0]) for k, v in stack.items() if v[0] in modules and k]
        if _is_sym(node) or not entries:
            if _is_sym(node) or not stack:
                continue  # sizes: rendered where they are used
        parent = root
        for key, path in entries:
            if path == "":
                continue  # the top module itself
            frame = frames.get(key)
            if frame is None:
                index = calls.get(path, 0)
                calls[path] = index + 1
                frame = Frame(key, path, modules[path], parent, index)
                frames[key] = frame
                parent.items.append(frame)
            parent = frame
        parent.items.append(node)
    return root


def sym_nodes(graph):
    return [n for n in graph.nodes if n.op == "call_function" and _is_sym(n)]


def is_sym(node) -> bool:
    return hasattr(node, "meta") and _is_sym(node)


OPERATORS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//",
             operator.mod: "%", operator.truediv: "/", operator.neg: "-", operator.pow: "**"}
