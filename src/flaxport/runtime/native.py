"""The convolution a translated file writes by default: flaxport's native CPU kernels where they run.

`_convolution` here takes the place of functions.py's in the generated file. It calls
`flaxport.kernels.conv` (direct NHWC convolutions through the XLA FFI, docs/cpu.md) for
the convolutions it can run, and XLA's convolution for the rest, and where flaxport is not
installed: the file still runs on jax, flax and numpy alone. Both compute torch's sums;
float32 rounding differs at the 1e-6 relative level.
"""
# The generated file writes this import in a try block: without flaxport, flaxport_conv is None.
from flaxport.kernels import conv as flaxport_conv
from flaxport.runtime.functions import _xla_convolution


def _convolution(x, weight, stride, padding, dilation, groups):
    """x (N, *S, C), weight (O, C/groups, *K), padding [(low, high)] per axis -> (N, *S', O).

    flaxport's kernels run the 1-D and 2-D convolutions in float32 or bfloat16 on a CPU (any
    stride, dilation, padding and groups; `flaxport_conv.runs`); XLA's convolution runs the rest.
    """
    if flaxport_conv is not None and flaxport_conv.runs(x, weight, stride, padding, dilation, groups):
        return flaxport_conv.convolution(x, weight, stride, padding, dilation, groups)
    return _xla_convolution(x, weight, stride, padding, dilation, groups)
