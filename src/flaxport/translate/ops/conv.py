"""Convolutions, pooling and resampling on torch's (N, C, *spatial) layout, via the runtime helpers."""
from __future__ import annotations

from flaxport.translate.ops.table import ATOM, Expr, Outputs, Unsupported, call, op


def _ints(c, name, n, default):
    v = c.raw(name) if c.has(name) else default
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * n if len(v) == 1 else v)


@op("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default", "aten.conv1d.padding",
    "aten.conv2d.padding", "aten.conv3d.padding")
def conv(c, node):
    n = c.val("weight").ndim - 2
    padding = c.raw("padding") if c.has("padding") else 0
    padding = repr(padding) if isinstance(padding, str) else c.ints(_ints(c, "padding", n, 0), "padding")
    groups = c.raw("groups") if c.has("groups") else 1
    return _batched(c, lambda x: call(
        c.helper("conv"), x, c.x("weight"), c.x("bias") if c.has("bias") else "None",
        stride=c.ints(_ints(c, "stride", n, 1), "stride"), padding=padding,
        dilation=c.ints(_ints(c, "dilation", n, 1), "dilation") if set(_ints(c, "dilation", n, 1)) != {1} else None,
        groups=c.lit(groups, "groups") if groups != 1 else None, channels_last=_cl(c)))


def _cl(c):
    return "True" if c.channels_last else None


def _batched(c, conv_call):
    """conv_call(x) on a batch of one where torch takes an unbatched input (C, *S) (its result's batch dropped)."""
    x = c.x("input")
    if c.val("input").ndim == c.val("weight").ndim:
        return conv_call(x)
    return Expr(f"{conv_call(Expr(f'{x.at(ATOM)}[None]')).at(ATOM)}[0]")


@op("aten.conv_transpose1d.default", "aten.conv_transpose2d.input", "aten.conv_transpose3d.input")
def conv_transpose(c, node):
    n = c.val("weight").ndim - 2
    groups = c.raw("groups") if c.has("groups") else 1
    return _batched(c, lambda x: call(
        c.helper("conv_transpose"), x, c.x("weight"), c.x("bias") if c.has("bias") else "None",
        stride=c.ints(_ints(c, "stride", n, 1), "stride"), padding=c.ints(_ints(c, "padding", n, 0), "padding"),
        output_padding=c.ints(_ints(c, "output_padding", n, 0), "output_padding")
        if set(_ints(c, "output_padding", n, 0)) != {0} else None,
        groups=c.lit(groups, "groups") if groups != 1 else None,
        dilation=c.ints(_ints(c, "dilation", n, 1), "dilation") if set(_ints(c, "dilation", n, 1)) != {1} else None,
        channels_last=_cl(c)))


@op("aten.convolution.default")
def convolution(c, node):
    n = c.val("weight").ndim - 2
    groups = c.raw("groups")
    common = dict(stride=c.ints(_ints(c, "stride", n, 1), "stride"), padding=c.ints(_ints(c, "padding", n, 0), "padding"),
                  dilation=c.ints(_ints(c, "dilation", n, 1), "dilation"),
                  groups=c.lit(groups, "groups") if groups != 1 else None, channels_last=_cl(c))
    bias = c.x("bias") if c.has("bias") else "None"
    if c.raw("transposed"):
        return _batched(c, lambda x: call(c.helper("conv_transpose"), x, c.x("weight"), bias, output_padding=c.ints(
            _ints(c, "output_padding", n, 0), "output_padding"), **common))
    return _batched(c, lambda x: call(c.helper("conv"), x, c.x("weight"), bias, **common))


def _max_pool(c, node):
    n = len(c.raw("kernel_size"))
    kernel = _ints(c, "kernel_size", n, None)
    stride = _ints(c, "stride", n, None) if c.has("stride") and c.raw("stride") else kernel
    padding = _ints(c, "padding", n, 0)
    dilation = _ints(c, "dilation", n, 1)
    ceil = c.has("ceil_mode") and c.raw("ceil_mode")
    return call(c.helper("max_pool"), c.x("self"), c.ints(kernel, "kernel_size"),
                stride=c.ints(stride, "stride") if stride != kernel else None,
                padding=c.ints(padding, "padding") if set(padding) != {0} else None,
                dilation=c.ints(dilation, "dilation") if set(dilation) != {1} else None,
                ceil_mode="True" if ceil else None, channels_last=_cl(c))


