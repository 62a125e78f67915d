"""What an op handler sees: OpContext, the arguments of one node rendered for the body it sits in.

Handlers read arguments by their schema names (`c.x("self")` renders a tensor argument in
the layout the op reads it in, `c.lit(v)` a number slot, `c.size(...)` a shape whose sizes
come from live arrays) and mark what they need (`c.helper("max_pool")`, `c.submodule(...)`).
"""
from __future__ import annotations

import math

from flaxport.translate.ops.table import ATOM, UNARY, Expr, Outputs, Unsupported, schema_arguments

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
JNP_DTYPES = {"float32": "jnp.float32", "float64": "jnp.float64", "float16": "jnp.float16",
              "bfloat16": "jnp.bfloat16", "int64": "int", "int32": "jnp.int32", "int16": "jnp.int16",
              "int8": "jnp.int8", "uint8": "jnp.uint8", "bool": "bool", "complex64": "jnp.complex64"}

# Arguments naming an axis: an op taking one reads a 0-d tensor as torch does, as one of shape (1,).
DIM_ARGS = ("dim", "dims", "dim0", "dim1", "start_dim", "end_dim", "axis", "axis0", "axis1", "source",
            "destination")

# what a module that draws random numbers holds: its own fork of the model's `noise` stream
NOISE_STREAM = "rngs.noise.fork()"


