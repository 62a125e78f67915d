"""torch.nn layers as Flax NNX modules, written to be copied into a generated model file.

Each keeps torch's parameter names, shapes and layouts (`weight` (out, in) for Linear,
(out, in / groups, *k) for convs, `running_mean`, `num_batches_tracked`, LSTM's
`weight_ih_l0` ...), so a torch state_dict loads by name with no key map and comes back
the same way. Constructors take torch's arguments and initialise as torch does.
NNX's `model.train()` / `model.eval()` switch `use_running_average` (BatchNorm) and
`deterministic` (dropout, and a translated module's own `self.training` branches).
"""
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax

from flaxport.runtime.functions import (_channels_first, _channels_last, batch_norm_channels_last, conv,
                                        conv_transpose, group_norm, gru_scan, layer_norm, lstm_scan, rnn_scan)


class Buffer(nnx.Variable):
    """A torch buffer or tensor constant that is not trained (and not in torch's state_dict
    when it was registered with persistent=False)."""


class TorchModule(nnx.Module):
    """An nnx.Module with torch's `self.training`, switched by NNX's train() / eval()."""

    deterministic = False

    @property
    def training(self):
        return not self.deterministic


def _uniform(rngs, shape, bound):
    """torch's default init for weights and biases: U(-bound, bound)."""
    return jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound)


class Linear(nnx.Module):
    """torch.nn.Linear: y = x W^T + b with W (out_features, in_features)."""

    def __init__(self, in_features, out_features, bias=True, *, rngs):
        bound = 1 / math.sqrt(in_features) if in_features else 0.0
        self.weight = nnx.Param(_uniform(rngs, (out_features, in_features), bound))
        self.bias = nnx.Param(_uniform(rngs, (out_features,), bound)) if bias else nnx.data(None)

    def __call__(self, x):
        y = x @ self.weight[...].T
        return y if self.bias is None else y + self.bias[...]


