"""optax transformations that take torch.optim's steps where optax has none that does.

Each is self-contained (jax, jnp, optax and NamedTuple only), so train_step.py carries the
source of those it uses. Those that end before the learning rate return the step torch
multiplies by -lr; those torch computes the learning rate into (ASGD's eta, Rprop's step
sizes, Adafactor's relative step, Muon's adjusted rate) return the whole update and take
`learning_rate` (a number or a schedule of the step count) themselves. Scalars torch keeps
as tensors (NAdam's mu_product, ASGD's eta and mu) are kept in the parameters' float type.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax


def rate_at(learning_rate, count):
    """The learning rate at step `count`: a number, or a schedule of the step count."""
    return learning_rate(count) if callable(learning_rate) else learning_rate


class ScaleByTorchAdagradState(NamedTuple):
    count: jax.Array  # steps taken, torch's state['step']
    sum: optax.Updates  # torch's state['sum']


def scale_by_torch_adagrad(eps: float = 1e-10, initial_accumulator_value: float = 0.0,
                           lr_decay: float = 0.0) -> optax.GradientTransformation:
    """torch.optim.Adagrad's step before the learning rate: g / (sqrt(sum) + eps) / (1 + t lr_decay)."""

    def init(params):
        return ScaleByTorchAdagradState(jnp.zeros([], jnp.int32),
                                        jax.tree.map(lambda p: jnp.full_like(p, initial_accumulator_value), params))

    def update(updates, state, params=None):
        del params
        total = jax.tree.map(lambda s, g: s + g * g, state.sum, updates)
        # the decay in each parameter's own dtype: an int32 count times a float is float32
        updates = jax.tree.map(lambda s, g: g / (jnp.sqrt(s) + eps) / (1.0 + state.count.astype(g.dtype) * lr_decay),
                               total, updates)
        return updates, ScaleByTorchAdagradState(optax.safe_increment(state.count), total)

    return optax.GradientTransformation(init, update)


class TorchTraceState(NamedTuple):
    count: jax.Array
    trace: optax.Updates  # torch's momentum_buffer


def torch_trace(decay: float, dampening: float = 0.0, nesterov: bool = False) -> optax.GradientTransformation:
    """torch.optim.SGD's momentum with dampening: the buffer starts at the first gradient
    (undampened), then buf = decay * buf + (1 - dampening) * g."""

    def init(params):
        return TorchTraceState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        first = state.count == 0
        trace = jax.tree.map(lambda b, g: jnp.where(first, g, decay * b + (1 - dampening) * g), state.trace, updates)
        out = jax.tree.map(lambda b, g: g + decay * b, trace, updates) if nesterov else trace
        return out, TorchTraceState(optax.safe_increment(state.count), trace)

    return optax.GradientTransformation(init, update)


class ScaleByTorchAmsgradState(NamedTuple):
    count: jax.Array
    mu: optax.Updates  # exp_avg
    nu: optax.Updates  # exp_avg_sq
    nu_max: optax.Updates  # max_exp_avg_sq: the largest exp_avg_sq so far, before bias correction


def scale_by_torch_amsgrad(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """torch's Adam(amsgrad=True) before the learning rate: the maximum is taken of the raw
    second moment (optax.scale_by_amsgrad takes it of the bias-corrected one)."""

    def init(params):
        return ScaleByTorchAmsgradState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                                        jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.result_type(float))
        mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu)
        c1, c2 = 1 - b1**t, 1 - b2**t
        out = jax.tree.map(lambda m, v: (m / c1) / (jnp.sqrt(v) / jnp.sqrt(c2) + eps), mu, nu_max)
        return out, ScaleByTorchAmsgradState(count, mu, nu, nu_max)

    return optax.GradientTransformation(init, update)


class ScaleByTorchNAdamState(NamedTuple):
    count: jax.Array
    mu_product: jax.Array  # the product of the momentum schedule so far
    mu: optax.Updates  # exp_avg
    nu: optax.Updates  # exp_avg_sq


