"""LSTM and GRU with torch.nn semantics, in Flax: torch's gates, layouts, and both biases.

Flax's `LSTMCell` / `GRUCell` keep one bias per gate; torch keeps two, `bias_ih` and
`bias_hh`. Summing them ports the forward exactly and trains differently: an optimizer
that normalises per parameter (Adam, RMSprop, Adagrad) moves each of torch's two biases
by about lr, so their sum by about 2 lr, where the one Flax bias moves by lr
(docs/porting.md, "LSTM/GRU: two biases per gate"). GRU's new-gate bias `b_hn` sits
inside `r * (W_hn h + b_hn)`, so for GRU the sum is not even the same forward.

Here each layer and direction owns torch's four tensors under Flax names:
  torch weight_ih_l{k}[_reverse] (G*H, I)  ->  kernel_ih_l{k}[_reverse] (I, G*H) = weight.T
  torch weight_hh_l{k}[_reverse] (G*H, H)  ->  kernel_hh_l{k}[_reverse] (H, G*H) = weight.T
  torch bias_ih_l{k}, bias_hh_l{k} (G*H,)  ->  bias_ih_l{k}, bias_hh_l{k}
with torch's gate order (LSTM: i, f, g, o; GRU: r, z, n; G = 4 or 3) and torch's init
U(+-1/sqrt(H)) for every tensor. Inputs and outputs are torch's: (L, N, I) time-major, or
(N, L, I) with batch_first, or unbatched (L, I); the initial and final states are
(num_layers * D, N, H). Dropout between layers (not after the last) in train mode
(`deterministic=False`), as torch. proj_size is not supported.
"""
from __future__ import annotations

import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn

from flaxport.errors import UserError
# the recurrence, the same functions a translated LSTM / GRU runs
from flaxport.runtime.functions import gru_scan, lstm_scan


def _uniform(bound: float):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


class Recurrent(nn.Module):
    """What LSTM and GRU share: torch's layers, directions, dropout between layers and unbatched input."""

    hidden_size: int
    num_layers: int = 1
    bias: bool = True
    batch_first: bool = False
    dropout: float = 0.0
    bidirectional: bool = False
    proj_size: int = 0
    param_dtype: jnp.dtype = jnp.float32

    gates: ClassVar[int] = 4
    torch_name: ClassVar[str] = "LSTM"

    def _states(self, hx, n, dtype):
        raise NotImplementedError

    @nn.compact
    def __call__(self, x, hx=None, *, deterministic: bool = True):
        if self.proj_size:
            raise UserError(f"flaxport.nn.{self.torch_name}(proj_size={self.proj_size}) is not supported: port "
                            "the projection as a Linear after an LSTM without it")
        unbatched = x.ndim == 2
        xs = x[:, None] if unbatched else (jnp.swapaxes(x, 0, 1) if self.batch_first else x)  # (L, N, I)
        if hx is not None and unbatched:
            hx = jax.tree.map(lambda s: s[:, None], hx)
        h_size, d = self.hidden_size, 2 if self.bidirectional else 1
        states = self._states(hx, xs.shape[1], xs.dtype)  # [(h0,) or (h0, c0)] per layer and direction
        init = _uniform(1.0 / math.sqrt(h_size))
        finals = []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(d):
                sfx = f"_l{layer}" + ("_reverse" if direction else "")
                w_ih = self.param("kernel_ih" + sfx, init, (xs.shape[-1], self.gates * h_size), self.param_dtype)
                w_hh = self.param("kernel_hh" + sfx, init, (h_size, self.gates * h_size), self.param_dtype)
                b_ih = self.param("bias_ih" + sfx, init, (self.gates * h_size,), self.param_dtype) if self.bias else None
                b_hh = self.param("bias_hh" + sfx, init, (self.gates * h_size,), self.param_dtype) if self.bias else None
                xw = xs @ w_ih if b_ih is None else xs @ w_ih + b_ih
                ys, *final = self._scan(xw, w_hh, b_hh, states[layer * d + direction], bool(direction))
                outs.append(ys)
                finals.append(final)
            xs = outs[0] if d == 1 else jnp.concatenate(outs, axis=-1)
            if self.dropout and layer < self.num_layers - 1:
                xs = nn.Dropout(self.dropout)(xs, deterministic=deterministic)
        out = xs[:, 0] if unbatched else (jnp.swapaxes(xs, 0, 1) if self.batch_first else xs)
        stacked = [jnp.stack(s) for s in zip(*finals)]  # each (num_layers * D, N, H)
        if unbatched:
            stacked = [s[:, 0] for s in stacked]
        return out, (stacked[0] if len(stacked) == 1 else tuple(stacked))


class LSTM(Recurrent):
    """torch.nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional).

    __call__(x, (h0, c0) or None, deterministic=True) -> (output, (h_n, c_n)); output
    (L, N, D*H) or (N, L, D*H) with batch_first; h_n, c_n (num_layers*D, N, H).
    """

    gates: ClassVar[int] = 4
    torch_name: ClassVar[str] = "LSTM"

    def _states(self, hx, n, dtype):
        count = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            zeros = jnp.zeros((count, n, self.hidden_size), dtype)
            hx = (zeros, zeros)
        return [(hx[0][i], hx[1][i]) for i in range(count)]

    def _scan(self, xw, w_hh, b_hh, state, reverse):
        return lstm_scan(xw, w_hh, b_hh, state[0], state[1], reverse)


class GRU(Recurrent):
    """torch.nn.GRU(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional).

    __call__(x, h0 or None, deterministic=True) -> (output, h_n); shapes as LSTM's.
    """

    gates: ClassVar[int] = 3
    torch_name: ClassVar[str] = "GRU"

    def _states(self, hx, n, dtype):
        count = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            hx = jnp.zeros((count, n, self.hidden_size), dtype)
        return [(hx[i],) for i in range(count)]

    def _scan(self, xw, w_hh, b_hh, state, reverse):
        return gru_scan(xw, w_hh, b_hh, state[0], reverse)
