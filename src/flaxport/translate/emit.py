"""The generated model file: imports, the model's classes, `load()`, then the runtime pieces they use.

The file imports only jax, flax.nnx, numpy and the standard library (and, with the
default conv="native", flaxport's kernels where flaxport is installed). Runtime layers and
functions are copied from flaxport/runtime (only the ones used, with what they use).
Long lines are wrapped at argument commas; black formats the file instead when it is
installed.
"""
from __future__ import annotations

import ast
import re

from flaxport import runtime
from flaxport.translate.plan import ModeValue

WIDTH = 110
_MARK = re.compile("\x00(\\d+)\x00")


# --------------------------------------------------------------------------- runtime pieces
DIVIDER = """# ------------------------------------------------------------------------------------------
# torch's numerics as JAX functions and NNX layers (flaxport's runtime, copied): the classes
# above call them, and this file runs without flaxport installed."""


def runtime_needed(names: set, conv: str = "xla") -> list:
    """The runtime definitions `names` need (transitively), in the runtime's own order."""
    sources = runtime.definitions(conv)
    needed, todo = set(), [n for n in names if n in sources]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo += [r for r in sources[name][2] if r in sources and r not in needed]
    return sorted(needed, key=lambda n: sources[n][0])


def runtime_code(names, conv: str = "xla") -> str:
    """The source of runtime definitions `names`, as runtime_needed lists them."""
    sources = runtime.definitions(conv)
    return "\n\n\n".join(sources[n][1] for n in names)


# --------------------------------------------------------------------------- classes
def _value_text(value) -> str:
    if isinstance(value, ModeValue):
        return f"({value.train!r} if self.training else {value.eval!r})"
    if isinstance(value, float) and value == int(value) and abs(value) < 1e16 and "e" not in repr(value):
        return repr(value)
    return repr(value)


def _fill(line, cdef, part, li) -> str:
    def sub(m):
        si = int(m.group(1))
        param = cdef.positions.get((part, li, si))
        if param is not None:
            return f"self.{param}" if part == "call" else param
        return _value_text(line.slots[si][0])

    return _MARK.sub(sub, line.text)


def class_source(cdef) -> str:
    inst = cdef.instances[0]
    where = ", ".join(i.path or "the top module" for i in cdef.instances[:4])
    if len(cdef.instances) > 4:
        where += f" and {len(cdef.instances) - 4} more"
    torch_name = f"{cdef.torch_class.__module__}.{cdef.torch_class.__qualname__}"
    out = [f"class {cdef.name}({cdef.base}):", f'    """torch: {torch_name} ({where})."""', ""]
    params = ", ".join(cdef.params + ["*", "rngs: nnx.Rngs"])
    out.append(f"    def __init__(self, {params}):")
    kept = [p for p in cdef.params if any(cdef.positions.get(pos) == p for pos in cdef.positions if pos[0] == "call")]
    init = [f"self.{p} = {p}" for p in kept] + [_fill(line, cdef, "init", li) for li, line in enumerate(inst.init)]
    if not init:
        init = ["del rngs  # no parameters"]
    out += ["        " + text for text in init]
    if not inst.call:  # a module whose variables the forward reads, never calling it
        return "\n".join(out)
    out.append("")
    out.append(f"    def __call__(self, {', '.join(inst.params)}):" if inst.params else "    def __call__(self):")
    out += ["        " + _fill(line, cdef, "call", li) for li, line in enumerate(inst.call)]
    return "\n".join(out)


# --------------------------------------------------------------------------- the file
LOADER = '''
def load(directory, *, seed=0):
    """The translated model with the weights saved in `directory` (weights.safetensors, torch's names),
    in the torch module's train/eval mode; {draws} seeded by `seed`."""
    arrays, metadata = read_safetensors(os.path.join(directory, "weights.safetensors"))
    # Shapes only (nothing initialised): every variable is set from the file below.
    model = nnx.eval_shape(lambda: {root}(rngs=nnx.Rngs({streams})))
    variables = dict(nnx.to_flat_state(nnx.state(model)))
    for name, path in json.loads(metadata["nnx_paths"]).items():
        key = tuple(int(p) if p.isdigit() else p for p in path.split("/"))
        {set_variable}
    for i, (_, key) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.RngKey))):
        key.set_value(jax.random.fold_in(jax.random.key(seed), i))
    for _, count in nnx.to_flat_state(nnx.state(model, nnx.RngCount)):
        count.set_value(jnp.zeros((), jnp.uint32))
    model.train() if metadata.get("mode") == "train" else model.eval()
    return model
'''