def scale_by_torch_nadam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                         momentum_decay: float = 4e-3) -> optax.GradientTransformation:
    """torch.optim.NAdam before the learning rate: Dozat's momentum schedule
    mu_t = b1 (1 - 0.96^(t momentum_decay) / 2), its running product, eps outside the root."""

    def init(params):
        dtype = jax.tree.leaves(params)[0].dtype if jax.tree.leaves(params) else jnp.float32
        return ScaleByTorchNAdamState(jnp.zeros([], jnp.int32), jnp.ones([], dtype),
                                      jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.result_type(float))
        mu_t = b1 * (1.0 - 0.5 * 0.96 ** (t * momentum_decay))
        mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
        mu_product = (state.mu_product * mu_t).astype(state.mu_product.dtype)
        mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        c2 = 1 - b2**t
        grad_weight = (1.0 - mu_t) / (1.0 - mu_product)
        mom_weight = mu_next / (1.0 - mu_product * mu_next)

        def step(g, m, v):
            denom = jnp.sqrt(v / c2) + eps
            return g * grad_weight / denom + m * mom_weight / denom

        return jax.tree.map(step, updates, mu, nu), ScaleByTorchNAdamState(count, mu_product, mu, nu)

    return optax.GradientTransformation(init, update)


class ScaleByTorchRAdamState(NamedTuple):
    count: jax.Array
    mu: optax.Updates  # exp_avg
    nu: optax.Updates  # exp_avg_sq


def scale_by_torch_radam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
    """torch.optim.RAdam before the learning rate: the rectified step once rho_t > 5, the
    bias-corrected momentum alone before; eps added to sqrt(v) before its bias correction."""
    rho_inf = 2 / (1 - b2) - 1

    def init(params):
        return ScaleByTorchRAdamState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                                      jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params=None):
        del params
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.result_type(float))
        mu = jax.tree.map(lambda m, g: m + (1 - b1) * (g - m), state.mu, updates)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, updates)
        c1, c2 = 1 - b1**t, 1 - b2**t
        rho_t = rho_inf - 2 * t * b2**t / c2
        rectified = rho_t > 5.0
        rect = jnp.sqrt(jnp.where(rectified, (rho_t - 4) * (rho_t - 2) * rho_inf
                                  / ((rho_inf - 4) * (rho_inf - 2) * rho_t), 1.0))

        def step(m, v):
            adaptive = jnp.sqrt(c2) / (jnp.sqrt(v) + eps)
            return jnp.where(rectified, m / c1 * adaptive * rect, m / c1)

        return jax.tree.map(step, mu, nu), ScaleByTorchRAdamState(count, mu, nu)

    return optax.GradientTransformation(init, update)


class TorchASGDState(NamedTuple):
    count: jax.Array
    eta: jax.Array  # the step size of this step: lr / (1 + lambd lr t)^alpha from the last one
    mu: jax.Array  # the averaging weight: 1 / max(1, t - t0)
    ax: optax.Updates  # the averaged parameters


def torch_asgd(learning_rate, lambd: float = 1e-4, alpha: float = 0.75, t0: float = 1e6,
               ) -> optax.GradientTransformation:
    """torch.optim.ASGD's whole update (it computes the learning rate into eta):
    p <- p (1 - lambd eta) - eta g, then the average ax, eta and mu for the next step."""

    def init(params):
        leaves = jax.tree.leaves(params)
        dtype = leaves[0].dtype if leaves else jnp.float32
        count = jnp.zeros([], jnp.int32)
        return TorchASGDState(count, jnp.asarray(rate_at(learning_rate, count), dtype), jnp.ones([], dtype),
                              jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params):
        count = optax.safe_increment(state.count)
        t = count.astype(state.eta.dtype)
        eta = state.eta
        out = jax.tree.map(lambda g, p: -eta * (lambd * p + g), updates, params)
        new = jax.tree.map(lambda p, u: p + u, params, out)
        ax = jax.tree.map(lambda a, p: jnp.where(state.mu == 1, p, a + (p - a) * state.mu), state.ax, new)
        lr = rate_at(learning_rate, state.count)
        next_eta = jnp.asarray(lr / (1 + lambd * lr * t) ** alpha, eta.dtype)
        next_mu = jnp.asarray(1 / jnp.maximum(1.0, t - t0), eta.dtype)
        return out, TorchASGDState(count, next_eta, next_mu, ax)

    return optax.GradientTransformation(init, update)


