"""The generated model file: imports, the runtime pieces it uses, the classes, `load()`.

The file imports only jax, flax.nnx, numpy and the standard library (and, with the
default conv="native", flaxport's kernels where flaxport is installed). Runtime layers and
functions are copied from translate/runtime (only the ones used, with what they use).
Long lines are wrapped at argument commas; black formats the file instead when it is
installed.
"""
from __future__ import annotations

import ast
import inspect
import re

from flaxport.translate.plan import ModeValue

WIDTH = 110
_MARK = re.compile("\x00(\\d+)\x00")


# --------------------------------------------------------------------------- runtime pieces
def _runtime_sources(conv: str = "xla") -> dict:
    """name -> (order, source, names it refers to) for every top-level def in the runtime
    (with conv="native", runtime/native.py's definitions in place of those of the same name)."""
    from flaxport.translate.runtime import arrays, functions, layers, native

    out = {}
    order = 0
    for mod in (functions, arrays, layers) + ((native,) if conv == "native" else ()):
        text = inspect.getsource(mod)
        tree = ast.parse(text)
        lines = text.splitlines()
        for node in tree.body:
            refs = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            refs |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                start = node.lineno - 1 - len(node.decorator_list)
                at = out[node.name][0] if node.name in out else order  # a replacement keeps its place
                out[node.name] = (at, "\n".join(lines[start:node.end_lineno]), refs)
                order += 1
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                    isinstance(node.value.func, ast.Attribute) and isinstance(node.value.func.value, ast.Name) and \
                    node.value.func.value.id in out:  # `f.defvjp(fwd, bwd)`: part of f's definition
                name = node.value.func.value.id
                o, source, own = out[name]
                out[name] = (o, source + "\n\n\n" + "\n".join(lines[node.lineno - 1:node.end_lineno]), own | refs)
    return out


def runtime_code(names: set, conv: str = "xla") -> str:
    """The runtime definitions `names` need (transitively), in the runtime's own order."""
    sources = _runtime_sources(conv)
    needed, todo = set(), [n for n in names if n in sources]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo += [r for r in sources[name][2] if r in sources and r not in needed]
    picked = sorted(needed, key=lambda n: sources[n][0])
    return "\n\n\n".join(sources[n][1] for n in picked)


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
def read_safetensors(path):
    """{name: NumPy array} and the metadata of a .safetensors file (a JSON header, then raw bytes)."""
    dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        data = f.read()
    metadata = header.pop("__metadata__", {})
    arrays = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        arrays[name] = np.frombuffer(data[start:end], dtypes[info["dtype"]]).reshape(info["shape"])
    return arrays, metadata


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
    return re.search(r"\bflaxport_conv\.", source) is not None


def module_source(plan, header: str, conv: str = "xla") -> str:
    """The whole model.py text; conv="native": convolutions on flaxport's kernels where installed."""
    used = set(plan.helpers) | ({"columns_channels_last"} if plan.flat_weights else set())
    class_texts = [class_source(c) for c in plan.classes]
    body_text = "\n".join(class_texts)
    runtime_names = set(re.findall(r"\b([A-Za-z_]\w*)\b", body_text)) | used
    runtime = runtime_code(runtime_names, conv)
    root = plan.classes[-1].name
    set_variable = SET_VARIABLE_COLUMNS if plan.flat_weights else SET_VARIABLE
    loader = LOADER.replace("{root}", root).replace("{set_variable}", set_variable)
    if "rngs.noise.fork()" in body_text:
        loader = loader.replace("{draws}", "its random draws and dropout use streams")
        loader = loader.replace("{streams}", "params=0, dropout=seed, noise=seed")
    else:
        loader = loader.replace("{draws}", "dropout draws from the `dropout` stream")
        loader = loader.replace("{streams}", "params=0, dropout=seed")
    if plan.flat_weights:
        loader = COLUMNS.format(columns=repr(plan.flat_weights)) + loader
    code = "\n\n\n".join(part for part in [runtime, *class_texts, loader.strip()] if part)
    imports = _imports(code)
    if calls_native_conv(code):
        imports.append(NATIVE_IMPORT)
    text = f'"""{header}"""\n' + "\n".join(imports) + "\n\n\n" + code + "\n"
    text = _strip_runtime_imports(text)
    return format_source(text)


def _imports(code: str) -> list:
    lines = []
    std = [m for m in ("functools", "itertools", "json", "math", "os") if re.search(rf"\b{m}\.", code)]
    lines += [f"import {m}" for m in std]
    if std:
        lines.append("")
    if re.search(r"\bjax\.", code):
        lines.append("import jax")
    if re.search(r"\bjnp\.", code):
        lines.append("import jax.numpy as jnp")
    if re.search(r"\bnp\.", code):
        lines.append("import numpy as np")
    if re.search(r"\bnnx\.", code):
        lines.append("from flax import nnx")
    if re.search(r"\blax\.", code):
        lines.append("from jax import lax")
    return lines


def _strip_runtime_imports(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("from flaxport"))


# --------------------------------------------------------------------------- formatting
def format_source(text: str) -> str:
    """The file as black formats it, lines up to WIDTH: what a careful person commits."""
    import black

    return black.format_str(text, mode=black.Mode(line_length=WIDTH))
