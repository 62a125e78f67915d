"""`--layout nhwc`: which values an image model keeps channels-last, decided per value.

torch's image tensors are (N, C, H, W). XLA:CPU runs convolutions and pooling faster on
(N, H, W, C) (a CNN forward: 1.8x). In nhwc mode every 4-D value produced by a
convolution, normalisation, pooling or resampling op is kept channels-last ('last'), and
ops that work on either layout (elementwise arithmetic and activations, channel
concatenation, means over the spatial axes) keep what they are given. Any other op
(reshape, flatten, permute, indexing, matmul...) reads torch's layout, so a transpose is
written where such an op reads a channels-last value, and where the model returns one.
The inputs and outputs of the model stay in torch's layout. Layouts come from the graph,
never guessed from shapes (an (N, 32, 32, 32) tensor says nothing about its layout).
"""
from __future__ import annotations

from flaxport.translate.ops.table import schema_arguments

LAST = "last"
TORCH = "torch"
TO_LAST = (0, 2, 3, 1)  # torch (N, C, H, W) -> (N, H, W, C)
TO_TORCH = (0, 3, 1, 2)

# Ops computing channels-last natively: their main tensor argument is read channels-last.
NATIVE = {"aten.conv2d.default": "input", "aten.conv2d.padding": "input", "aten.conv_transpose2d.input": "input",
          "aten.convolution.default": "input", "aten.batch_norm.default": "input", "aten.group_norm.default": "input",
          "aten.max_pool2d.default": "self", "aten.avg_pool2d.default": "self",
          "aten.adaptive_avg_pool2d.default": "self", "aten._adaptive_avg_pool2d.default": "self",
          "aten.upsample_nearest2d.vec": "input", "aten.upsample_bilinear2d.vec": "input",
          "aten._upsample_nearest_exact2d.vec": "input"}
# Elementwise: any layout, as long as every tensor operand is 4-D (or a scalar).
POINTWISE = {f"aten.{n}" for n in (
    "add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Scalar", "mul.Tensor", "mul.Scalar", "div.Tensor",
    "div.Scalar", "relu.default", "gelu.default", "silu.default", "sigmoid.default", "tanh.default",
    "hardswish.default", "hardsigmoid.default", "hardtanh.default", "leaky_relu.default", "elu.default",
    "mish.default", "neg.default", "exp.default", "clamp.default", "clamp_min.default", "clamp_max.default",
    "maximum.default", "minimum.default", "where.self", "pow.Tensor_Scalar", "sqrt.default", "rsqrt.default",
    "abs.default", "dropout.default", "feature_dropout.default", "sin.default", "cos.default", "softplus.default",
    "square.default", "log.default", "erf.default", "masked_fill.Scalar")}
SPATIAL_REDUCE = {"aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default"}


def _ndim(v) -> int:
    val = v.meta.get("val") if hasattr(v, "meta") else None
    return getattr(val, "ndim", 0) if hasattr(val, "shape") else 0


def _tensor_args(node):
    return [a for a in node.all_input_nodes if hasattr(a.meta.get("val"), "shape")]


def assign(capture, forced=frozenset()) -> dict:
    """{fx node: LAST} for the values kept channels-last (every other value is in torch's layout).
    `forced`: nodes made to compute in torch's layout (a layer inside nn.Sequential that cannot be
    handed a transposed input)."""
    layout = {}
    for node in capture.graph.nodes:
        if node.op != "call_function" or node in forced:
            continue
        target = str(node.target)
        if target in NATIVE and _ndim(node) == 4 and _ndim(_main(node)) == 4:
            layout[node] = LAST
        elif target in POINTWISE and _ndim(node) == 4:
            args = _tensor_args(node)
            if all(_ndim(a) in (0, 4) for a in args) and any(layout.get(a) == LAST for a in args):
                layout[node] = LAST
        elif target == "aten.cat.default" and _ndim(node) == 4:
            items = node.args[0]
            if all(_ndim(a) == 4 for a in items) and any(layout.get(a) == LAST for a in items):
                layout[node] = LAST
        elif target in SPATIAL_REDUCE and _ndim(node) == 4 and _spatial_dims(node):
            if layout.get(node.args[0]) == LAST:
                layout[node] = LAST
        elif target in ("getitem", "<built-in function getitem>") and layout.get(node.args[0]) == LAST:
            layout[node] = LAST
    return layout