class TorchRpropState(NamedTuple):
    count: jax.Array
    prev: optax.Updates  # the last gradient, zeroed where its sign flipped
    step_size: optax.Updates


def torch_rprop(learning_rate: float, etaminus: float = 0.5, etaplus: float = 1.2, step_size_min: float = 1e-6,
                step_size_max: float = 50.0) -> optax.GradientTransformation:
    """torch.optim.Rprop's whole update: the step sizes start at the learning rate (torch reads
    it once, so a scheduler does not change Rprop's steps) and grow or shrink with the sign."""

    def init(params):
        return TorchRpropState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params),
                               jax.tree.map(lambda p: jnp.full_like(p, learning_rate), params))

    def update(updates, state, params=None):
        del params
        sign = jax.tree.map(lambda g, p: jnp.sign(g * p), updates, state.prev)
        factor = jax.tree.map(lambda s: jnp.where(s > 0, etaplus, jnp.where(s < 0, etaminus, 1.0)), sign)
        step_size = jax.tree.map(lambda s, f: jnp.clip(s * f, step_size_min, step_size_max), state.step_size, factor)
        grads = jax.tree.map(lambda g, f: jnp.where(f == etaminus, 0.0, g).astype(g.dtype), updates, factor)
        out = jax.tree.map(lambda g, s: -jnp.sign(g) * s, grads, step_size)
        return out, TorchRpropState(optax.safe_increment(state.count), grads, step_size)

    return optax.GradientTransformation(init, update)


class TorchAdafactorState(NamedTuple):
    count: jax.Array
    row_var: optax.Updates  # (..., R, 1) for a matrix, empty for a vector
    col_var: optax.Updates  # (..., 1, C) for a matrix, empty for a vector
    variance: optax.Updates  # like the parameter for a vector, empty for a matrix


def torch_adafactor(learning_rate, beta2_decay: float = -0.8, eps=(None, 1e-3), d: float = 1.0,
                    weight_decay: float = 0.0) -> optax.GradientTransformation:
    """torch.optim.Adafactor's whole update, on the parameters in torch's layout: the second
    moment of a matrix factored over its last two axes, the relative step min(lr, 1/sqrt(t))
    times the parameter's RMS, the update's RMS clipped to d, and decay lr * weight_decay."""
    eps1, eps2 = eps

    def empty(p):
        return jnp.zeros((0,), p.dtype)

    def init(params):
        def factor(p, axis):
            return jnp.zeros_like(p.sum(axis=axis, keepdims=True)) if p.ndim > 1 else empty(p)

        return TorchAdafactorState(jnp.zeros([], jnp.int32), jax.tree.map(lambda p: factor(p, -1), params),
                                   jax.tree.map(lambda p: factor(p, -2), params),
                                   jax.tree.map(lambda p: empty(p) if p.ndim > 1 else jnp.zeros_like(p), params))

    def update(updates, state, params):
        count = optax.safe_increment(state.count)
        t = count.astype(jnp.result_type(float))
        lr = rate_at(learning_rate, state.count)
        weight = t**beta2_decay
        rho = jnp.minimum(lr, 1 / jnp.sqrt(t))

        def one(g, p, row, col, var):
            small = jnp.finfo(p.dtype).eps if eps1 is None else eps1
            alpha = jnp.maximum(eps2, jnp.sqrt(jnp.sum(p * p)) / jnp.sqrt(p.size)) * rho
            if p.ndim > 1:
                row = row + weight * (jnp.sum(g * g, axis=-1, keepdims=True) / g.shape[-1] - row)
                col = col + weight * (jnp.sum(g * g, axis=-2, keepdims=True) / g.shape[-2] - col)
                estimate = (row @ col) / jnp.maximum(jnp.mean(row, axis=-2, keepdims=True), small)
            else:
                var = var + weight * (g * g - var)
                estimate = var
            step = g / jnp.sqrt(jnp.maximum(estimate, small * small))
            denom = jnp.maximum(1.0, jnp.sqrt(jnp.sum(step * step)) / (jnp.sqrt(step.size) * d))
            return -lr * weight_decay * p - alpha / denom * step, row, col, var

        flat = [one(*a) for a in zip(*(jax.tree.leaves(x) for x in (updates, params, state.row_var, state.col_var,
                                                                     state.variance)))]
        tree = jax.tree.structure(updates)
        out, row, col, var = (jax.tree.unflatten(tree, [f[i] for f in flat]) for i in range(4))
        return out, TorchAdafactorState(count, row, col, var)

    return optax.GradientTransformation(init, update)


