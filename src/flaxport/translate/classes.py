"""Render every generated module call, merge train and eval, and group instances into classes.

See plan.py for the rules; this module does the work in dependency order: bodies of all
calls first (they do not depend on classes), then constructors bottom-up (a parent's
`__init__` names its children's classes and their arguments).
"""
from __future__ import annotations

import dataclasses
import difflib
import keyword
import re

from flaxport import runtime
from flaxport.translate import calls
from flaxport.translate.body import BodyRenderer
from flaxport.translate.context import NOISE_STREAM
from flaxport.translate.naming import AddedAttributes, free_name, safe_name
from flaxport.translate.sizes import SizesAsked
from flaxport.translate.plan import (MARK, VAGUE_HINTS, CallConstants, ClassDef, Instance, Line, ModeValue,
                                     body_lines, hashable, keyed)



def _postorder(frame):
    for child in frame.children:
        yield from _postorder(child)
    yield frame


def render_bodies(work):
    """Render every call of every generated (or Sequential-element) module, children first. Where
    a module's calls run the same code on other constants (`self.scale(x, 2.0)`, then 3.0), those
    constants become arguments of its `__call__` and everything is rendered again, the callers
    now passing them."""
    _render_every_call(work)
    work.call_constants = calls.constants_calls_differ_in(work.plan, work.bodies)
    if work.call_constants.params:
        work.bodies.clear()
        work.helpers.clear()
        work.problems.clear()
        _render_every_call(work)


def _render_every_call(work):
    done = []
    for mode, capture in work.plan.captures.items():
        for frame in _postorder(capture.root):
            kind = work.plan.kinds.get(frame.path, "generated")
            if kind == "sequential" and any(work.sizes_asked.of(child) for child in frame.children):
                work.plan = work.plan.unseal_sequential(frame.path)
                # the modes rendered before this one hold calls of it too: render those now
                for other, earlier in work.plan.frames_by_path.get(frame.path, []):
                    if other in done:
                        _render(work, other, work.plan.captures[other], earlier)
                kind = "generated"
            if kind in ("generated", "element"):
                _render(work, mode, capture, frame)
        done.append(mode)


def _render(work, mode, capture, frame):
    body = BodyRenderer(work.plan, capture, frame, frame.path, work.call_constants, work.sizes_asked,
                        work.added_attributes).render()
    work.bodies[(mode, frame.key)] = body
    work.helpers |= body.helpers
    work.problems += body.problems


def _mode_bodies(work, path):
    """{mode: [Line]} of the module's calls in each mode: one code, checked to agree over the
    calls, or one branch per value of the argument that tells them apart (calls.py)."""
    plan = work.plan
    by_mode: dict = {}
    params = None
    training = False
    mode_params: dict = {}
    for mode, frame in plan.frames_by_path.get(path, []):
        body = work.bodies.get((mode, frame.key))
        if body is None:
            continue
        mode_params.setdefault(mode, tuple(body.params))
        lines = body_lines(body)
        positions = work.call_constants.positions.get((mode, path))
        if positions:
            lines = calls.as_parameters(lines, positions)
        training |= body.needs_training
        by_mode.setdefault(mode, []).append((frame, lines))
        params = params or body.params
    if len(set(mode_params.values())) > 1:  # one __call__ cannot take both (translation.py keeps one mode)
        work.modes_differ.append(path)
    out = {}
    for mode, items in by_mode.items():
        arg = work.call_constants.branches.get((mode, path))
        if arg is not None:
            passed = [dict((name, value) for value, name in work.call_constants.values[(mode, f.key)])[arg]
                      for f, _ in items]
            out[mode] = calls.branches(arg, [(value, lines) for value, (_, lines) in zip(passed, items)])
            continue
        out[mode] = items[0][1]
        if any([x.text for x in lines] != [x.text for x in out[mode]] for _, lines in items):
            work.problems.append((f"{type(plan.modules[path]).__name__} called twice with different code", path, ""))
    return out, (params or []) + work.call_constants.params.get(path, []), training


