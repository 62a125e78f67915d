"""Reshaping, slicing, indexing, joining and padding: torch's dims and index rules on jnp arrays."""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, Expr, Outputs, Unsupported, call, method, op

# torch's `x[a:]` slices to the largest int64: "to the end".
INT64_MAX = 9223372036854775807


def _reshape(c, node):
    if c.body.plan.flattens_channels_last(c.body.capture, node):
        return _flatten_channels_last(c, node)
    sizes = list(c.raw("size" if c.has("size") else "shape"))
    x = c.x("self")
    lead = c.static(c.val("self").shape[0]) if c.val("self").ndim else None
    import re

    base = re.fullmatch(r"(\w+)(\.transpose\(0, [0-9, ]+\))?", x.text)  # a name, or its layout transpose
    if sizes and isinstance(sizes[0], int) and sizes[0] == lead and lead not in (None, -1, 1) and base:
        # export fixed the batch size (len(x) or x.size(0) made it a Python int): keep it x.shape[0]
        batch = f"{base.group(1)}.shape[0]"
        return method(x, "reshape", Expr(", ".join([batch, c.size(sizes[1:], bare=True).text])
                                         if len(sizes) > 1 else batch))
    return method(x, "reshape", c.size(sizes, bare=True))


op("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.view_copy.default")(_reshape)


def _flatten_channels_last(c, node):
    """(N, C, H, W) -> (N, H * W * C), for a linear holding its weight's columns in that order
    (layout.flattened_linears): from torch's layout a transpose, which XLA cancels against
    the channels-last op before it."""
    x = c.x("self")
    last = c.body.plan.wanted(c.body.capture, node, c.args["self"]) == "last"
    weight = c.body.plan.flattened[c.body.capture.mode][node]
    _, h, w = c.body.plan.flat_weights[weight]
    layer = weight.rsplit(".", 1)[0]
    c.body.comment(f"{layer}'s weight holds its columns in (h, w, c) order (load() puts them so), for {h}x{w} maps")
    # The column order is the example's: another (H, W) with the same C * H * W would pass unseen.
    # x is always a name here (the body never inlines this flatten's input).
    c.body.statement(f"assert {x.text}.shape[{'1:3' if last else '2:'}] == ({h}, {w}), "
                     f"\"{layer} was translated for {h}x{w} maps\"")
    batch = f"{x.text}.shape[0]"
    if not last:
        x = method(x, "transpose", Expr("0, 2, 3, 1"))
    return method(x, "reshape", Expr(f"{batch}, -1"))


@op("aten.flatten.using_ints")
def flatten(c, node):
    if c.body.plan.flattens_channels_last(c.body.capture, node):
        return _flatten_channels_last(c, node)
    ndim = c.val("self").ndim
    start, end = c.dim("start_dim", ndim), c.dim("end_dim", ndim)
    if start == end:
        return c.x("self")
    shape = list(c.val("self").shape)
    sizes = shape[:start] + [-1] + shape[end + 1:]
    return method(c.x("self"), "reshape", c.size(sizes, bare=True))


@op("aten.unflatten.int")
def unflatten(c, node):
    return method(c.x("self"), "reshape", c.size(c.out_shape(), bare=True))


@op("aten.permute.default")
def permute(c, node):
    ndim = c.val("self").ndim
    dims = [d % ndim for d in c.raw("dims")]
    return method(c.x("self"), "transpose", *dims)


@op("aten.transpose.int", "aten.swapaxes.default")
def transpose(c, node):
    ndim = c.val("self").ndim
    a, b = (c.dim("dim0", ndim), c.dim("dim1", ndim)) if c.has("dim0") else (c.dim("axis0", ndim), c.dim("axis1", ndim))
    if ndim == 2 and {a, b} == {0, 1}:
        return Expr(f"{c.x('self').at(ATOM)}.T")
    return call("jnp.swapaxes", c.x("self"), a, b)


