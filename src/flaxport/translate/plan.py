"""From captured frames to Flax NNX classes: which torch module becomes what, and how
instances of one torch class share one generated class.

Every torch module the forward uses becomes one of:
  layer       a runtime layer class (Conv2d, BatchNorm2d, LSTM, nnx.Dropout, ...)
  inline      a parameter-free torch module (ReLU, MaxPool2d, Flatten): its ops are
              written where it is called
  sequential  nn.Sequential called as a whole: nnx.Sequential
  container   nn.ModuleList / ModuleDict (or a Sequential indexed): nnx.List / nnx.Dict
  generated   anything else with a forward (user classes, nn.MultiheadAttention, HF
              modules): a generated class whose __call__ is the captured code

A generated class is rendered for every call in both captured modes (eval and train).
Where the two differ only in numbers, the number becomes `a if self.training else b`;
where statements differ, `if self.training:` blocks. Instances of one torch class whose
rendered code is the same share a class; the numbers that differ between them
(channels, strides) become constructor arguments, named after the torch module's own
attribute when one holds those values (`self.stride`), else after the argument they fill.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
from collections import Counter
from types import MappingProxyType

from flaxport.translate import arguments
from flaxport.translate import capture as cap
from flaxport.translate import layers as layer_table
from flaxport.translate import marks
from flaxport.translate import source as src
from flaxport.translate.naming import NNX_RESERVED, free_name, safe_name


@dataclasses.dataclass(frozen=True)
class ModeValue:
    """A number that differs between train and eval mode."""

    eval: object
    train: object

    def __repr__(self):
        return f"{self.train!r} if self.training else {self.eval!r}"


@dataclasses.dataclass
class Line:
    text: str  # with local slot markers \x00i\x00
    slots: tuple  # ((value, hint), ...)

    @property
    def key(self):
        return self.text


@dataclasses.dataclass
class Instance:
    path: str
    module: object
    init: list  # [Line]
    call: list  # [Line]
    params: list  # __call__ parameter names
    needs_training: bool
    cls: "ClassDef | None" = None
    args: tuple = ()  # constructor argument values for cls


MARK = re.compile("\x00(\\d+)\x00")  # a slot in a Line's text
# Schema names that say nothing of the value (div's `other`): any other hint is preferred.
VAGUE_HINTS = {"other", "self", "value", "arg", "scalar"}


def body_lines(body) -> list:
    """Body lines -> [Line] with slot markers numbered per line."""
    out = []
    for text in body.lines:
        slots = []

        def renumber(m):
            slots.append(body.slots[int(m.group(1))])
            return f"\x00{len(slots) - 1}\x00"

        out.append(Line(MARK.sub(renumber, text), tuple(slots)))
    return out


def hashable(v):
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    return v


@dataclasses.dataclass
class CallConstants:
    """What a module's calls differ in, passed as arguments: constants, or the argument its code
    branches on (calls.constants_calls_differ_in)."""

    params: dict = dataclasses.field(default_factory=dict)  # path -> the parameter names, in order
    positions: dict = dataclasses.field(default_factory=dict)  # (mode, path) -> {(line, slot): name}
    values: dict = dataclasses.field(default_factory=dict)  # (mode, frame key) -> [(value, name)]
    branches: dict = dataclasses.field(default_factory=dict)  # (mode, path) -> the argument calls branch on


@dataclasses.dataclass
class ClassDef:
    name: str
    torch_class: type
    instances: list
    params: list = dataclasses.field(default_factory=list)  # constructor parameter names
    positions: dict = dataclasses.field(default_factory=dict)  # (part, line, slot) -> param name or None
    base: str = "nnx.Module"


class Plan:
    def __init__(self, module, captures: dict, f64=None, layout: str = "nchw", example=((), {})):
        self.module = module
        self.example = example  # (args, kwargs) the module was captured with
        self.layout_mode = layout
        self.captures = captures  # mode -> Capture, the module's own mode first
        self.f64 = f64
        self.modules = dict(module.named_modules(remove_duplicate=False))
        self.shared = _shared_modules(self.modules)
        self.frames_by_path: dict = {}
        for mode, c in captures.items():
            for frame in c.root.walk():
                # a module torch shares is one class at each of its paths: each renders its calls
                for path in self.shared.get(frame.path, [frame.path]):
                    self.frames_by_path.setdefault(path, []).append((mode, frame))
        self.aliases = _aliases(module)  # tied weights: every name of one tensor
        self._io: dict = {}
        self._calls: dict = {}  # id(capture) -> _calls_by_home
        self._recorded = None  # arguments.recorded_calls, made when a name is first asked for
        self._eval_frames = {f.key: f for f in captures["eval"].root.walk()} if "eval" in captures else {}
        self.specs: dict = {}  # torch path -> the runtime layer's LayerSpec, for each "layer"
        self._const_names: dict = {}
        # twins (one op in other captures of the forward) by key: node names shift between modes
        self._by_key = {mode: {cap.twin_key(n): n for n in c.graph.nodes} for mode, c in captures.items()}
        self._f64_by_key = {cap.twin_key(n): n for n in f64.graph.nodes} if f64 is not None else {}
        # torch path -> what it becomes: layer, generated, sequential, container, inline, element, unused
        self.kinds = self._decide_kinds()
        self.layouts = {mode: {} for mode in captures}
        # Layout assignment sees every flatten as reading torch's layout; only once the layouts
        # are known can a flatten feeding a Linear be found and written channels-last.
        self.flattened, self.flat_weights = {}, {}
        if layout == "nhwc":
            self._assign_layouts()
        self._find_flattened_linears()
        # every lifted constant named now, after the module that first reads it: later stages only read the names
        for c in [*captures.values(), *([f64] if f64 is not None else [])]:
            for node, ph in c.placeholders.items():
                if ph.kind == "constant" and node.name not in self._const_names:
                    self._name_constant(c, node)

    # ------------------------------------------------------------------ kinds
    def _decide_kinds(self) -> MappingProxyType:
        from torch import nn

        read = set()  # modules whose parameters or buffers the graphs read directly
        for c in self.captures.values():
            for node, ph in c.placeholders.items():
                if ph.kind in ("param", "buffer") and node.users:
                    read.add(ph.target.rsplit(".", 1)[0] if "." in ph.target else "")
        self._read = read
        kinds = {}
        for path, m in self.modules.items():
            frames = [f for _, f in self.frames_by_path.get(path, [])]
            if path == "":
                kind = "generated"
            elif layer_table.is_inline(m):
                kind = "inline"
            elif isinstance(m, nn.Sequential) and frames and type(m).forward is nn.Sequential.forward:
                kind = "sequential"  # (a subclass with a forward of its own, DeepLab's ASPPPooling, is a class)
            elif isinstance(m, (nn.ModuleList, nn.ModuleDict, nn.Sequential)) and not (frames and _own_forward(m)):
                kind = "container"
            else:
                spec = layer_table.layer_spec(m, frames)
                if spec is not None:
                    self.specs[path] = spec
                    kind = "layer"
                else:
                    # a module the forward never calls whose variables it reads (through a method of
                    # the module: timm's rotary embedding `self.rope.get_embed()`) holds them: a class
                    # with only a constructor
                    kind = "generated" if frames or self.used(path) else "unused"
            kinds[path] = kind
        # inline modules inside a called Sequential are elements of it: rendered as functions
        for path, kind in list(kinds.items()):
            parent = path.rsplit(".", 1)[0] if "." in path else ""
            if path and kind == "inline" and kinds.get(parent) == "sequential":
                kinds[path] = "element"
        return MappingProxyType(kinds)

    def unseal_sequential(self, path) -> "Plan":
        """An nn.Sequential one of whose elements asks its caller for sizes (timm's MaxPool2dSame
        pads by amounts computed from the image size): nnx.Sequential passes one value along, so
        it becomes a class of its own that calls its elements in order, passing the sizes.
        -> the plan with that kind (rendering shows it; this plan is unchanged)"""
        kinds = dict(self.kinds, **{path: "generated"})
        for child, kind in self.kinds.items():
            if kind == "element" and child.rpartition(".")[0] == path:
                kinds[child] = "inline"
        return self._with_kinds(kinds)

    def element_as_class(self, path) -> "Plan":
        """An element of an nn.Sequential whose code is more than one expression (LocalResponseNorm)
        is a class of its own, not a function. -> the plan with that kind (this plan is unchanged)"""
        return self._with_kinds(dict(self.kinds, **{path: "generated"}))

    def _with_kinds(self, kinds: dict) -> "Plan":
        plan = copy.copy(self)
        plan.kinds = MappingProxyType(kinds)
        plan._io = {}  # a call's inputs and outputs follow its children's kinds
        return plan

    def kind(self, frame_or_path) -> str:
        path = frame_or_path if isinstance(frame_or_path, str) else frame_or_path.path
        kind = self.kinds.get(path, "generated")
        return "call" if kind == "element" and not isinstance(frame_or_path, str) else kind

    def used(self, path) -> bool:
        """Does the forward use this module (or something inside it, or its parameters)?"""
        prefix = path + "." if path else ""
        return any(p == path or p.startswith(prefix) for p in list(self.frames_by_path) + list(self._read))

    def constructed(self, path) -> bool:
        """Does the translated model hold the module at path as an attribute?"""
        kind = self.kinds.get(path)
        return kind == "layer" or kind not in ("inline", "element", "unused") and self.used(path)

    def held(self, path) -> bool:
        """Does the translated model hold the module at path's variables? Its own kind says so, and
        none of the modules above it is one the forward never calls (a vision tower of a
        multimodal model given only text: its weights are left out, as unused)."""
        parents = [path.rsplit(".", k)[0] for k in range(1, path.count(".") + 1)]
        return (self.used(path) or self.kinds.get(path) == "layer") and all(self.used(p) for p in parents)

    def ties(self) -> list:
        """[(alias, home)] attribute expressions from the top module: torch shares one module or one
        tensor between these paths (CoaT's crpe1, an LM head tied to its embedding), so the
        translation holds one object there too and training updates them as one. The top-most
        share only: a shared module carries everything inside it."""
        out, tied = [], set()

        def under_tied(path):
            return any(path == t or path.startswith(t + ".") for t in tied)

        def built_in_file(path):  # it and every module above it: a layer inside a module left out is not
            parts = path.split(".")
            return all(self.constructed(".".join(parts[:k])) for k in range(1, len(parts) + 1))

        groups = {tuple(g) for g in self.shared.values() if _holds_variables(self.modules[g[0]])}
        for paths in sorted(groups, key=lambda g: (g[0].count("."), g)):
            built = [p for p in paths if built_in_file(p)]
            for path in built[1:]:
                if not under_tied(path):
                    out.append((self.attr_expr("", path), self.attr_expr("", built[0])))
                    tied.add(path)
        for names in sorted({tuple(g) for g in self.aliases.values()}):
            owners = [n.rpartition(".") for n in names]
            built = [(o, a) for o, _, a in owners if built_in_file(o) and not self.shared.get(o)]
            for owner, attr in built[1:]:
                if not under_tied(owner):
                    home = built[0]
                    out.append((self.attr_of_placeholder("", f"{owner}.{attr}"),
                                self.attr_of_placeholder("", f"{home[0]}.{home[1]}")))
        return out

    # ------------------------------------------------------------------ layouts (--layout nhwc)
    def _assign_layouts(self):
        from flaxport.translate import layout as lay

        for mode, c in self.captures.items():
            forced: set = set()
            for _ in range(8):
                self.layouts[mode] = lay.assign(c, frozenset(forced))
                blocked = self._sequential_conflicts(c)
                if not blocked - forced:
                    break
                forced |= blocked

    def _find_flattened_linears(self):
        """self.flattened {mode: {flatten node: weight name}} and self.flat_weights {weight name:
        (C, H, W)}: the linears that read a channels-last flatten (layout.flattened_linears), in
        every captured mode alike or in none."""
        from flaxport.translate import layout as lay

        found = {mode: lay.flattened_linears(c, self.layouts[mode] if self.layout_mode == "nhwc" else lay.assign(c))
                 for mode, c in self.captures.items()}
        weights = [{w: chw for w, chw in f.values()} for f in found.values()]
        common = {w: chw for w, chw in weights[0].items()
                  if all(other.get(w) == chw for other in weights[1:]) and not self.aliases.get(w)}
        self.flat_weights = common
        self.flattened = {mode: {n: w for n, (w, _) in f.items() if w in common} for mode, f in found.items()}

    def flattens_channels_last(self, capture, node) -> bool:
        """Is `node` a flatten written channels-last for the linear reading it?"""
        return node in self.flattened.get(capture.mode, {})

    def _sequential_conflicts(self, capture) -> set:
        """Native nodes of layers inside nn.Sequential that would receive the other layout from the
        element before them (nnx.Sequential passes values on as they are)."""
        out = set()
        for frame in capture.root.walk():
            if self.kinds.get(frame.path) != "sequential":
                continue
            children = frame.children
            for prev, cur in zip(children, children[1:]):
                arrive = [self.layout_of(capture, v) for v in self.io(prev)[1]]
                for v in self.io(cur)[0]:
                    if isinstance(v, str):
                        continue
                    want = self.call_wanted(capture, cur, v)
                    if arrive and want != arrive[0]:
                        out |= self._native_nodes(cur)
        return out

    def _native_nodes(self, frame) -> set:
        from flaxport.translate import layout as lay

        return {n for n in frame.all_nodes() if str(n.target) in lay.NATIVE}

    def layout_of(self, capture, node) -> str:
        from flaxport.translate import layout as lay

        return self.layouts.get(capture.mode, {}).get(node, lay.TORCH) if capture.mode in self.layouts else lay.TORCH

    def layout_by_name(self, name: str) -> str:
        from flaxport.translate import layout as lay

        for mode, layouts in self.layouts.items():
            for node, value in layouts.items():
                if node.name == name:
                    return value
        return lay.TORCH

    def wanted(self, capture, node, arg) -> str:
        from flaxport.translate import layout as lay

        if self.layouts.get(capture.mode) and self.flattens_channels_last(capture, node):
            return self.layout_of(capture, arg)
        if not self.layouts.get(capture.mode):
            return lay.TORCH
        return lay.wanted(node, arg, self.layouts[capture.mode])

    def call_wanted(self, capture, frame, arg) -> str:
        """The layout a call of `frame` takes `arg` in: a layer reads it as its first op that uses it
        does; an nn.Sequential as its first element does; a generated class as it comes."""
        from flaxport.translate import layout as lay

        if not self.layouts.get(capture.mode):
            return lay.TORCH
        kind = self.kinds.get(frame.path)
        if kind == "layer":
            user = next((n for n in frame.all_nodes() if arg in n.all_input_nodes), None)
            return self.wanted(capture, user, arg) if user is not None else lay.TORCH
        if kind == "sequential" and frame.children:
            return self.call_wanted(capture, frame.children[0], arg)
        return self.layout_of(capture, arg)

    def layer_channels_last(self, path) -> bool:
        from flaxport.translate import layout as lay

        for mode, frame in self.frames_by_path.get(path, []):
            for node in self._native_nodes(frame):
                if self.layouts.get(mode, {}).get(node) == lay.LAST:
                    return True
        return False

    # ------------------------------------------------------------------ inputs and outputs
    def io(self, frame):
        """(inputs, outputs) of a frame: values from outside it (and size symbols, as str) it
        reads, and values it computes that are read outside it."""
        key = id(frame)
        if key in self._io:
            inputs, outputs = self._io[key]
            return list(inputs), outputs
        capture = self._capture_of(frame)
        if frame.parent is None:
            outputs = [o for o in capture.outputs if hasattr(o, "op")]
            self._io[key] = (list(capture.user_inputs), list(dict.fromkeys(outputs)))
            return self.io(frame)
        inputs, outputs, sizes = self._reads_and_results(frame, capture)
        outputs = self._results_of_every_call(frame, capture, outputs)
        if self.f64 is not None and capture is self.f64:
            outputs = self._in_translation_order(frame, outputs)
        spec = self.specs.get(frame.path)
        if spec is not None and spec.marked:  # what the call was given, in the forward's order
            inputs = list(dict.fromkeys(value for _, value in marks.arguments(frame)))
        elif spec is not None and spec.core:
            inputs = self._layer_inputs(frame, spec, inputs)
        else:
            inputs += self._sizes_passed_in(frame, inputs, sizes)
        self._io[key] = (inputs, outputs)
        return self.io(frame)

    def _reads_and_results(self, frame, capture):
        """(inputs, outputs, sizes) of one call: what it reads from outside, what is read of it
        outside, and the sizes its own code reads."""
        inside = set(frame.all_nodes())
        inputs, outputs, sizes = [], [], []
        own = set(self._own_nodes(frame))  # sizes a child's own code reads are its to ask for
        graph_outputs = set(o for o in capture.outputs if hasattr(o, "op"))
        for node in frame.all_nodes():
            for a in node.all_input_nodes:
                if a in inside or a in inputs:
                    continue
                if cap.is_sym(a):
                    if a not in sizes and node in own:
                        sizes.append(a)
                    continue
                ph = capture.placeholders.get(a)
                if ph is not None and ph.kind != "input" and self._owned(frame.path, capture, a):
                    continue
                inputs.append(a)
            # a size read from it outside (sym_size) is not: sizes are written from the shapes in scope
            if any(u not in inside and not cap.is_sym(u) for u in node.users) or node in graph_outputs:
                if not (cap.is_sym(node)):
                    outputs.append(node)
        return inputs, outputs, sizes

    def _results_of_every_call(self, frame, capture, outputs) -> list:
        """What every call of the module returns: each call's callers may read less of it (RAFT's
        update block returns the hidden state and the flow; after the last iteration only the flow
        is read), and one class has one `return`. Calls are matched op by op; a call whose ops
        differ is left to disagree (and is refused as such)."""
        home = self.shared.get(frame.path, [frame.path])[0]
        calls = self._calls_by_home(capture).get(home, [])
        if len(calls) < 2:
            return outputs
        mine = list(frame.all_nodes())
        wanted = {mine.index(n) for n in outputs}
        for other in calls:
            theirs = list(other.all_nodes())
            if other is frame or [n.target for n in theirs] != [n.target for n in mine]:
                continue
            wanted |= {theirs.index(n) for n in self._reads_and_results(other, capture)[1]}
        return [mine[i] for i in sorted(wanted)]

    def _calls_by_home(self, capture) -> dict:
        """{first path of a module: its calls in capture}, cached per capture."""
        found = self._calls.get(id(capture))
        if found is None:
            found = {}
            for f in capture.root.walk():
                if f.parent is not None:
                    found.setdefault(self.shared.get(f.path, [f.path])[0], []).append(f)
            self._calls[id(capture)] = found
        return found

    def _in_translation_order(self, frame, outputs) -> list:
        """A float64 call's outputs in the order the translation returns them (its eval-mode twin's):
        a cast made only in float64 (`return cos.to(x.dtype), sin.to(x.dtype)` after computing sin
        first) puts them in another order than the graph of the float32 capture."""
        want, keys = self._twin_keys(frame, outputs)
        return [outputs[keys.index(w)] for w in want] if want and Counter(keys) == Counter(want) else outputs

    def translation_positions(self, frame) -> list:
        """For each of io(frame)'s outputs, its index among the values the translated call returns
        (None: the translation does not return it). They differ where the float64 capture shares
        fewer values: in float32 HF Funnel's `attention_mask.type_as(x)` is the mask itself, which
        the decoder then reads from the encoder, so the translated encoder returns it as well;
        in float64 the cast is a new value and the decoder casts its own."""
        outputs = self.io(frame)[1]
        want, keys = self._twin_keys(frame, outputs)
        if not want:
            return list(range(len(outputs)))
        return [want.index(k) if k in want else None for k in keys]

    def _twin_keys(self, frame, outputs):
        """(keys of the eval-mode twin's outputs, or [] without a float64 twin; keys of `outputs`),
        a cast made only in float64 keyed as the value it casts."""
        in_float64 = self.f64 is not None and self._capture_of(frame) is self.f64
        twin = self._eval_frames.get(frame.key) if in_float64 else None
        if twin is None:
            return [], []
        want = [cap.twin_key(n) for n in self.io(twin)[1]]

        def key(node):
            if cap.twin_key(node) not in want and cap.is_cast(node) and hasattr(node.args[0], "meta"):
                return cap.twin_key(node.args[0])
            return cap.twin_key(node)

        return want, [key(n) for n in outputs]

    def _own_nodes(self, frame):
        """The nodes this call's own body renders: its own, and those of the parameter-free
        modules it calls (written inline)."""
        for item in frame.items:
            if isinstance(item, cap.Frame):
                if self.kinds.get(item.path) in ("inline", "element"):
                    yield from self._own_nodes(item)
            else:
                yield item

    def _sizes_passed_in(self, frame, arrays, sizes) -> list:
        """The sizes a call is given (forward(x, H, W) called with sizes its caller computed): read
        by the forward's own parameters (not sizes torch.export computes once for the whole graph)
        and not held by its array inputs' dims, nor sums and products of them. They become
        parameters of their own, in the forward's order (`pos(B, H, W)`), so the caller passes
        what it holds (`x.shape[2]`)."""
        cls = type(frame.module)
        params, file = src.forward_parameters(cls), src.class_file(cls)
        taken = [_reading_parameter(frame, v, params, file, [], arrays) for v in arrays]
        passed = {}
        for size in _not_held(arrays, sizes):
            param = _reading_parameter(frame, size, params, file, taken + list(passed.values()), arrays)
            if param is not None:
                passed[size] = param
        return sorted(passed, key=lambda size: params.index(passed[size]))

    def _layer_inputs(self, frame, spec, inputs):
        core = next(n for n in frame.all_nodes() if str(n.target) == spec.core)
        x = core.args[0]
        hx = [h for h in core.args[1] if h in inputs] if len(core.args) > 1 and isinstance(core.args[1], (list, tuple)) \
            else ([core.args[1]] if len(core.args) > 1 and core.args[1] in inputs else [])
        return [x] + hx

    def _capture_of(self, frame):
        root = frame
        while root.parent is not None:
            root = root.parent
        for c in self.captures.values():
            if c.root is root:
                return c
        if self.f64 is not None and self.f64.root is root:
            return self.f64
        raise KeyError(frame.key)

    def _owned(self, path, capture, node) -> bool:
        ph = capture.placeholders[node]
        names = self.aliases.get(ph.target, [ph.target]) if ph.kind in ("param", "buffer") else [None]
        for name in names:
            owner = self.placeholder_owner(capture, node) if name is None else \
                (name.rsplit(".", 1)[0] if "." in name else "")
            if owner == path or not path or owner.startswith(path + "."):
                return True
        return False

    def placeholder_name_from(self, capture, node, path: str) -> str:
        """placeholder_name, choosing among tied names the one inside the module at `path`."""
        ph = capture.placeholders[node]
        if ph.kind in ("param", "buffer"):
            for name in self.aliases.get(ph.target, [ph.target]):
                owner = name.rsplit(".", 1)[0] if "." in name else ""
                if not path or owner == path or owner.startswith(path + "."):
                    return name
        return self.placeholder_name(capture, node)

    def param_names(self, frame) -> list:
        """The names of the arrays (and sizes) a call is given, as its `__call__`'s parameters; the
        sizes it asks its caller for (sizes.SizesAsked) follow them."""
        capture = self._capture_of(frame)
        inputs, _ = self.io(frame)
        if frame.parent is None:
            return list(capture.input_access)
        tensors = [v for v in inputs if not isinstance(v, str)]
        whole = self.list_parameter(frame)
        if whole is not None:  # read as `prev_features[i]`, the list itself the parameter
            return [f"{whole[0]}[{i}]" for i in range(whole[1])]
        return self._guess_param_names(frame, tensors)

    def list_parameter(self, frame) -> tuple[str, int] | None:
        """(parameter, length) where the call was given one list of tensors and reads all of it
        (arguments.sequence_of: DenseNet's layer), else None."""
        if frame.parent is None:
            return None
        tensors = [v for v in self.io(frame)[0] if not isinstance(v, str)]
        call = self._recorded_call(frame)
        whole = arguments.sequence_of(tensors, call) if call is not None else None
        return None if whole is None else (safe_name(whole), len(tensors))

    def _guess_param_names(self, frame, inputs) -> list:
        """The forward's own parameter names: the argument the call was given each input as, where
        the eager run tells (arguments.py), else the source line that first reads it."""
        cls = type(frame.module)
        params = src.forward_parameters(cls)
        file = src.class_file(cls)
        call = self._recorded_call(frame)
        names = []
        for v in inputs:
            name = arguments.parameter_of(v, call, names) if call else None
            names.append(name if name in params else _reading_parameter(frame, v, params, file, names, inputs))
        out = []
        for i, name in enumerate(names):
            if name is None:
                name = next((p for p in params if p not in names and p not in out), None) or ("x" if i == 0 else f"x{i}")
            out.append(safe_name(name))
        return out

    def recorded_calls(self, path) -> list:
        """[arguments.Call] of the module at path, from the eager run made when first asked for."""
        if self._recorded is None:
            self._recorded = arguments.recorded_calls(self.module, self.example)
        return self._recorded.get(path, [])

    def _recorded_call(self, frame):
        """The eager run's record of this call (arguments.Call), None where the run's calls of the
        module do not line up with the first capture's (or torch reaches it by several paths)."""
        if frame.path in self.shared:
            return None
        calls = self.recorded_calls(frame.path)
        first = next(iter(self.captures))
        captured = [f for m, f in self.frames_by_path.get(frame.path, []) if m == first]
        return calls[frame.call_index] if len(calls) == len(captured) and frame.call_index < len(calls) else None

    # ------------------------------------------------------------------ state
    def placeholder_name(self, capture, node) -> str:
        """The torch name of a param / buffer, or '<module path>.<attr>' given to a constant."""
        ph = capture.placeholders[node]
        if ph.kind in ("param", "buffer"):
            return ph.target
        return self._const_names[node.name]

    def placeholder_owner(self, capture, node) -> str:
        ph = capture.placeholders[node]
        if ph.kind == "constant":
            return self._const_names[node.name].rsplit(".", 1)[0] if "." in self._const_names[node.name] else ""
        return ph.target.rsplit(".", 1)[0] if "." in ph.target else ""

    def _name_constant(self, capture, node):
        frames = capture.node_frames()
        users = list(node.users)
        frame = frames.get(users[0]) if users else capture.root
        while frame is not None and self.kinds.get(frame.path) in ("inline", "element", "layer"):
            frame = frame.parent
        path = frame.path if frame is not None else ""
        stmt = src.statement(users[0], src.class_file(type(self.modules[path]))) if users else None
        base = safe_name(stmt.targets[0]) if stmt and stmt.targets and stmt.targets[0] else "constant"
        taken = {n.rsplit(".", 1)[-1] for n in self._const_names.values() if n.rsplit(".", 1)[0] == path}
        name = free_name(base, taken | self.attribute_names(path))
        self._const_names[node.name] = f"{path}.{name}" if path else name

    def attribute_names(self, path) -> set:
        """The names the torch module at path uses: its children, parameters and buffers."""
        m = self.modules[path]
        return {n for n, _ in m.named_children()} | {n for n, _ in m.named_parameters(recurse=False)} | \
            {n for n, _ in m.named_buffers(recurse=False)}

    def constants(self, capture) -> dict:
        """'<path>.<attr>' -> tensor for every lifted constant of a capture."""
        return {self._const_names[node.name]: ph.value for node, ph in capture.placeholders.items()
                if ph.kind == "constant"}

    def owns_update(self, frame, target) -> bool:
        owner = target.rsplit(".", 1)[0] if "." in target else ""
        return owner == frame.path

    # ------------------------------------------------------------------ attribute access
    def attr_name(self, name: str) -> str:
        name = safe_name(name)
        return name + "_" if name in NNX_RESERVED else name

    def attr_expr(self, from_path: str, to_path: str) -> str:
        """`self.layer1[0].conv1` from the module at from_path to the module at to_path."""
        rel = to_path[len(from_path) + 1:] if from_path else to_path
        text, cur = "self", from_path
        for part in rel.split(".") if rel else []:
            kind = self.kinds.get(cur)
            parent = self.modules[cur]
            if kind == "sequential":
                text += f".layers[{_position(parent, part)}]"
            elif kind == "container":
                text += f"[{part!r}]" if keyed(parent) else f"[{part}]"
            else:
                text += f".{self.attr_name(part)}"
            cur = f"{cur}.{part}" if cur else part
        return text

    def attr_of_placeholder(self, from_path: str, target: str) -> str:
        owner, _, attr = target.rpartition(".")
        return f"{self.attr_expr(from_path, owner)}.{self.attr_name(attr)}"

    def nnx_path(self, torch_path: str) -> tuple:
        """The NNX state path of a torch module path ('layer1.0.conv1' -> ('layer1', 'layers', 0, 'conv1'))."""
        out, cur = [], ""
        for part in torch_path.split(".") if torch_path else []:
            kind = self.kinds.get(cur)
            if kind == "sequential":
                out += ["layers", _position(self.modules[cur], part)]
            elif kind == "container":
                out.append(part if keyed(self.modules[cur]) else int(part))
            else:
                out.append(self.attr_name(part))
            cur = f"{cur}.{part}" if cur else part
        return tuple(out)

    # ------------------------------------------------------------------ twins (other captures)
    def twin(self, capture, node):
        """The same op in the other mode's capture (None if it has none)."""
        for mode, by_key in self._by_key.items():
            if mode == capture.mode:
                continue
            other = by_key.get(cap.twin_key(node))
            if other is not None and other.target == node.target:
                return other
        return None

    def dtype_reference(self, body, node) -> str | None:
        """`x.dtype` for a float cast that follows the compute dtype (float32 here, float64 in
        the float64 capture), with x a named float value in scope that follows it too."""
        if self.f64 is None:
            return None
        # the float64 capture is of eval mode: another mode's nodes have twins there by name only
        # where the names have not shifted with the ops only that mode has
        same_mode = body.capture.mode == self.f64.mode
        val = node.meta.get("val")
        if "float64_capture_dtype" in node.meta:  # a cast the float64 capture has too (capture.node_keys)
            twin_dtype = node.meta["float64_capture_dtype"]
        else:
            twin_dtype = self._float64_dtype(body.capture, node)
        if twin_dtype is None:
            # dropped from the float64 capture as a cast to the dtype it already had: it follows
            import torch

            twin_dtype = torch.float64 if str(getattr(val, "dtype", "")) == "torch.float32" else None
        if twin_dtype is None or not hasattr(val, "dtype") or str(twin_dtype) == str(val.dtype):
            return None
        # in another mode than the float64 capture's, names shift and a value's float64 dtype is a
        # guess: the call's inputs first (they follow the model), then its weights, then the rest
        inputs, others = [], []
        for v in list(body.inputs) + [v for v in body.names if v in body.defined]:  # in scope here
            if isinstance(v, str) or v not in body.names:
                continue
            vv = v.meta.get("val")
            if not hasattr(vv, "dtype") or str(vv.dtype) != str(val.dtype):
                continue
            if not same_mode:
                (inputs if v in body.inputs else others).append(v)
                continue
            t = self._f64_by_key.get(cap.twin_key(v))
            if t is not None and str(t.meta.get("val").dtype) == str(twin_dtype):
                ref = body.dtype_of(v)
                if ref is not None:
                    return ref
        weight = self._float_parameter(body.frame.path)
        refs = itertools.chain((body.dtype_of(v) for v in inputs), [weight and f"{weight}.dtype"],
                               (body.dtype_of(v) for v in others))  # lazily: dtype_of may write a line
        return next((ref for ref in refs if ref is not None), None)

    def _float64_dtype(self, capture, node):
        """The dtype node has in the float64 capture, or None."""
        t = self._f64_by_key.get(cap.twin_key(node))
        return getattr(t.meta.get("val"), "dtype", None) if t is not None else None

    def _float_parameter(self, path) -> str | None:
        """`self.proj.weight`: a floating parameter the module at path holds, itself or in a child
        the translation constructs."""
        for name, p in self.modules[path].named_parameters():
            owner = name.rpartition(".")[0]
            if p.is_floating_point() and self.held(".".join(filter(None, [path, owner]))):
                return self.attr_of_placeholder(path, f"{path}.{name}" if path else name)
        return None

    # ------------------------------------------------------------------ root outputs
    def root_structure(self, capture, render) -> str:
        """The forward's output structure (tuple, list, dict; a HF ModelOutput as a tuple)."""
        leaves = iter(capture.outputs)

        def go(spec):
            if spec.is_leaf():
                leaf = next(leaves)
                return render(leaf) if hasattr(leaf, "op") else repr(leaf)
            parts = [go(child) for child in spec.children()]
            if spec.type is dict:
                return "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(spec.context, parts)) + "}"
            if spec.type is list:
                return "[" + ", ".join(parts) + "]"
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

        return go(capture.out_spec)


def _shared_modules(modules: dict) -> dict:
    """{path: [every path of the same module]} for the modules torch reaches by more than one path
    (timm CoaT's crpe1, handed to each block as `shared_crpe`; its ParallelBlock's mlp2 = mlp3 = mlp4)."""
    groups: dict = {}
    for path, m in modules.items():
        groups.setdefault(id(m), []).append(path)
    return {path: paths for paths in groups.values() if len(paths) > 1 for path in paths}


def _holds_variables(module) -> bool:
    return any(True for _ in module.parameters()) or any(b is not None for b in module.buffers())


def _aliases(module) -> dict:
    """{name: [every name of the same tensor]} for parameters and buffers shared between modules."""
    groups: dict = {}
    for name, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        groups.setdefault(id(t), []).append(name)
    return {name: names for names in groups.values() if len(names) > 1 for name in names}


def _own_forward(module) -> bool:
    """A container class with a forward of its own (a parametrization's ParametrizationList)."""
    from torch import nn

    return type(module).forward not in (nn.Module.forward, nn.ModuleList.forward, nn.ModuleDict.forward)


def keyed(container) -> bool:
    """Is this container (not called as a whole) an nnx.Dict by child name: a ModuleDict, or an
    nn.Sequential whose children have names of their own (OrderedDict: `head.norm`, `head.fc`)?
    Otherwise it is an nnx.List by torch's index."""
    from torch import nn

    return isinstance(container, nn.ModuleDict) or any(not name.isdigit() for name in container._modules)


def _position(sequential, name: str) -> int:
    """Where child `name` sits in an nn.Sequential (its nnx.Sequential's layers index): names
    from an OrderedDict ('fc', 'act') as well as '0', '1', ..."""
    return list(sequential._modules).index(name)


def _not_held(arrays, sizes) -> list:
    """The sizes no dim of `arrays` holds, nor sums and products of their dims."""
    held = {str(d.node.expr) for a in arrays for d in (getattr(a.meta.get("val"), "shape", None) or ())
            if hasattr(d, "node")}

    def derivable(e) -> bool:
        if e.is_number or str(e) in held:
            return True
        return not e.is_Symbol and bool(e.args) and all(derivable(a) for a in e.args)

    return [size for size in sizes if hasattr(size.meta.get("val"), "node")
            and not derivable(size.meta["val"].node.expr)]


def _reading_parameter(frame, v, params, file, taken, inputs) -> str | None:
    """The forward parameter (not in `taken`) named on the source line of `frame`'s class that
    first reads value v, or None. Where that line reads several parameters (`mask.type_as(x)`),
    the op's arguments are matched to them in the order the line writes them."""
    for node in frame.all_nodes():
        if v in node.all_input_nodes:
            for f, line, _ in reversed(src.frames(node)):
                if f == file:
                    seen = src.names_on_line(f, line)
                    options = [p for p in params if p in seen and p not in taken]
                    read = [p for p in src.names_read_on_line(f, line) if p in params]
                    args = [a for a in node.all_input_nodes if a in inputs]
                    rank = args.index(v) if v in args else -1
                    if 0 <= rank < len(read) and read[rank] in options:
                        return read[rank]
                    return options[0] if options else None
            return None
    return None