def merge_modes(bodies: dict):
    """One list of Lines from the eval and train renderings (see plan.py). -> (lines, uses self.training)"""
    modes = list(bodies)
    if len(modes) == 1:
        return bodies[modes[0]], False
    ev, tr = bodies.get("eval"), bodies.get("train")
    matcher = difflib.SequenceMatcher(a=[line.text for line in ev], b=[line.text for line in tr], autojunk=False)
    out, training = [], False
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for a, b in zip(ev[i1:i2], tr[j1:j2]):
                if a.slots == b.slots:
                    out.append(a)
                else:
                    slots = tuple(sa if sa == sb else (ModeValue(sa[0], sb[0]), sa[1]) for sa, sb in zip(a.slots, b.slots))
                    training |= any(isinstance(s[0], ModeValue) for s in slots)
                    out.append(Line(a.text, slots))
            continue
        training = True
        t_block, e_block = tr[j1:j2], ev[i1:i2]
        # at the blocks' own depth: inside a branch of the code (classes._branches) they are indented
        pad = min((len(x.text) - len(x.text.lstrip(" ")) for x in t_block + e_block), default=0) * " "

        def nested(lines):
            return [Line(pad + "    " + line.text[len(pad):], line.slots) for line in lines]

        if t_block:
            out.append(Line(pad + "if self.training:", ()))
            out += nested(t_block)
            if e_block:
                out.append(Line(pad + "else:", ()))
                out += nested(e_block)
        else:
            out.append(Line(pad + "if not self.training:", ()))
            out += nested(e_block)
    return out, training


# --------------------------------------------------------------------------- constructors
def _slot_line(text_parts) -> Line:
    """Line from a list of str / (value, hint) parts."""
    text, slots = "", []
    for part in text_parts:
        if isinstance(part, str):
            text += part
        else:
            text += f"\x00{len(slots)}\x00"
            slots.append(part)
    return Line(text, tuple(slots))


def _input_ndim(plan, path) -> int | None:
    """The rank of the first input of the module's first call, where the capture shows one."""
    for _, frame in plan.frames_by_path.get(path, []):
        inputs = [n for n in plan.io(frame)[0] if hasattr(n, "meta") and hasattr(n.meta.get("val"), "ndim")]
        if inputs:
            return inputs[0].meta["val"].ndim
    return None


def layer_constructor(work, path) -> list:
    """Parts of the runtime layer's constructor call for the torch module at path."""
    from flaxport.translate import layers as layer_table

    plan = work.plan
    spec = plan.specs[path]
    module = plan.modules[path]
    if not spec.runtime.startswith("nnx."):
        work.helpers.add(spec.runtime)
    parts = [spec.runtime + "("]
    first = True
    for name, value, default in spec.args(module):
        if default != layer_table.POSITIONAL and value == default:
            continue
        if not first:
            parts.append(", ")
        first = False
        if default == layer_table.POSITIONAL:
            parts.append((value, name))
        else:
            parts += [f"{name}=", (value, name)]
    if plan.layer_channels_last(path):
        parts.append(", channels_last=True")
    if spec.runtime == "nnx.Dropout":
        broadcast = layer_table.dropout_broadcast(module, _input_ndim(plan, path))
        if broadcast:
            parts.append(f", broadcast_dims={broadcast!r}")
    if runtime.takes_rngs(spec.runtime):
        parts.append(", rngs=rngs" if not first else "rngs=rngs")
    parts.append(")")
    return parts


