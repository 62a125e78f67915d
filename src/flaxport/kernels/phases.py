"""The input gradient of a strided, dilated, padded convolution as stride-1 convolutions, one per phase.

A convolution y[o] = sum_k xp[o*s + k*d] w[k] (xp: x padded by lo) sends dy[o] w[k] to
xp[o*s + k*d]. The input cells of one residue r modulo s (x[r], x[r+s], ...) receive from
the taps k with k*d = r + lo (mod s) only, each shifted by a whole number of dy cells, so
their gradient is a stride-1 correlation of dy (padded) with those taps, flipped. The s^2
phases of a 2-D stride-s convolution are computed apart and interleaved: no zeros inserted
into dy and no multiply by zero, the same sums as XLA's transposed convolution.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
from jax import lax


class Phase(NamedTuple):
    """One residue r of one axis: cells x[r], x[r+s], ... (`count` of them) receive from kernel
    taps `taps` (ascending); dy is padded by `pad` (low, high; negative crops) and correlated
    with the taps flipped, spaced `dilation` apart."""
    count: int
    taps: tuple
    pad: tuple
    dilation: int


def axis_phases(length: int, kernel: int, stride: int, dilation: int, pad_low: int, out: int) -> list:
    """The phases of one axis, residue 0 first: x of `length` cells padded by pad_low at the start,
    a `kernel`-tap window with `stride` and `dilation`, `out` output cells."""
    phases = []
    for r in range(stride):
        count = len(range(r, length, stride))
        a = (r + pad_low) % stride
        m_start = (r + pad_low - a) // stride
        taps = tuple(k for k in range(kernel) if (k * dilation) % stride == a)
        if not taps or count == 0:
            phases.append(Phase(count, (), (0, 0), 1))
            continue
        shifts = [(k * dilation - a) // stride for k in taps]
        first, last = shifts[0], shifts[-1]
        step = shifts[1] - shifts[0] if len(shifts) > 1 else 1
        phases.append(Phase(count, taps, (last - m_start, count - first + m_start - out), step))
    return phases


def interleave(parts: list, stride: int, axis: int, length: int):
    """Cells of residue r of `axis` from parts[r] (each ceil(length/stride) long at most): the whole axis."""
    if stride == 1:
        return parts[0]
    longest = math.ceil(length / stride)
    padded = [jnp.pad(p, [(0, longest - p.shape[axis]) if i == axis else (0, 0) for i in range(p.ndim)])
              for p in parts]
    stacked = jnp.stack(padded, axis=axis + 1)  # (..., longest, stride, ...)
    shape = stacked.shape[:axis] + (longest * stride,) + stacked.shape[axis + 2:]
    return lax.slice_in_dim(stacked.reshape(shape), 0, length, axis=axis)


def input_gradient(dy, x_shape, kernel_hw, stride, dilation, pads, correlate):
    """dx (N, H, W, C) of a 2-D NHWC convolution, from dy (N, Ho, Wo, Co).

    kernel_hw: (kh, kw); stride, dilation: (sh, sw), (dh, dw); pads: ((top, bottom), (left, right)).
    correlate(dy, pads, rows, cols, dilation) -> the stride-1 correlation of dy, zero-padded by
    pads ((top, bottom), (left, right), none negative), with the kernel taps `rows` x `cols`
    flipped (and its channels transposed), dilated by `dilation`.
    """
    n, h, w = x_shape[:3]
    rows = axis_phases(h, kernel_hw[0], stride[0], dilation[0], pads[0][0], dy.shape[1])
    cols = axis_phases(w, kernel_hw[1], stride[1], dilation[1], pads[1][0], dy.shape[2])
    out_rows = []
    for rp in rows:
        parts = []
        for cp in cols:
            if not rp.taps or not cp.taps:
                parts.append(jnp.zeros((n, rp.count, cp.count, x_shape[3]), dy.dtype))
                continue
            # Negative pads crop dy here; the positive ones are the correlation's own padding.
            crop = tuple(tuple(min(p, 0) for p in phase.pad) + (0,) for phase in (rp, cp))
            cropped = dy
            if min(rp.pad + cp.pad) < 0:
                cropped = lax.pad(dy, jnp.zeros((), dy.dtype), ((0, 0, 0), *crop, (0, 0, 0)))
            grow = tuple(tuple(max(p, 0) for p in phase.pad) for phase in (rp, cp))
            parts.append(correlate(cropped, grow, rp.taps, cp.taps, (rp.dilation, cp.dilation)))
        out_rows.append(interleave(parts, stride[1], 2, w))
    return interleave(out_rows, stride[0], 1, h)