class TorchMuonState(NamedTuple):
    count: jax.Array
    trace: optax.Updates  # torch's momentum_buffer


def torch_muon(learning_rate, weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
               ns_coefficients=(3.4445, -4.775, 2.0315), eps: float = 1e-7, ns_steps: int = 5,
               adjust_lr_fn=None) -> optax.GradientTransformation:
    """torch.optim.Muon's whole update of 2-D parameters: momentum, Newton-Schulz
    orthogonalisation in bfloat16 (as torch computes it), decoupled decay, the shape-adjusted rate."""
    a, b, c = ns_coefficients

    def matmul(x, y):  # torch's bfloat16 matmuls accumulate in float32 and round once
        return jnp.matmul(x, y, preferred_element_type=jnp.float32)

    def orthogonalize(g):
        bf16, f32 = jnp.bfloat16, jnp.float32
        x = g.astype(bf16)
        tall = g.shape[0] > g.shape[1]
        x = x.T if tall else x
        norm = jnp.sqrt(jnp.sum(x.astype(f32) ** 2)).astype(bf16)
        x = (x.astype(f32) / jnp.maximum(norm, eps).astype(f32)).astype(bf16)
        for _ in range(ns_steps):
            gram = matmul(x, x.T).astype(bf16)
            gram_update = (b * gram.astype(f32) + c * matmul(gram, gram)).astype(bf16)
            x = (a * x.astype(f32) + matmul(gram_update, x)).astype(bf16)
        return x.T if tall else x

    def adjusted(lr, shape):
        rows, cols = shape[:2]
        if adjust_lr_fn in (None, "original"):
            return lr * max(1, rows / cols) ** 0.5
        if adjust_lr_fn == "match_rms_adamw":
            return lr * 0.2 * max(rows, cols) ** 0.5
        return lr

    def init(params):
        return TorchMuonState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

    def update(updates, state, params):
        count = optax.safe_increment(state.count)
        lr = rate_at(learning_rate, state.count)
        trace = jax.tree.map(lambda m, g: m + (1 - momentum) * (g - m), state.trace, updates)
        direction = jax.tree.map(lambda g, m: g + momentum * (m - g), updates, trace) if nesterov else trace
        def step(u, p):
            return -lr * weight_decay * p - adjusted(lr, p.shape) * orthogonalize(u).astype(p.dtype)

        out = jax.tree.map(step, direction, params)
        return out, TorchMuonState(count, trace)

    return optax.GradientTransformation(init, update)


class ClipByTorchNormState(NamedTuple):
    """clip_grad_norm_ keeps nothing between steps."""


def clip_grad_norm(max_norm: float, norm_type: float = 2.0) -> optax.GradientTransformation:
    """torch.nn.utils.clip_grad_norm_: every gradient times min(1, max_norm / (total_norm + 1e-6)),
    the total norm over all gradients together (2 or inf); optax.clip_by_global_norm has no 1e-6."""

    def update(updates, state, params=None):
        del params
        leaves = jax.tree.leaves(updates)
        if norm_type == float("inf"):
            total = jnp.max(jnp.stack([jnp.max(jnp.abs(g)) for g in leaves]))
        else:
            total = jnp.sum(jnp.stack([jnp.sum(jnp.abs(g) ** norm_type) for g in leaves])) ** (1.0 / norm_type)
        scale = jnp.minimum(max_norm / (total + 1e-6), 1.0)
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: ClipByTorchNormState(), update)