def child_constructor(work, path):
    """Parts of the constructor expression of the module at path (None: no attribute)."""
    plan = work.plan
    kind = plan.kinds.get(path)
    if kind == "layer":
        return layer_constructor(work, path)
    if kind == "generated":
        inst = work.instances.get(path)
        if inst is None or inst.cls is None:
            return None
        parts = [inst.cls.name + "("]
        for value, name in zip(inst.args, inst.cls.params):
            parts += [(value, name), ", "]
        parts.append("rngs=rngs)")
        return parts
    if kind == "element":
        return [work.lambdas.get(path, "lambda x: x")]
    if kind in ("sequential", "container"):
        module = plan.modules[path]
        items = []
        for name, _ in module.named_children():
            child = f"{path}.{name}" if path else name
            ctor = child_constructor(work, child)
            if ctor is None:
                if kind == "sequential":
                    return None
                if not keyed(module):  # a hole keeps the list's later items at torch's index
                    items.append((name, ["None"]))
                continue
            items.append((name, ctor))
        while items and items[-1][1] == ["None"]:
            items.pop()
        if not items and kind == "container":
            return None
        if kind == "sequential":
            parts = ["nnx.Sequential("]
            for i, (_, ctor) in enumerate(items):
                parts += ([", "] if i else []) + list(ctor)
            return parts + [")"]
        if keyed(module):
            parts = ["nnx.Dict({"]
            for i, (name, ctor) in enumerate(items):
                parts += ([", "] if i else []) + [f"{name!r}: "] + list(ctor)
            return parts + ["})"]
        parts = ["nnx.List(["]
        for i, (_, ctor) in enumerate(items):
            parts += ([", "] if i else []) + list(ctor)
        return parts + ["])"]
    return None


def _ready(work, path) -> bool:
    """Are the classes of every generated module below path decided?"""
    plan = work.plan
    module = plan.modules[path]
    for name, _ in module.named_children():
        child = f"{path}.{name}" if path else name
        kind = plan.kinds.get(child)
        if kind == "generated" and child in work.instances and work.instances[child].cls is None:
            return False
        if kind in ("sequential", "container") and not _ready(work, child):
            return False
    return True


def init_lines(work, path, synth: dict) -> list:
    import torch

    plan = work.plan
    module = plan.modules[path]
    lines = []
    for name, _ in module.named_children():
        child = f"{path}.{name}" if path else name
        if not plan.constructed(child):
            continue
        ctor = child_constructor(work, child)
        if ctor is not None:
            lines.append(_slot_line([f"self.{plan.attr_name(name)} = "] + list(ctor)))
    for name, p in module.named_parameters(recurse=False):
        lines.append(_slot_line([f"self.{plan.attr_name(name)} = nnx.Param(jnp.zeros("] + _shape_parts(p, name)
                                + [_dtype_suffix(p) + "))"]))
    for name, b in module.named_buffers(recurse=False):
        if b is None:
            continue
        work.helpers.add("Buffer")
        lines.append(_slot_line([f"self.{plan.attr_name(name)} = Buffer(jnp.zeros("] + _shape_parts(b, name)
                                + [_dtype_suffix(b) + "))"]))
    capture = next(iter(plan.captures.values()))
    for full, value in plan.constants(capture).items():
        owner, _, attr = full.rpartition(".")
        if owner == path and torch.is_tensor(value):
            work.helpers.add("Buffer")
            lines.append(_slot_line([f"self.{attr} = Buffer(jnp.zeros("] + _shape_parts(value, attr)
                                    + [_dtype_suffix(value) + "))"]))
    for attr, ctor in synth.items():
        lines.append(Line(f"self.{attr} = {ctor.text if hasattr(ctor, 'text') else ctor}", ()))
    if not path:
        ties = plan.ties()
        if ties:
            lines.append(Line("# torch shares these: one object here too, so training updates them as one", ()))
        lines += [Line(f"{alias} = {home}", ()) for alias, home in ties]
    return lines


def _shape_parts(t, name):
    shape = tuple(t.shape)
    parts = ["("]
    for i, s in enumerate(shape):
        parts += ([", "] if i else []) + [(int(s), f"{name}_size")]
    return parts + ([",)"] if len(shape) == 1 else [")"])


def _dtype_suffix(t) -> str:
    from flaxport.translate.context import JNP_DTYPES

    name = str(t.dtype).split(".")[-1]
    # floats: the default (float32); the loaded value brings its own dtype (a float64 constant stays one
    # under jax x64), and asking for float64 without x64 only warns
    return "" if name in ("float32", "float64") else f", {JNP_DTYPES.get(name, 'jnp.' + name)}"


# --------------------------------------------------------------------------- classes
@dataclasses.dataclass(frozen=True)
class Classes:
    """The classes stage's result: what emit writes and what translate refuses."""

    plan: object  # the plan, with the kinds of modules only rendering could decide revised
    classes: tuple  # ClassDef, dependencies first: the last is the top module's
    helpers: frozenset  # the runtime pieces their code asks for
    problems: tuple  # (what, module path, source) that cannot be translated
    draws_noise: bool  # a class draws random numbers (torch.rand...): load() seeds a `noise` stream
    modes_differ: tuple = ()  # paths of modules given other inputs in train mode than in eval mode