COLUMNS = '''
# Linear weights that read a channels-last flatten, with the (C, H, W) map it flattens:
# the model holds their columns in (h, w, c) order, torch's state_dict in (c, h, w) order.
CHANNELS_LAST_COLUMNS = {columns}
'''

SET_VARIABLE = "variables[key].set_value(jnp.asarray(arrays[name]))"

SET_VARIABLE_COLUMNS = """array = arrays[name]
        if name in CHANNELS_LAST_COLUMNS:
            array = columns_channels_last(array, CHANNELS_LAST_COLUMNS[name])
        variables[key].set_value(jnp.asarray(array))"""


NATIVE_IMPORT = """
try:  # flaxport's native CPU convolutions where flaxport is installed; XLA's where it is absent
    from flaxport.kernels import conv as flaxport_conv
except ImportError:
    flaxport_conv = None
"""


def calls_native_conv(source: str) -> bool:
    """Does this file (or its code) call flaxport's native convolution kernels (conv="native")?"""
    return "flaxport_conv" in _modules_used(source)


def module_source(plan, classes, header: str, conv: str = "xla") -> str:
    """The whole model.py text of `classes` (classes.Classes); conv="native": convolutions on
    flaxport's kernels where installed."""
    class_texts = [class_source(c) for c in classes.classes]
    # What the handlers and layers wrote asked for its pieces as it was written (classes.helpers).
    loader_pieces = {"read_safetensors"} | ({"columns_channels_last"} if plan.flat_weights else set())
    # a base class is needed where the classes are defined; the rest of the runtime follows them
    bases = runtime_needed({c.base for c in classes.classes}, conv)
    base_code = runtime_code(bases, conv)
    pieces = runtime_code([n for n in runtime_needed(set(classes.helpers) | loader_pieces, conv) if n not in bases],
                          conv)
    root = classes.classes[-1].name
    set_variable = SET_VARIABLE_COLUMNS if plan.flat_weights else SET_VARIABLE
    loader = LOADER.replace("{root}", root).replace("{set_variable}", set_variable)
    if classes.draws_noise:
        loader = loader.replace("{draws}", "its random draws and dropout use streams")
        loader = loader.replace("{streams}", "params=0, dropout=seed, noise=seed")
    else:
        loader = loader.replace("{draws}", "dropout draws from the `dropout` stream")
        loader = loader.replace("{streams}", "params=0, dropout=seed")
    if plan.flat_weights:
        loader = COLUMNS.format(columns=repr(plan.flat_weights)) + loader
    code = "\n\n\n".join(part for part in [base_code, *class_texts, loader.strip(), DIVIDER + "\n\n\n" + pieces] if part)
    imports = _imports(code)
    if calls_native_conv(code):
        imports.append(NATIVE_IMPORT)
    text = f'"""{header}"""\n' + "\n".join(imports) + "\n\n\n" + code + "\n"
    text = _strip_runtime_imports(text)
    return format_source(text)


def _modules_used(code: str) -> set:
    """The names the code reads an attribute of (`jnp` of `jnp.zeros`): the modules it needs."""
    return {n.value.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}


def _imports(code: str) -> list:
    used = _modules_used(code)
    std = [f"import {m}" for m in runtime.STANDARD if m in used]
    return std + ([""] if std else []) + [line for name, line in runtime.IMPORTS.items() if name in used]


def _strip_runtime_imports(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("from flaxport"))


# --------------------------------------------------------------------------- formatting
def format_source(text: str) -> str:
    """The file as black formats it, lines up to WIDTH: what a careful person commits."""
    import black

    return black.format_str(text, mode=black.Mode(line_length=WIDTH))
