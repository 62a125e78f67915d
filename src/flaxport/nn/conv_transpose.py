"""ConvTranspose{1,2,3}d with torch.nn semantics, channels-last.

torch's transposed convolution is the gradient of a convolution: each input cell
scatters `weight[cin, cout]` (shape (in, out/groups, *k)) into the output. As a plain
convolution that is: dilate the input by the stride, pad each side by
d*(k-1) - padding (plus output_padding on the high side), and convolve with the
spatially *flipped* kernel. Stock `flax.linen.ConvTranspose` does not flip
(transpose_kernel=False) and takes lax padding, so torch weights copied straight into it
give other numbers (docs: porting pitfalls, ConvTranspose).

Here the kernel is stored unflipped, in the torch order of the channel axes:
  torch weight (in, out, *k)  ->  kernel (*k, in, out) = weight.permute(2, ..., 0, 1)
and the flip happens in the forward pass (flaxport.runtime's conv_transpose). groups=1 only.
"""
from __future__ import annotations

import math

from flax import linen as nn

from flaxport.nn.conv_nd import as_tuple
from flaxport.nn.linear import torch_bias_init
# the transposed convolution a translated model runs (flip, dilate, pad: docs/porting.md, entry 7)
from flaxport.runtime import functions


def conv_transpose(x, kernel, stride, padding, output_padding, dilation):
    """torch conv_transpose{n}d on channels-last x (N, *spatial, in), kernel (*k, in, out) -> (N, *out, out).

    Output size per axis: (L - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
    """
    n = kernel.ndim - 2
    s, op, d = (as_tuple(v, n, w) for v, w in ((stride, "stride"), (output_padding, "output_padding"),
                                               (dilation, "dilation")))
    for i in range(n):
        if not op[i] < max(s[i], d[i]):
            raise ValueError(f"output_padding {op[i]} must be smaller than stride {s[i]} or dilation {d[i]} "
                             "(torch's rule)")
    weight = kernel.transpose((n, n + 1) + tuple(range(n)))  # torch's (in, out, *k)
    return functions.conv_transpose(x, weight, None, s, as_tuple(padding, n, "padding"), op, 1, d,
                                    channels_last=True)


class ConvTransposeNd(nn.Module):
    """torch.nn.ConvTranspose{ndim}d(cin, features, kernel_size, stride, padding, output_padding, dilation=..).

    x (N, *spatial, cin) -> (N, *out, features); params kernel (*k, cin, features), bias (features,).
    """

    features: int
    kernel_size: int | tuple = 3
    stride: int | tuple = 1
    padding: int | tuple = 0
    output_padding: int | tuple = 0
    dilation: int | tuple = 1
    use_bias: bool = True
    ndim: int = 2

    @nn.compact
    def __call__(self, x):
        n = self.ndim
        if x.ndim != n + 2:
            raise ValueError(f"ConvTranspose{n}d expects (N, *{n} spatial, C) input, got shape {x.shape}")
        k = as_tuple(self.kernel_size, n, "kernel_size")
        # torch's U(+-1/sqrt(fan_in)) for weight and bias, with fan_in from weight.size(1) =
        # out channels for a transposed conv.
        fan_in = self.features * math.prod(k)
        kernel = self.param("kernel", torch_bias_init(fan_in), k + (x.shape[-1], self.features))
        y = conv_transpose(x, kernel, self.stride, self.padding, self.output_padding, self.dilation)
        if self.use_bias:
            y = y + self.param("bias", torch_bias_init(fan_in), (self.features,))
        return y


class ConvTranspose1d(ConvTransposeNd):
    ndim: int = 1


class ConvTranspose2d(ConvTransposeNd):
    ndim: int = 2


class ConvTranspose3d(ConvTransposeNd):
    ndim: int = 3