class _Work:
    """What the stage builds as it goes; read only inside this module."""

    def __init__(self, plan):
        self.plan = plan
        self.bodies: dict = {}  # (mode, frame key) -> Body
        self.call_constants = CallConstants()
        self.sizes_asked = SizesAsked()
        self.added_attributes = AddedAttributes(plan.attribute_names)
        self.instances: dict = {}  # path -> Instance
        self.lambdas: dict = {}  # path -> function text of an element of an nn.Sequential
        self.classes: list = []
        self.helpers: set = set()
        self.problems: list = []
        self.modes_differ: list = []


def build_classes(plan) -> Classes:
    """Instances of every generated module of `plan`, grouped into ClassDefs."""
    work = _Work(plan)
    render_bodies(work)
    _element_functions(work)
    plan = work.plan  # with the kinds rendering revised
    pending = []
    for path, kind in plan.kinds.items():
        if kind != "generated" or not plan.used(path) and path:
            continue
        bodies, params, training = _mode_bodies(work, path)
        if not bodies and plan.frames_by_path.get(path):
            continue
        lines, mode_training = merge_modes(bodies) if bodies else ([], False)  # no bodies: it holds variables
        synth = {}
        for mode, frame in plan.frames_by_path.get(path, []):
            body = work.bodies.get((mode, frame.key))
            if body is not None:
                synth.update(body.synth)
        inst = Instance(path, plan.modules[path], [], lines, params, training or mode_training)
        inst.synth = synth
        work.instances[path] = inst
        pending.append(path)
    left: dict = {}  # torch class -> paths of its instances not yet in a ClassDef
    for path in pending:
        left.setdefault(type(plan.modules[path]), []).append(path)
    names_taken = set(runtime.names())

    def decide(cls, paths):
        for p in paths:
            work.instances[p].init = init_lines(work, p, work.instances[p].synth)
        _group(work, cls, [work.instances[p] for p in paths], names_taken)
        left[cls] = [p for p in left[cls] if p not in paths]
        if not left[cls]:
            del left[cls]

    while left:
        progress = False
        for cls in list(left):
            if all(_ready(work, p) for p in left[cls]):  # decided whole: its variants side by side
                decide(cls, left[cls])
                progress = True
        if not progress:  # a class nested in itself (timm's DlaTree holds DlaTrees): its deepest instances
            # first (the deepest instance left has no undecided child, so some instance is always ready)
            waves = ((cls, [p for p in paths if _ready(work, p)]) for cls, paths in left.items())
            decide(*next((cls, ready) for cls, ready in waves if ready))
    draws_noise = any(NOISE_STREAM in inst.synth.values() for inst in work.instances.values())
    return Classes(plan, tuple(work.classes), frozenset(work.helpers), tuple(work.problems), draws_noise,
                   tuple(work.modes_differ))


def _element_functions(work):
    """Functions for the parameter-free modules inside an nn.Sequential: `jax.nn.relu`, `lambda x: ...`
    (a class where the module's code is more than one expression)."""
    for path, kind in work.plan.kinds.items():
        if kind != "element" or path in work.lambdas:
            continue
        for mode, frame in work.plan.frames_by_path.get(path, []):
            body = work.bodies.get((mode, frame.key))
            if body is None:
                continue
            if len(body.lines) != 1 or not body.lines[0].startswith("return "):
                work.plan = work.plan.element_as_class(path)
                break
            expr = MARK.sub(lambda m: repr(body.slots[int(m.group(1))][0]), body.lines[0][len("return "):])
            param = body.params[0] if body.params else "x"
            simple = re.fullmatch(rf"([\w.]+)\({re.escape(param)}\)", expr)
            work.lambdas[path] = simple.group(1) if simple else f"lambda {param}: {expr}"
            break