op("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default")(_max_pool)


@op("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
    "aten.max_pool1d_with_indices.default")
def max_pool_with_indices(c, node):
    """(values, indices): the indices, where read, by their own helper (a flat position per window)."""
    n = len(c.raw("kernel_size"))
    kernel = _ints(c, "kernel_size", n, None)
    stride = _ints(c, "stride", n, None) if c.has("stride") and c.raw("stride") else kernel
    padding, dilation = _ints(c, "padding", n, 0), _ints(c, "dilation", n, 1)
    if c.channels_last:
        return Outputs((_max_pool(c, node), Unsupported("max-pool indices channels-last (--layout nhwc)")))
    indices = call(c.helper("max_pool_indices"), c.x("self"), c.ints(kernel, "kernel_size"),
                   stride=c.ints(stride, "stride") if stride != kernel else None,
                   padding=c.ints(padding, "padding") if set(padding) != {0} else None,
                   dilation=c.ints(dilation, "dilation") if set(dilation) != {1} else None,
                   ceil_mode="True" if c.has("ceil_mode") and c.raw("ceil_mode") else None)
    return Outputs((_max_pool(c, node), indices))


@op("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def avg_pool(c, node):
    n = len(c.raw("kernel_size"))
    kernel = _ints(c, "kernel_size", n, None)
    stride = _ints(c, "stride", n, None) if c.has("stride") and c.raw("stride") else kernel
    padding = _ints(c, "padding", n, 0)
    ceil = c.has("ceil_mode") and c.raw("ceil_mode")
    include = c.raw("count_include_pad") if c.has("count_include_pad") else True
    divisor = c.raw("divisor_override") if c.has("divisor_override") else None
    return call(c.helper("avg_pool"), c.x("self"), c.ints(kernel, "kernel_size"),
                stride=c.ints(stride, "stride") if stride != kernel else None,
                padding=c.ints(padding, "padding") if set(padding) != {0} else None,
                ceil_mode="True" if ceil else None,
                count_include_pad="False" if not include and set(padding) != {0} else None,
                divisor_override=c.lit(divisor, "divisor_override") if divisor else None, channels_last=_cl(c))


@op("aten.adaptive_avg_pool1d.default", "aten.adaptive_avg_pool2d.default", "aten.adaptive_avg_pool3d.default",
    "aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def adaptive_avg_pool(c, node):
    size = tuple(c.raw("output_size"))
    n = len(size)
    if all(s == 1 for s in size):  # a global average: a mean over the spatial axes
        ndim = c.val("self").ndim
        axes = tuple(range(ndim - n - 1, ndim - 1)) if c.channels_last else tuple(range(ndim - n, ndim))
        return call("jnp.mean", c.x("self"), axis=repr(axes), keepdims="True")
    return call(c.helper("adaptive_avg_pool"), c.x("self"), c.ints(size, "output_size"), channels_last=_cl(c))


@op("aten.adaptive_max_pool1d.default", "aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def adaptive_max_pool(c, node):
    size = tuple(c.raw("output_size"))
    indices = call(c.helper("adaptive_max_pool_indices"), c.x("self"), c.ints(size, "output_size"))
    return Outputs((call(c.helper("adaptive_max_pool"), c.x("self"), c.ints(size, "output_size")), indices))


@op("aten.fractional_max_pool2d.default", "aten.fractional_max_pool3d.default")
def fractional_max_pool(c, node):
    """(values, indices) at the windows torch's random samples (an input of the op) place."""
    if c.channels_last:
        raise Unsupported("fractional max-pool channels-last (--layout nhwc)")
    return call(c.helper("fractional_max_pool"), c.x("self"), c.ints(c.raw("kernel_size"), "kernel_size"),
                c.ints(c.raw("output_size"), "output_size"), c.x("random_samples"))


@op("aten.max_unpool2d.default", "aten.max_unpool3d.default")
def max_unpool(c, node):
    return call(c.helper("max_unpool"), c.x("self"), c.x("indices"), c.size("output_size"))


def _size_and_scale(c):
    """(size=..., scale_factor=...) keywords: the scale factors when torch had them, else the size."""
    if c.has("scale_factors") and c.raw("scale_factors"):
        return {"scale_factor": c.ints(tuple(float(s) for s in c.raw("scale_factors")), "scale_factor")}
    return {"size": c.size(list(c.out.shape)[2:], hint="size")}  # torch's (H, W) order either way


@op("aten.upsample_nearest1d.vec", "aten.upsample_nearest2d.vec", "aten.upsample_nearest3d.vec",
    "aten._upsample_nearest_exact1d.vec", "aten._upsample_nearest_exact2d.vec", "aten._upsample_nearest_exact3d.vec")
def upsample_nearest(c, node):
    exact = "exact" in str(node.target)
    return call(c.helper("interpolate_nearest"), c.x("input"), **_size_and_scale(c), exact="True" if exact else None,
                channels_last=_cl(c))


@op("aten.upsample_linear1d.vec", "aten.upsample_bilinear2d.vec", "aten.upsample_trilinear3d.vec")
def upsample_linear(c, node):
    align = c.raw("align_corners")
    sizes = {"size": c.size(list(c.out.shape)[2:], hint="size")} if align else _size_and_scale(c)
    return call(c.helper("interpolate_linear"), c.x("input"), **sizes, align_corners="True" if align else None,
                channels_last=_cl(c))


@op("aten._upsample_bilinear2d_aa.default", "aten._upsample_bicubic2d_aa.default")
def upsample_antialias(c, node):
    if c.channels_last:
        raise Unsupported("antialiased interpolation channels-last (--layout nhwc)")
    scales = [c.raw(k) if c.has(k) else None for k in ("scales_h", "scales_w")]
    align = c.raw("align_corners")
    return call(c.helper("interpolate_antialias"), c.x("self"), c.size(list(c.out.shape)[2:], hint="size"),
                mode="'bicubic'" if "bicubic" in str(node.target) else None, align_corners="True" if align else None,
                scale_factor=c.ints(tuple(float(s) for s in scales), "scale_factor")
                if all(s is not None for s in scales) and not align else None)


@op("aten.pixel_shuffle.default")
def pixel_shuffle(c, node):
    return call(c.helper("pixel_shuffle"), c.x("self"), c.lit(c.raw("upscale_factor"), "upscale_factor"))


@op("aten.channel_shuffle.default", "aten.native_channel_shuffle.default")
def channel_shuffle(c, node):
    return call(c.helper("channel_shuffle"), c.x("self"), c.lit(c.raw("groups"), "groups"))


@op("aten.affine_grid_generator.default")
def affine_grid(c, node):
    if len(c.raw("size")) != 4:
        raise Unsupported("a 3-D affine_grid")
    return call(c.helper("affine_grid"), c.x("theta"), c.size("size"),
                align_corners="True" if c.raw("align_corners") else None)


@op("aten.grid_sampler.default", "aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default")
def grid_sampler(c, node):
    mode = {0: "bilinear", 1: "nearest"}.get(c.raw("interpolation_mode"))
    padding = {0: "zeros", 1: "border", 2: "reflection"}[c.raw("padding_mode")]
    if mode is None:
        raise Unsupported("grid_sample mode='bicubic'")
    return call(c.helper("grid_sample"), c.x("input"), c.x("grid"), mode=repr(mode) if mode != "bilinear" else None,
                padding_mode=repr(padding) if padding != "zeros" else None,
                align_corners="True" if c.raw("align_corners") else None)


@op("aten.im2col.default")
def im2col(c, node):
    if c.val("self").ndim != 4:
        raise Unsupported("F.unfold of an unbatched input")
    return call(c.helper("unfold"), c.x("self"), c.ints(c.raw("kernel_size"), "kernel_size"),
                c.ints(c.raw("dilation"), "dilation"), c.ints(c.raw("padding"), "padding"),
                c.ints(c.raw("stride"), "stride"))


@op("aten.col2im.default")
def col2im(c, node):
    if c.val("self").ndim != 3:
        raise Unsupported("F.fold of an unbatched input")
    return call(c.helper("fold"), c.x("self"), c.size("output_size"), c.ints(c.raw("kernel_size"), "kernel_size"),
                c.ints(c.raw("dilation"), "dilation"), c.ints(c.raw("padding"), "padding"),
                c.ints(c.raw("stride"), "stride"))