def image_value(node) -> bool:
    """Whether a 4-D value comes from a convolution, normalisation, pooling or resampling op
    through elementwise ops and channel concatenations only: the values `assign` keeps
    channels-last in nhwc mode, and whose torch-layout code computes channels-last inside."""
    seen, todo = set(), [node]
    while todo:
        v = todo.pop()
        if v in seen or not hasattr(v, "target") or _ndim(v) != 4:
            continue
        seen.add(v)
        target = str(v.target)
        if target in NATIVE:
            return True
        if target in POINTWISE or target == "aten.cat.default":
            todo.extend(_tensor_args(v))
    return False


def _main(node):
    name = NATIVE[str(node.target)]
    return schema_arguments(node).get(name)


def _spatial_dims(node) -> bool:
    """A reduction over exactly the two spatial axes (what a global pool is)."""
    dims = node.args[1] if len(node.args) > 1 else None
    if not isinstance(dims, (list, tuple)):
        return False
    return sorted(d % 4 for d in dims) == [2, 3]


def wanted(node, arg, layout: dict) -> str:
    """The layout in which `node` reads its argument `arg`."""
    if _ndim(arg) != 4:
        return TORCH
    target = str(node.target)
    if target in NATIVE:
        return LAST if layout.get(node) == LAST and arg is _main(node) else TORCH
    if target in POINTWISE or target == "aten.cat.default":
        return layout.get(node, TORCH)
    if target in SPATIAL_REDUCE and _spatial_dims(node):
        return layout.get(arg, TORCH)  # a reduction over (H, W) reads either layout
    if target in ("getitem", "<built-in function getitem>"):
        return layout.get(arg, TORCH)
    return TORCH


def to_layout_dim(dim: int, ndim: int = 4) -> int:
    """torch's dim d of a 4-D value, as an axis of its channels-last array."""
    return TO_LAST.index(dim % ndim)


FLATTENS = {"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints"}


def flattened_linears(capture, channels_last: dict) -> dict:
    """{flatten node: (weight name, (C, H, W))} for the flattens a Linear reads straight away.

    torch flattens an image (N, C, H, W) in (c, h, w) order; a channels-last array flattens in
    (h, w, c) order, and on XLA:CPU the transpose between the two, and the fusion it splits,
    cost a CNN forward a tenth of its time. So where a 4-D value computed channels-last
    (`channels_last`: what `assign` returns) is flattened and read only by a linear whose
    weight nothing else uses, the translation flattens it channels-last and holds that
    weight's columns in (h, w, c) order instead (set when the weights are loaded; torch's
    order wherever they are saved). The flatten and the linear must run in one module's
    forward (or the linear in an nn.Linear it calls), so no compared submodule output is
    ever the permuted value. A 1x1 map (after a global pool) has one order already. (H, W)
    are the example's: the linear fixes only C * H * W, so the file checks (H, W) where it
    flattens.
    """
    frames = capture.node_frames()
    out = {}
    for node in capture.graph.nodes:
        if str(node.target) not in FLATTENS or _ndim(node) != 2 or not node.args:
            continue
        x = node.args[0]
        if _ndim(x) != 4 or channels_last.get(x) != LAST or len(node.users) != 1:
            continue
        (linear,) = node.users
        if str(linear.target) != "aten.linear.default" or linear.args[0] is not node:
            continue
        weight = linear.args[1]
        ph = capture.placeholders.get(weight)
        if ph is None or ph.kind != "param" or len(weight.users) != 1:
            continue
        shape = [_example_size(s) for s in x.meta["val"].shape]
        flat = [_example_size(s) for s in node.meta["val"].shape]
        if None in shape[1:] or flat[1] != shape[1] * shape[2] * shape[3] or shape[2] * shape[3] == 1:
            continue
        here, there = frames.get(node), frames.get(linear)
        if here is None or not (there is here or (there.parent is here and there.items == [linear])):
            continue
        out[node] = (ph.target, tuple(shape[1:]))
    return out


def _example_size(size):
    """A size's value in the example (a symbolic one's hint), None where unknown."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def columns_torch(weight, chw):
    """Undoes runtime.functions.columns_channels_last: (out, H * W * C) -> torch's (c, h, w) order."""
    c, h, w = chw
    return weight.reshape(-1, h, w, c).transpose(0, 3, 1, 2).reshape(weight.shape)