@op("aten.t.default", "aten.numpy_T.default")
def t(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.T") if c.val("self").ndim == 2 else c.x("self")


@op("aten.movedim.int")
def movedim(c, node):
    ndim = c.val("self").ndim
    return call("jnp.moveaxis", c.x("self"), c.dim("source", ndim), c.dim("destination", ndim))


@op("aten.unsqueeze.default")
def unsqueeze(c, node):
    return call("jnp.expand_dims", c.x("self"), c.dim("dim", c.val("self").ndim + 1))


@op("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def squeeze(c, node):
    shape = c.val("self").shape
    ndim = len(shape)
    dims = c.raw("dim") if c.has("dim") else list(range(ndim))
    dims = [dims] if isinstance(dims, int) else list(dims)
    # torch squeezes only the listed dims that have size 1 (and ignores the others)
    keep = [d % max(ndim, 1) for d in dims if ndim and c.static(shape[d % ndim]) == 1]
    if not keep:
        return c.x("self")
    return call("jnp.squeeze", c.x("self"), keep[0] if len(keep) == 1 else tuple(keep))


@op("aten.expand.default", "aten.expand_copy.default")
def expand(c, node):
    return call("jnp.broadcast_to", c.x("self"), c.size(c.out_shape()))


@op("aten.expand_as.default")
def expand_as(c, node):
    return call("jnp.broadcast_to", c.x("self"), Expr(f"{c.x('other').at(ATOM)}.shape"))


@op("aten.repeat.default")
def repeat(c, node):
    return call("jnp.tile", c.x("self"), c.size("repeats"))


@op("aten.repeat_interleave.self_int")
def repeat_interleave(c, node):
    dim = c.dim("dim") if c.has("dim") else None
    return call("jnp.repeat", c.x("self"), c.x("repeats"), axis=dim)


@op("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def cat(c, node):
    items = [c.x_item("tensors", i) for i in range(len(c.raw("tensors")))]
    # torch skips 1-D empty tensors in cat (a legacy rule); jnp would refuse them
    items = [i for k, i in enumerate(items) if not (c.item_val("tensors", k).ndim == 1 and
                                                      c.static(c.item_val("tensors", k).shape[0]) == 0)]
    ndim = c.out.ndim
    dim = c.dim("dim", ndim) if c.has("dim") else 0
    listed = Expr("[" + ", ".join(str(i) for i in items) + "]")
    if c.channels_last:
        from flaxport.translate.layout import to_layout_dim

        dim = to_layout_dim(dim, ndim)
    elif ndim == 4 and dim == 1 and any(c.torch_layout_image(v) for v in node.args[0]):
        return call(c.helper("concatenate_channels"), listed)  # DenseNet's features: channels-last inside
    return call("jnp.concatenate", listed, axis=dim)


@op("aten.stack.default")
def stack(c, node):
    items = [c.x_item("tensors", i) for i in range(len(c.raw("tensors")))]
    return call("jnp.stack", Expr("[" + ", ".join(str(i) for i in items) + "]"),
                axis=c.dim("dim", c.out.ndim) if c.has("dim") else 0)


@op("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.tensor_split.sections",
    "aten.unsafe_split.Tensor")
def split(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim) if c.has("dim") else 0
    sizes = [c.static(v.shape[dim]) for v in c.out]
    if any(not isinstance(s, int) for s in sizes):
        return _split_symbolic(c, dim)
    points, total = [], 0
    for s in sizes[:-1]:
        total += s
        points.append(total)
    return call("jnp.split", c.x("self"), Expr(repr(points) if len(set(sizes)) > 1 else str(len(sizes))),
                axis=dim)


def _split_symbolic(c, dim):
    """A split whose part sizes export keeps symbolic (chunk of a dimension of any size): its split
    points are sums of those sizes, read from the arrays."""
    import sympy

    sizes = [v.shape[dim] for v in c.out]
    exprs = [s.node.expr if hasattr(s, "node") else sympy.Integer(s) for s in sizes]
    if len(set(exprs)) == 1:
        return call("jnp.split", c.x("self"), len(sizes), axis=dim)
    points, total = [], sympy.Integer(0)
    for e in exprs[:-1]:
        total = total + e
        points.append(c.body.sym_expr(total).text)
    return call("jnp.split", c.x("self"), Expr("[" + ", ".join(points) + "]"), axis=dim)


@op("aten.unbind.int")
def unbind(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim) if c.has("dim") else 0
    n = c.static(c.val("self").shape[dim])
    x = c.x("self")
    return Outputs(tuple(c.index_expr(x, ndim, {dim: str(i)}) for i in range(n)))


@op("aten.slice.Tensor")
def slice_(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim) if c.has("dim") else 0
    start = c.raw("start") if c.has("start") else None
    end = c.raw("end") if c.has("end") else None
    step = c.raw("step") if c.has("step") else 1
    start = None if start in (0, None) else c.index_text(start)
    end = None if end is None or (isinstance(end, int) and end >= INT64_MAX) else c.index_text(end)
    if start is None and end is None and step == 1:
        return c.x("self")
    text = f"{start or ''}:{end or ''}" + (f":{step}" if step != 1 else "")
    return c.index_expr(c.x("self"), ndim, {dim: text})


@op("aten.select.int")
def select(c, node):
    ndim = c.val("self").ndim
    return c.index_expr(c.x("self"), ndim, {c.dim("dim", ndim): c.index_text(c.raw("index"))})


@op("aten.narrow.default")
def narrow(c, node):
    ndim = c.val("self").ndim
    start = c.index_text(c.raw("start"))
    return c.index_expr(c.x("self"), ndim, {c.dim("dim", ndim): f"{start}:{start} + {c.index_text(c.raw('length'))}"})


@op("aten.index.Tensor")
def index(c, node):
    indices = c.raw("indices")
    ndim = c.val("self").ndim
    parts = {i: (c.x_item("indices", i).text if ix is not None else ":") for i, ix in enumerate(indices)}
    return c.index_expr(c.x("self"), ndim, parts, keep_trailing=False)


@op("aten.index_select.default")
def index_select(c, node):
    return call("jnp.take", c.x("self"), c.x("index"), axis=c.dim("dim"))


@op("aten.gather.default")
def gather(c, node):
    return call("jnp.take_along_axis", c.x("self"), c.x("index"), axis=c.dim("dim"))


@op("aten.index_put.default")
def index_put(c, node):
    indices = c.raw("indices")
    ndim = c.val("self").ndim
    masks = [i for i, ix in enumerate(indices) if ix is not None and str(c.item_val("indices", i).dtype) == "torch.bool"]
    if masks:  # x[mask] = v: the true places are known only when the model runs
        if masks != [0] or len(indices) != 1:
            raise Unsupported("a boolean mask index beside other indices")
        return call(c.helper("index_put_mask"), c.x("self"), c.x_item("indices", 0), c.x("values"),
                    accumulate="True" if c.has("accumulate") and c.raw("accumulate") else None)
    parts = {i: (c.x_item("indices", i).text if ix is not None else ":") for i, ix in enumerate(indices)}
    where = c.index_expr(Expr("X"), ndim, parts, keep_trailing=False).text[1:]
    fn = "add" if c.has("accumulate") and c.raw("accumulate") else "set"
    return Expr(f"{c.x('self').at(ATOM)}.at{where}.{fn}({c.x('values')})")


@op("aten.select_scatter.default")
def select_scatter(c, node):
    ndim = c.val("self").ndim
    where = c.index_expr(Expr("X"), ndim, {c.dim("dim", ndim): c.index_text(c.raw("index"))}).text[1:]
    return Expr(f"{c.x('self').at(ATOM)}.at{where}.set({c.x('src')})")


@op("aten.slice_scatter.default")
def slice_scatter(c, node):
    ndim = c.val("self").ndim
    dim = c.dim("dim", ndim) if c.has("dim") else 0
    start = c.raw("start") if c.has("start") else None
    end = c.raw("end") if c.has("end") else None
    step = c.raw("step") if c.has("step") else 1
    start = None if start in (0, None) else c.index_text(start)
    end = None if end is None or (isinstance(end, int) and end >= INT64_MAX) else c.index_text(end)
    text = f"{start or ''}:{end or ''}" + (f":{step}" if step != 1 else "")
    where = c.index_expr(Expr("X"), ndim, {dim: text}).text[1:]
    if where == "":
        return c.x("src")
    return Expr(f"{c.x('self').at(ATOM)}.at{where}.set({c.x('src')})")


@op("aten.flip.default")
def flip(c, node):
    ndim = c.val("self").ndim
    dims = tuple(d % ndim for d in c.raw("dims"))
    return call("jnp.flip", c.x("self"), dims[0] if len(dims) == 1 else dims)


@op("aten.roll.default")
def roll(c, node):
    shifts, dims = c.raw("shifts"), c.raw("dims") if c.has("dims") else None
    texts = [c.index_text(s) for s in shifts]  # sizes the graph computes (fftshift: x.shape[0] // 2) included
    return call("jnp.roll", c.x("self"), Expr(f"({', '.join(texts)})") if len(texts) > 1 else Expr(texts[0]),
                axis=(tuple(dims) if len(dims) > 1 else dims[0]) if dims else None)


@op("aten.tril.default", "aten.triu.default")
def tri(c, node):
    name = str(node.target).split(".")[1]
    diagonal = c.raw("diagonal") if c.has("diagonal") else 0
    return call(f"jnp.{name}", c.x("self"), k=c.lit(diagonal, "diagonal") if diagonal else None)


@op("aten.constant_pad_nd.default", "aten.pad.default")
def pad(c, node):
    mode = c.raw("mode") if c.has("mode") else "constant"
    pads = list(c.raw("pad"))
    ndim = c.val("self").ndim
    widths = [(0, 0)] * ndim
    for i in range(len(pads) // 2):  # torch lists (low, high) pairs from the last dim backwards
        widths[ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    value = c.raw("value") if c.has("value") else None
    jmode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    # a negative width crops: pad by the positive widths, then cut the negative ones off
    crops = {d: (-lo if _negative(lo) else 0, -hi if _negative(hi) else 0) for d, (lo, hi) in enumerate(widths)}
    grown = tuple((0 if _negative(lo) else lo, 0 if _negative(hi) else hi) for lo, hi in widths)
    out = c.x("self")
    if any(w != (0, 0) for w in grown):
        text = "(" + ", ".join(f"({c.index_text(lo)}, {c.index_text(hi)})" for lo, hi in grown) + \
            ("," if ndim == 1 else "") + ")"
        out = call("jnp.pad", out, Expr(text), mode=repr(jmode) if jmode != "constant" else None,
                   constant_values=c.lit(value, "value") if value else None)
    cut = {d: f"{lo or ''}:{-hi if hi else ''}" for d, (lo, hi) in crops.items() if lo or hi}
    return c.index_expr(out, ndim, cut) if cut else out


def _negative(width) -> bool:
    return isinstance(width, int) and width < 0


def _pad_mode(mode):
    def handler(c, node):
        pads = list(c.raw("padding"))
        ndim = c.val("self").ndim
        widths = [(0, 0)] * ndim
        for i in range(len(pads) // 2):
            widths[ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
        return call("jnp.pad", c.x("self"), Expr(repr(tuple(widths))), mode=repr(mode))

    return handler


for _n in (1, 2, 3):
    op(f"aten.reflection_pad{_n}d.default")(_pad_mode("reflect"))
    op(f"aten.replication_pad{_n}d.default")(_pad_mode("edge"))


@op("aten.detach.default")
def detach(c, node):
    return call("lax.stop_gradient", c.x("self"))


@op("aten.to.dtype", "aten.to.device", "aten.to.dtype_layout", "aten._to_copy.default", "aten.type_as.default")
def to(c, node):
    target = c.out.dtype
    if str(target) == "torch.complex32":
        raise Unsupported("complex32 (torch.chalf), which JAX has no dtype for")
    if str(node.target) == "aten.type_as.default":  # `y.type_as(x)`: x's dtype, where x is in scope
        ref = c.body.dtype_of(c.raw("other"))
        if ref is not None:
            return Expr(f"{c.x('self').at(ATOM)}.astype({ref})")
    return Expr(f"{c.x('self').at(ATOM)}.astype({c.dtype(target, follow=node)})")


@op("aten.view.dtype")
def view_dtype(c, node):
    return call("lax.bitcast_convert_type", c.x("self"), c.dtype(c.out.dtype))


@op("getitem", "<built-in function getitem>")
def getitem(c, node):
    return Expr(f"{c.x_index(0).at(ATOM)}[{c.raw_index(1)}]")


@op("aten.numel.default")
def numel(c, node):
    return Expr(f"{c.x('self').at(ATOM)}.size")


@op("aten.one_hot.default")
def one_hot(c, node):
    classes = c.raw("num_classes")
    if classes is None or classes < 0:
        raise Unsupported("one_hot without num_classes")
    return method(call("jax.nn.one_hot", c.x("self"), c.lit(classes, "num_classes")), "astype", c.dtype(c.out.dtype))


@op("aten.broadcast_tensors.default")
def broadcast_tensors(c, node):
    return call("jnp.broadcast_arrays", *[c.x_item("tensors", i) for i in range(len(c.raw("tensors")))])