class OpContext:
    """What an op handler sees (see flaxport.translate.ops)."""

    def __init__(self, body: BodyRenderer, node):
        self.body, self.node = body, node
        self.out = node.meta.get("val")
        self.mode = body.capture.mode
        self.args = schema_arguments(node)
        self.lifted = self._lift_scalars()
        if self.lifted:
            self.out = _lifted(self.out)

    def _lift_scalars(self) -> set:
        """The 0-d tensor arguments of an op taking an axis: torch reads dim 0 (or -1) of a 0-d tensor
        as the axis of a 1-element one, jnp refuses it; the handler sees them as shape (1,) (x.reshape(1))
        and the result is reshaped to torch's (`finish`)."""
        if not any(self.args.get(k) is not None for k in DIM_ARGS):
            return set()
        ndims = {k: getattr(getattr(v, "meta", {}).get("val"), "ndim", None) for k, v in self.args.items()}
        tensors = [k for k, n in ndims.items() if n is not None]
        if not tensors or ndims[tensors[0]] != 0:
            return set()  # the dim indexes the first tensor argument: only a 0-d one is read as 1-d
        return {k for k in tensors if ndims[k] == 0}

    def finish(self, result):
        """The handler's result in torch's shape (for an op computed on lifted 0-d arguments)."""
        if not self.lifted:
            return result
        out = self.node.meta.get("val")
        if isinstance(result, Outputs):
            return Outputs(tuple(None if r is None else self._shaped(r, o) for r, o in zip(result, out)))
        if isinstance(out, (list, tuple)):
            return Outputs(tuple(self._shaped(Expr(f"{result.at(ATOM)}[{i}]"), o) for i, o in enumerate(out)))
        return self._shaped(result, out)

    def _shaped(self, expr, val) -> Expr:
        shape = tuple(self.static(s) for s in getattr(val, "shape", ()))
        if None in shape:
            raise Unsupported("a 0-d tensor where the result's size is not fixed")
        return Expr(f"{expr.at(ATOM)}.reshape({shape!r})")

    # arguments
    def has(self, name) -> bool:
        return self.args.get(name) is not None

    def raw(self, name):
        v = self.args.get(name)
        return v

    def raw_index(self, i):
        return self.node.args[i]

    def val(self, name):
        v = self.args.get(name)
        if name in self.lifted:
            return _lifted(v.meta["val"])
        return v.meta.get("val") if hasattr(v, "meta") else v

    def is_float(self, name) -> bool:
        v = self.val(name)
        if hasattr(v, "dtype"):
            return str(v.dtype).split(".")[-1] in FLOAT_DTYPES
        return isinstance(v, float)

    def x(self, name) -> Expr:
        if name in self.lifted:
            return Expr(f"{self._render(self.args[name], name).at(ATOM)}.reshape(1)")
        return self._render(self.args.get(name), name)

    def x_index(self, i) -> Expr:
        return self._render(self.node.args[i], "arg")

    def x_item(self, name, i) -> Expr:
        return self._render(self.args[name][i], name)

    def item_val(self, name, i):
        v = self.args[name][i]
        return v.meta.get("val") if hasattr(v, "meta") else v

    def _render(self, v, hint) -> Expr:
        import torch

        if v is None:
            return Expr("None")
        if hasattr(v, "op"):  # an fx node, in the layout this op reads it in
            return self.body.value_as(v, self.body.plan.wanted(self.body.capture, self.node, v))
        if isinstance(v, bool):
            return Expr(repr(v))
        if isinstance(v, (int, float)):
            return self.lit(v, hint)
        if isinstance(v, torch.dtype):
            return Expr(self.dtype(v))
        if isinstance(v, (list, tuple)):
            parts = [self._render(e, hint).text for e in v]
            return Expr("(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")")
        if isinstance(v, str):
            return Expr(repr(v))
        if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
            return Expr("None")
        raise Unsupported(f"an argument of type {type(v).__name__}")

    @property
    def channels_last(self) -> bool:
        """Does this op compute channels-last (--layout nhwc)?"""
        return self.body.plan.layout_of(self.body.capture, self.node) == "last"

    def torch_layout_image(self, v) -> bool:
        """Is fx value `v` a feature map (layout.image_value, or a 4-D floating input of the model) that
        this op reads in torch's layout? The runtime's channels-last functions then compute on it
        (concatenate_channels, apply_channels_last, multiply_channels), so the transposes meet the
        convolutions'. The model's images count as feature maps so that a module gets the same code
        whether a call hands it the input or a convolution's output (a DenseNet block at the input)."""
        from flaxport.translate.layout import image_value

        if self.channels_last or not hasattr(v, "meta"):
            return False
        placeholder = self.body.capture.placeholders.get(v)
        if placeholder is not None:
            value = v.meta.get("val")
            return placeholder.kind == "input" and getattr(value, "ndim", 0) == 4 and value.is_floating_point()
        return image_value(v)

    def layout_dim(self, dim: int, arg: str = "self") -> int:
        """torch's dim `dim` of argument `arg`, as an axis of the array the op receives."""
        from flaxport.translate import layout as lay

        v = self.args.get(arg)
        ndim = self.val(arg).ndim if hasattr(v, "meta") else 1
        d = dim % max(ndim, 1)
        if hasattr(v, "meta") and self.body.plan.wanted(self.body.capture, self.node, v) == lay.LAST:
            return lay.to_layout_dim(d, ndim)
        return d

    def lit(self, value, hint=None) -> Expr:
        if hasattr(value, "op"):  # a size the graph computes (conv groups=batch): read from the arrays
            return self.body.value(value)
        if hasattr(getattr(value, "node", None), "expr"):  # a SymInt
            return self.body.sym_expr(value)
        if isinstance(value, float) and not math.isfinite(value):
            return Expr("jnp.inf" if value > 0 else ("-jnp.inf" if value < 0 else "jnp.nan"),
                        ATOM if value > 0 or value != value else UNARY)
        return self.body.slot(value, hint)

    def ints(self, values, hint) -> Expr:
        parts = [self.lit(v, hint).text for v in values]
        return Expr("(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")")

    def dim(self, name, ndim=None) -> int:
        """A dim argument: as torch wrote it (negative dims stay negative, as jnp reads them the
        same way), or normalised to 0..ndim-1 when ndim is given."""
        d = self.args.get(name)
        if isinstance(d, (list, tuple)):
            d = d[0]
        if ndim is None:
            return d
        return d % max(ndim, 1) if isinstance(d, int) else d

    def static(self, s):
        if isinstance(s, int):
            return s
        try:
            return int(s.node.expr) if hasattr(s, "node") and s.node.expr.is_number else None
        except (TypeError, AttributeError):
            return None

    def out_shape(self):
        return list(self.out.shape)

    def size(self, name_or_list, hint="size", bare=False) -> Expr:
        values = self.args.get(name_or_list) if isinstance(name_or_list, str) else name_or_list
        parts = []
        for v in values:
            if hasattr(v, "op"):
                parts.append(self.body.value(v).text)
            elif isinstance(v, int):
                parts.append(self.lit(v, hint).text if v != -1 else "-1")
            else:  # a SymInt
                parts.append(self.body.sym_expr(v).text)
        if bare:  # as separate arguments: x.reshape(n, -1)
            return Expr(", ".join(parts))
        return Expr("(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")")

    def index_text(self, v) -> str:
        if hasattr(v, "op"):
            return self.body.value(v).text
        if isinstance(v, int):
            return str(v)
        return self.body.sym_expr(v).text

    def index_expr(self, x: Expr, ndim: int, parts: dict, keep_trailing=False) -> Expr:
        if x.text.endswith("[...]"):  # an nnx.Variable indexes like its array
            x = Expr(x.text[:-5])
        last = max(parts)
        if last == ndim - 1 and ndim >= 3 and all(d == last for d in parts):
            return Expr(f"{x.at(ATOM)}[..., {parts[last]}]")
        items = [parts.get(d, ":") for d in range(last + 1)]
        return Expr(f"{x.at(ATOM)}[{', '.join(items)}]")

    # the generated module
    def helper(self, name) -> str:
        self.body.helpers.add(name)
        return name

    def dtype(self, dtype, follow=None) -> str:
        name = str(dtype).split(".")[-1]
        if follow is not None and name in FLOAT_DTYPES:
            ref = self.body.plan.dtype_reference(self.body, follow)
            if ref is not None:
                return ref
        return JNP_DTYPES.get(name, f"jnp.{name}")

    def training(self) -> str:
        self.body.needs_training = True
        return "self.training"

    def twin_raw(self, name):
        twin = self.body.plan.twin(self.body.capture, self.node)
        if twin is None:
            return None
        return schema_arguments(twin).get(name)

    def random_key(self) -> str:
        """A fresh key from the module's `noise` stream (one stream a module; it advances per draw)."""
        attr = self.body.added_attributes.name(self.body.frame, None, "noise")
        self.body.synth[attr] = NOISE_STREAM
        return f"self.{attr}()"

    def submodule(self, base: str, constructor: str) -> Expr:
        attr = self.body.added_attributes.name(self.body.frame, self.node, base)
        self.body.synth[attr] = constructor
        return Expr(f"self.{attr}")


class _Lifted:
    """A 0-d tensor's example value seen as shape (1,) (OpContext._lift_scalars)."""

    def __init__(self, val):
        self.val, self.shape, self.ndim, self.dtype = val, (1,), 1, val.dtype

    def __getattr__(self, name):
        return getattr(self.val, name)


def _lifted(val):
    if isinstance(val, (list, tuple)):
        return type(val)(_lifted(v) for v in val)
    return _Lifted(val) if getattr(val, "ndim", None) == 0 else val
