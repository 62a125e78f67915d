"""The convolution `translate --conv native` writes: flaxport's native CPU kernels where they run.

`_convolution` here takes the place of functions.py's in the generated file. It calls
`flaxport.kernels.conv` (a direct NHWC convolution through the XLA FFI, docs/cpu.md) for
the convolutions it can run, and XLA's convolution for the rest, and where flaxport is not
installed: the file still runs on jax, flax and numpy alone. Both compute torch's sums;
float32 rounding differs at the 1e-6 relative level.
"""
from jax import lax

# The generated file writes this import in a try block: without flaxport, flaxport_conv is None.
from flaxport.kernels import conv as flaxport_conv


def _convolution(x, weight, stride, padding, dilation, groups):
    """x (N, *S, C), weight (O, C/groups, *K), padding [(low, high)] per axis -> (N, *S', O).

    flaxport's kernel runs 2-D convolutions with square kernels, stride 1, no dilation or
    groups and the same padding on every side, in float32 on a CPU, with O a multiple of 16
    (`flaxport_conv.supported`); XLA's convolution runs everything else.
    """
    n = weight.ndim - 2
    if flaxport_conv is not None and n == 2 and groups == 1 and set(stride) | set(dilation) == {1}:
        kernel = weight.transpose(2, 3, 1, 0)  # (kh, kw, C, O)
        pad = padding[0][0]
        even = all(tuple(side) == (pad, pad) for side in padding)
        if even and flaxport_conv.supported(x.shape, kernel.shape, 1, pad, x.dtype, kernel.dtype):
            return flaxport_conv.native_conv2d(x, kernel, pad)
    spatial = "DHW"[-n:]
    return lax.conv_general_dilated(x, weight, stride, padding, rhs_dilation=dilation, feature_group_count=groups,
                                    dimension_numbers=("N" + spatial + "C", "OI" + spatial, "N" + spatial + "C"))