class _ConvNd(nnx.Module):
    """torch.nn.Conv{1,2,3}d on (N, C, *spatial): weight (out, in / groups, *kernel), explicit zero padding."""

    ndim = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 channels_last=False, *, rngs):
        n = self.ndim
        self.channels_last = channels_last
        self.kernel_size = _ntuple(kernel_size, n)
        self.stride, self.dilation, self.groups = _ntuple(stride, n), _ntuple(dilation, n), groups
        self.padding = padding if isinstance(padding, str) else _ntuple(padding, n)
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1 / math.sqrt(fan_in)
        self.weight = nnx.Param(_uniform(rngs, (out_channels, in_channels // groups) + self.kernel_size, bound))
        self.bias = nnx.Param(_uniform(rngs, (out_channels,), bound)) if bias else nnx.data(None)

    def __call__(self, x):
        bias = None if self.bias is None else self.bias[...]
        return conv(x, self.weight[...], bias, self.stride, self.padding, self.dilation, self.groups, self.channels_last)


class Conv1d(_ConvNd):
    ndim = 1


class Conv2d(_ConvNd):
    ndim = 2


class Conv3d(_ConvNd):
    ndim = 3


class _ConvTransposeNd(nnx.Module):
    """torch.nn.ConvTranspose{1,2,3}d: weight (in, out / groups, *kernel), the gradient of a conv."""

    ndim = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, channels_last=False, *, rngs):
        n = self.ndim
        self.channels_last = channels_last
        self.kernel_size = _ntuple(kernel_size, n)
        self.stride, self.padding, self.dilation = _ntuple(stride, n), _ntuple(padding, n), _ntuple(dilation, n)
        self.output_padding, self.groups = _ntuple(output_padding, n), groups
        # torch's fan_in for a transposed conv is weight.size(1) * prod(kernel) (docs/porting.md, entry 12)
        bound = 1 / math.sqrt(out_channels // groups * math.prod(self.kernel_size))
        self.weight = nnx.Param(_uniform(rngs, (in_channels, out_channels // groups) + self.kernel_size, bound))
        self.bias = nnx.Param(_uniform(rngs, (out_channels,), bound)) if bias else nnx.data(None)

    def __call__(self, x):
        bias = None if self.bias is None else self.bias[...]
        return conv_transpose(x, self.weight[...], bias, self.stride, self.padding, self.output_padding,
                              self.groups, self.dilation, self.channels_last)


class ConvTranspose1d(_ConvTransposeNd):
    ndim = 1


class ConvTranspose2d(_ConvTransposeNd):
    ndim = 2


class ConvTranspose3d(_ConvTransposeNd):
    ndim = 3


class _BatchNorm(nnx.Module):
    """torch.nn.BatchNorm{1,2,3}d over axis 1, with torch's running statistics.

    momentum is torch's (the weight of the new batch; None: a cumulative average over
    num_batches_tracked), the running variance is the unbiased batch variance, and
    num_batches_tracked counts the train-mode calls (docs/porting.md, entries 1, 2 and 4).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 channels_last=False, *, rngs=None):
        self.eps, self.momentum, self.channels_last = eps, momentum, channels_last
        self.use_running_average = False
        if affine:
            self.weight = nnx.Param(jnp.ones((num_features,)))
            self.bias = nnx.Param(jnp.zeros((num_features,)))
        else:
            self.weight, self.bias = nnx.data(None), nnx.data(None)
        if track_running_stats:
            self.running_mean = nnx.BatchStat(jnp.zeros((num_features,)))
            self.running_var = nnx.BatchStat(jnp.ones((num_features,)))
            self.num_batches_tracked = nnx.BatchStat(jnp.array(0))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = nnx.data(None)

    def __call__(self, x):
        if self.channels_last or x.ndim == 2:  # (N, *S, C) or (N, C)
            return self._normalize(x)
        return _channels_first(self._normalize(_channels_last(x, x.ndim - 2)), x.ndim - 2)

    def _normalize(self, x):
        """x (N, *S, C) -> normalised over all axes but the channels."""
        tracked = self.running_mean is not None
        training = not (self.use_running_average and tracked)
        y, mean, var = batch_norm_channels_last(
            x, self.running_mean[...] if tracked else None, self.running_var[...] if tracked else None,
            None if self.weight is None else self.weight[...], None if self.bias is None else self.bias[...],
            training, self.eps)
        if training and tracked:
            self._update_running_stats(mean, var, x.size // x.shape[-1])
        return y

    def _update_running_stats(self, mean, var, n):
        # set_value, not `[...] =`: an indexed write asks the traced value for its sharding, which
        # walks the whole trace so far, and a deep net's train step would trace in quadratic time
        self.num_batches_tracked.set_value(self.num_batches_tracked[...] + 1)
        m = 1.0 / self.num_batches_tracked[...] if self.momentum is None else self.momentum
        mean, var = lax.stop_gradient(mean), lax.stop_gradient(var)
        self.running_mean.set_value(m * mean + (1 - m) * self.running_mean[...])
        self.running_var.set_value(m * var * (n / max(n - 1, 1)) + (1 - m) * self.running_var[...])


class BatchNorm1d(_BatchNorm):
    pass


class BatchNorm2d(_BatchNorm):
    pass


class BatchNorm3d(_BatchNorm):
    pass


class LayerNorm(nnx.Module):
    """torch.nn.LayerNorm: torch's eps and two-pass variance (docs/porting.md, entry 9)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, *, rngs=None):
        self.normalized_shape = _ntuple(normalized_shape, 1)
        self.eps = eps
        self.weight = nnx.Param(jnp.ones(self.normalized_shape)) if elementwise_affine else nnx.data(None)
        self.bias = nnx.Param(jnp.zeros(self.normalized_shape)) if elementwise_affine and bias else nnx.data(None)

    def __call__(self, x):
        weight = None if self.weight is None else self.weight[...]
        bias = None if self.bias is None else self.bias[...]
        return layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class GroupNorm(nnx.Module):
    """torch.nn.GroupNorm on (N, C, *spatial): torch's group count and eps."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, channels_last=False, *, rngs=None):
        self.num_groups, self.eps, self.channels_last = num_groups, eps, channels_last
        self.weight = nnx.Param(jnp.ones((num_channels,))) if affine else nnx.data(None)
        self.bias = nnx.Param(jnp.zeros((num_channels,))) if affine else nnx.data(None)

    def __call__(self, x):
        weight = None if self.weight is None else self.weight[...]
        bias = None if self.bias is None else self.bias[...]
        return group_norm(x, self.num_groups, weight, bias, self.eps, self.channels_last)


class Embedding(nnx.Module):
    """torch.nn.Embedding: rows of `weight`; the padding_idx row gets no gradient, as in torch."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, *, rngs):
        self.padding_idx = padding_idx
        self.weight = nnx.Param(jax.random.normal(rngs.params(), (num_embeddings, embedding_dim)))

    def __call__(self, ids):
        weight = self.weight[...]
        if self.padding_idx is not None:
            weight = weight.at[self.padding_idx].set(lax.stop_gradient(weight[self.padding_idx]))
        return jnp.take(weight, ids, axis=0)


class _RNNBase(nnx.Module):
    """torch.nn.LSTM / GRU / RNN: num_layers, bidirectional, batch_first, dropout between layers.

    Parameters keep torch's names and both biases per gate (`bias_ih_l0`, `bias_hh_l0`):
    one summed bias matches the forward but not an optimizer step. Gates are stacked in
    torch's order (LSTM: i, f, g, o; GRU: r, z, n).
    """

    gates = 4

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, *, rngs):
        self.hidden_size, self.num_layers, self.batch_first = hidden_size, num_layers, batch_first
        self.directions = 2 if bidirectional else 1
        self.use_bias = bias
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        bound = 1 / math.sqrt(hidden_size)
        g = self.gates * hidden_size
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * self.directions
            for suffix in ("", "_reverse")[:self.directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}", nnx.Param(_uniform(rngs, (g, width), bound)))
                setattr(self, f"weight_hh_l{layer}{suffix}", nnx.Param(_uniform(rngs, (g, hidden_size), bound)))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}", nnx.Param(_uniform(rngs, (g,), bound)))
                    setattr(self, f"bias_hh_l{layer}{suffix}", nnx.Param(_uniform(rngs, (g,), bound)))

    def _weights(self, layer, suffix):
        names = ("weight_ih", "weight_hh") + (("bias_ih", "bias_hh") if self.use_bias else ())
        return [getattr(self, f"{name}_l{layer}{suffix}")[...] for name in names]

    def _run(self, x, states):
        """x (T, B, F) time-major; states: per (layer, direction) initial state -> (outputs, final states)."""
        finals = []
        for layer in range(self.num_layers):
            if layer > 0:
                x = self.dropout(x)
            outs = []
            for d, suffix in enumerate(("", "_reverse")[:self.directions]):
                w_ih, w_hh, *biases = self._weights(layer, suffix)
                b_ih, b_hh = biases or (None, None)
                xw = x @ w_ih.T if b_ih is None else x @ w_ih.T + b_ih  # every step's input gates at once
                ys, final = self._scan(xw, w_hh.T, b_hh, states[layer * self.directions + d], reverse=d == 1)
                outs.append(ys)
                finals.append(final)
            x = outs[0] if self.directions == 1 else jnp.concatenate(outs, axis=-1)
        return x, finals

    def __call__(self, x, hx=None):
        """x (B, T, F) if batch_first else (T, B, F) -> (output, h_n), h_n (num_layers * directions, B, hidden)
        (GRU, RNN; LSTM's state is (h, c))."""
        x = jnp.swapaxes(x, 0, 1) if self.batch_first else x
        n = self.num_layers * self.directions
        h0 = jnp.zeros((n, x.shape[1], self.hidden_size), x.dtype) if hx is None else hx
        y, finals = self._run(x, [h0[i] for i in range(n)])
        y = jnp.swapaxes(y, 0, 1) if self.batch_first else y
        return y, jnp.stack(finals)


class LSTM(_RNNBase):
    """torch.nn.LSTM -> (output, (h_n, c_n)); h_n, c_n (num_layers * directions, B, hidden)."""

    gates = 4

    def __call__(self, x, hx=None):
        x = jnp.swapaxes(x, 0, 1) if self.batch_first else x
        n = self.num_layers * self.directions
        zeros = jnp.zeros((n, x.shape[1], self.hidden_size), x.dtype)
        h0, c0 = (zeros, zeros) if hx is None else hx
        y, finals = self._run(x, [(h0[i], c0[i]) for i in range(n)])
        y = jnp.swapaxes(y, 0, 1) if self.batch_first else y
        return y, (jnp.stack([h for h, _ in finals]), jnp.stack([c for _, c in finals]))

    def _scan(self, xw, w_hh, b_hh, state, reverse):
        ys, h, c = lstm_scan(xw, w_hh, b_hh, *state, reverse=reverse)
        return ys, (h, c)


class GRU(_RNNBase):
    """torch.nn.GRU -> (output, h_n); n = tanh(W_in x + b_in + r * (W_hn h + b_hn)) as in torch."""

    gates = 3

    def _scan(self, xw, w_hh, b_hh, h, reverse):
        return gru_scan(xw, w_hh, b_hh, h, reverse=reverse)


class RNN(_RNNBase):
    """torch.nn.RNN -> (output, h_n): h' = tanh(W_ih x + b_ih + W_hh h + b_hh) (or relu)."""

    gates = 1

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, rngs):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, rngs=rngs)
        self.nonlinearity = nonlinearity

    def _scan(self, xw, w_hh, b_hh, h, reverse):
        return rnn_scan(xw, w_hh, b_hh, h, self.nonlinearity, reverse=reverse)


def _ntuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