def _group(work, cls, instances, names_taken):
    """Split instances of one torch class into variants (same code) and make a ClassDef each."""
    variants: dict = {}
    for inst in instances:
        key = (tuple(line.text for line in inst.init), tuple(line.text for line in inst.call), tuple(inst.params))
        variants.setdefault(key, []).append(inst)
    ordered = list(variants.values())
    base_name = safe_name(cls.__name__)
    if keyword.iskeyword(base_name):
        base_name += "_"
    first_attrs = _attrs(ordered[0][0])
    for k, group in enumerate(ordered):
        name = base_name if k == 0 else _variant_name(base_name, first_attrs, _attrs(group[0]), k)
        if name in names_taken:  # another torch class of this name (parametrize makes one per module)
            name = next(f"{name}{n}" for n in range(2, 10_000) if f"{name}{n}" not in names_taken)
        names_taken.add(name)
        cdef = ClassDef(name, cls, group)
        cdef.base = "TorchModule" if any(i.needs_training for i in group) else "nnx.Module"
        if cdef.base == "TorchModule":
            work.helpers.add("TorchModule")
        _parameters(cdef)
        work.classes.append(cdef)


def _attrs(inst) -> set:
    return {line.text.split(" = ", 1)[0][5:] for line in inst.init if line.text.startswith("self.")}


def _variant_name(base, first, mine, k) -> str:
    extra, missing = sorted(mine - first), sorted(first - mine)
    camel = lambda names: "And".join("".join(p.capitalize() for p in n.split("_")) for n in names)  # noqa: E731
    if extra and not missing and len(extra) <= 2:  # more would be a list, not a name (DenseNet's blocks)
        return f"{base}With{camel(extra)}"
    if missing and not extra and len(missing) <= 2:
        return f"{base}Without{camel(missing)}"
    return f"{base}{k + 1}"


def _parameters(cdef: ClassDef):
    """Which slots become constructor parameters (values differ between instances), and their names."""
    insts = cdef.instances
    positions = []
    for part in ("init", "call"):
        for li, line in enumerate(getattr(insts[0], part)):
            for si in range(len(line.slots)):
                positions.append((part, li, si))
    vectors = {}
    for pos in positions:
        part, li, si = pos
        vectors[pos] = tuple(getattr(i, part)[li].slots[si][0] for i in insts)
    params, by_vector, names = [], {}, set()
    attr_vectors = _attribute_vectors(insts)
    for pos in positions:
        vec = vectors[pos]
        if len(insts) == 1 or len(set(map(hashable, vec))) == 1:
            cdef.positions[pos] = None
            continue
        hv = tuple(map(hashable, vec))
        if hv not in by_vector:
            hints = [getattr(insts[0], p)[l].slots[k][1] or "value" for (p, l, k) in positions
                     if tuple(map(hashable, vectors[(p, l, k)])) == hv]
            ranked = sorted(set(hints), key=lambda h: (-hints.count(h), h in VAGUE_HINTS,
                                                       HINT_ORDER.index(h) if h in HINT_ORDER else len(HINT_ORDER), h))
            free = [h for h in ranked if safe_name(h) not in names]
            name = attr_vectors.get(hv) or safe_name(free[0] if free else ranked[0])
            name = free_name(name, names)
            names.add(name)
            by_vector[hv] = name
            params.append((name, vec))
        cdef.positions[pos] = by_vector[hv]
    cdef.params = [name for name, _ in params]
    for i, inst in enumerate(insts):
        inst.cls = cdef
        inst.args = tuple(vec[i] for _, vec in params)


# Constructor-argument names in order of preference when one value fills several slots.
HINT_ORDER = ["in_channels", "out_channels", "in_features", "out_features", "embedding_dim", "hidden_size",
              "input_size", "stride", "kernel_size", "padding", "dilation", "groups", "num_embeddings"]


def _attribute_vectors(insts) -> dict:
    """Numbers the torch instances hold as attributes (self.stride, self.heads): vector -> name."""
    out = {}
    names = None
    for inst in insts:
        own = {k for k, v in vars(inst.module).items()
               if not k.startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)}
        names = own if names is None else names & own
    for name in sorted(names or ()):
        vec = tuple(hashable(getattr(i.module, name)) for i in insts)
        out.setdefault(vec, name)
    return out
