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
                                        conv_transpose, fusion_boundary, group_norm, gru_scan, layer_norm, lstm_scan,
                                        rnn_scan, scaled_dot_product_attention)


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
        y = fusion_boundary(x) @ self.weight[...].T
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


class MultiheadAttention(nnx.Module):
    """torch.nn.MultiheadAttention, with its parameter names: `in_proj_weight` (3E, E) (or
    `q_proj_weight`, `k_proj_weight` (E, kdim), `v_proj_weight` (E, vdim) where the key or value
    width differs), `in_proj_bias` (3E), `out_proj`, `bias_k` / `bias_v` (1, 1, E).

    Masks as torch reads them: a boolean mask is True where attention is NOT allowed, a float
    mask is added to the scores; `key_padding_mask` (N, S), `attn_mask` (L, S) or (N * heads, L, S).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, *, rngs):
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.batch_first, self.add_zero_attn = batch_first, add_zero_attn
        def xavier(rows, cols):  # torch's xavier_uniform_
            return nnx.Param(_uniform(rngs, (rows, cols), math.sqrt(6 / (rows + cols))))

        if self.kdim == embed_dim and self.vdim == embed_dim:
            self.in_proj_weight = xavier(3 * embed_dim, embed_dim)
        else:
            self.q_proj_weight = xavier(embed_dim, embed_dim)
            self.k_proj_weight = xavier(embed_dim, self.kdim)
            self.v_proj_weight = xavier(embed_dim, self.vdim)
        self.in_proj_bias = nnx.Param(jnp.zeros((3 * embed_dim,))) if bias else nnx.data(None)
        self.out_proj = Linear(embed_dim, embed_dim, bias, rngs=rngs)
        if bias:
            self.out_proj.bias = nnx.Param(jnp.zeros((embed_dim,)))
        for name in ("bias_k", "bias_v"):  # torch's xavier_normal_ on (1, 1, E): std sqrt(1 / E)
            normal = jax.random.normal(rngs.params(), (1, 1, embed_dim)) * math.sqrt(1 / embed_dim)
            setattr(self, name, nnx.Param(normal) if add_bias_kv else nnx.data(None))
        self.attention_dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                 average_attn_weights=True, is_causal=False):
        """query (L, N, E), key (S, N, kdim), value (S, N, vdim); (N, L, E)... where batch_first;
        (L, E)... unbatched -> (attn_output like query, attention weights (N, L, S) averaged over
        heads or (N, heads, L, S); None where need_weights is False)."""
        batched = query.ndim == 3
        if not batched:  # one sequence: a batch of one, axis 1
            query, key, value = query[:, None], key[:, None], value[:, None]
            key_padding_mask = None if key_padding_mask is None else key_padding_mask[None]
        elif self.batch_first:
            query, key, value = (jnp.swapaxes(a, 0, 1) for a in (query, key, value))
        if is_causal and attn_mask is None:
            raise ValueError("MultiheadAttention: is_causal needs attn_mask, as in torch")
        length, batch, _ = query.shape
        q, k, v = self._project(query, key, value)  # (L, N, E), (S, N, E), (S, N, E)
        causal = is_causal and key_padding_mask is None and not need_weights  # torch: the mask is only a hint
        mask = None if causal else _additive(attn_mask, q.dtype)
        if mask is not None:  # (L, S), (1, L, S) or (N * heads, L, S) -> (1 or N, 1 or heads, L, S)
            mask = mask.reshape(1, 1, *mask.shape[-2:]) if mask.ndim == 2 or mask.shape[0] == 1 else \
                mask.reshape(batch, self.num_heads, *mask.shape[-2:])
        padding = _additive(key_padding_mask, q.dtype)
        if self.bias_k is not None:  # a learned key and value appended to every sequence
            k = jnp.concatenate([k, jnp.broadcast_to(self.bias_k[...], (1, batch, self.embed_dim))])
            v = jnp.concatenate([v, jnp.broadcast_to(self.bias_v[...], (1, batch, self.embed_dim))])
            mask, padding = _one_more_key(mask), _one_more_key(padding)
        q, k, v = (self._split_heads(a) for a in (q, k, v))  # (N, heads, L or S, head_dim)
        if self.add_zero_attn:  # a zero key and value appended after the projections
            k = jnp.concatenate([k, jnp.zeros_like(k[:, :, :1])], axis=2)
            v = jnp.concatenate([v, jnp.zeros_like(v[:, :, :1])], axis=2)
            mask, padding = _one_more_key(mask), _one_more_key(padding)
        if padding is not None:
            padding = padding[:, None, None, :]  # (N, 1, 1, S)
            mask = padding if mask is None else mask + padding
        if need_weights:
            scores = (q * math.sqrt(1.0 / self.head_dim)) @ jnp.swapaxes(k, -1, -2)
            weights = jax.nn.softmax(scores if mask is None else scores + mask, axis=-1)
            # dropped over (N * heads, L, S) as torch drops them (its masks replay in the proof), and
            # returned after dropout as torch returns them
            weights = self.attention_dropout(weights.reshape(-1, *weights.shape[2:])).reshape(weights.shape)
            attn = weights @ v
        else:
            attn = scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                dropout=self.attention_dropout)
        attn = attn.transpose(2, 0, 1, 3).reshape(length, batch, self.embed_dim)  # heads merged: (L, N, E)
        out = self.out_proj(attn)
        if not batched:
            out = out[:, 0]
        elif self.batch_first:
            out = jnp.swapaxes(out, 0, 1)
        if not need_weights:
            return out, None
        weights = weights.mean(axis=1) if average_attn_weights else weights
        return out, weights if batched else weights[0]

    def _project(self, query, key, value):
        bias = [None] * 3 if self.in_proj_bias is None else jnp.split(self.in_proj_bias[...], 3)
        if self.kdim == self.embed_dim and self.vdim == self.embed_dim:
            weights = jnp.split(self.in_proj_weight[...], 3)
        else:
            weights = [self.q_proj_weight[...], self.k_proj_weight[...], self.v_proj_weight[...]]
        return [x @ w.T if b is None else x @ w.T + b for x, w, b in zip((query, key, value), weights, bias)]

    def _split_heads(self, x):
        """(T, N, E) -> (N, heads, T, head_dim)."""
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2, 0, 3)


def _additive(mask, dtype):
    """A torch attention mask as scores to add: True (not allowed) -> -inf, a float mask as it is."""
    if mask is None or mask.dtype != jnp.bool_:
        return mask
    return jnp.where(mask, -jnp.inf, 0.0).astype(dtype)


def _one_more_key(mask):
    """A mask over keys (..., S) for S + 1 keys: the appended one allowed."""
    return None if mask is None else jnp.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, 1)])


def _ntuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
