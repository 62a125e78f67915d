"""Layer-by-layer parity of a torch module and its Flax port: where do they first differ?

Both run on the same inputs with full-precision matmuls (torch without TF32, JAX under
`default_matmul_precision('highest')`), and torch without oneDNN (mkldnn): on CPU its conv
backward sums a bias gradient over the N*H*W positions one after another in float32, off
by a relative 1.7e-4 at 64x32x32 where torch's own convolution and XLA are within 1e-7
(docs/porting.md, entry 25). torch forward hooks capture every submodule's output; a Flax
method interceptor captures every submodule's `__call__` output. Layers pair through the
weight key map (port/weights.py), parameter-free ones by name (or by order among GELUs
and pools), and rows come in torch's execution order, so the first failing row is the
first layer that computes something else. torch outputs of rank 3-5
are moved channels-last where the layer is channels-first (conv, norm over channels,
pool) or where only that layout fits.

In train mode the report also compares the BatchNorm running statistics after the
forward pass and the gradient of a loss for every parameter (mapped through the key map).

A row passes when max|torch - flax| <= atol + rtol * max|torch| (scale-aware: a layer of
large activations gets a proportionally larger budget).

Dropout in train mode: both sides apply the same masks (port/dropout.py), or none with
dropout='off'; the report says which. A float32 check with failing rows is repeated in
float64 on both sides (port/noise.py): a row that passes there is float32 rounding, one
that fails again a real divergence, and the first divergence named is the first real one.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from flaxport.port.converters import channels_first_kind
from flaxport.port.report import ParityReport, Row
from flaxport.port.weights import (CHANNELS_FIRST_KINDS, KeyMap, _torch_kind, as_tuple, build_key_map, canonical,
                                   mode_kwargs, set_torch_mode, to_flax_input, to_torch_input)


# --------------------------------------------------------------------------- comparison
def compare(t, f, atol: float, rtol: float):
    """(max_abs, max_rel, ok) of torch array t against Flax array f (same shape)."""
    wide = np.complex128 if np.iscomplexobj(t) or np.iscomplexobj(f) else np.float64
    t = np.asarray(t, wide)
    f = np.asarray(f, wide)
    if t.size == 0:
        return 0.0, 0.0, True
    nan_t, nan_f = np.isnan(t), np.isnan(f)
    if (nan_t != nan_f).any():
        return math.inf, math.inf, False
    same = nan_t | (t == f)  # infinities agree only by being equal
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(t - f))
    max_abs = float(np.max(diff))
    scale = float(np.max(np.where(nan_t | ~np.isfinite(t), 0.0, np.abs(t))))
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return max_abs, rel, bool(max_abs <= atol + rtol * scale)


def align(t, f_shape, channels_first: bool):
    """torch array t in Flax's layout: (N, C, *S) -> (N, *S, C) when that fits (preferred if
    `channels_first` and both fit); None if no layout fits f_shape."""
    f_shape = tuple(f_shape)
    moved = np.moveaxis(t, 1, -1) if t.ndim >= 3 else None
    if moved is not None and moved.shape == f_shape and (channels_first or t.shape != f_shape):
        return moved
    return t if t.shape == f_shape else None


def _row(phase, tname, fname, t, f, cf, atol, rtol) -> Row:
    a = align(np.asarray(t), np.shape(f), cf)
    if a is None:
        return Row(phase, tname, fname, tuple(np.shape(f)), math.inf, math.inf, False,
                   f"shape: torch {tuple(np.shape(t))} vs flax {tuple(np.shape(f))}")
    return Row(phase, tname, fname, tuple(np.shape(f)), *compare(a, f, atol, rtol))


def _arrays(out) -> list:
    """Array leaves of a (nested tuple/list/dict) output, as NumPy."""
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _arrays(o)]
    if isinstance(out, dict):
        return [a for o in out.values() for a in _arrays(o)]
    if hasattr(out, "detach"):
        return [out.detach().cpu().numpy().copy()]
    if hasattr(out, "shape") and hasattr(out, "dtype"):
        return [np.asarray(out)]
    return []


def _default_torch_loss(out):
    return sum((a ** 2).mean() for a in _torch_leaves(out))


def _torch_leaves(out):
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _torch_leaves(o)]
    if isinstance(out, dict):
        return [a for o in out.values() for a in _torch_leaves(o)]
    return [out] if hasattr(out, "detach") else []


def _default_flax_loss(out):
    import jax
    import jax.numpy as jnp

    return sum(jnp.mean(jnp.square(a)) for a in jax.tree.leaves(out))


# --------------------------------------------------------------------------- the two runs
def _run_torch(tm, inputs, kwargs, loss_fn, dropout=("off", None, None)):
    """(outputs, {module name: [arrays]} in completion order, grads {name: array} or None).

    dropout: (mode, NumPy generator, DropoutLog) for port.dropout.torch_dropout."""
    import torch

    from flaxport.port.dropout import torch_dropout

    names = {id(m): n for n, m in tm.named_modules()}
    caps: dict = {}

    def hook(mod, args, out):
        caps.setdefault(names[id(mod)], _arrays(out))

    handles = [m.register_forward_hook(hook) for n, m in tm.named_modules() if n]
    xs = [to_torch_input(x) for x in inputs]
    mode, rng, log = dropout
    try:
        with torch.set_grad_enabled(loss_fn is not None), torch_dropout(mode, rng, log):
            out = tm(*xs, **kwargs)
            if loss_fn is not None:
                tm.zero_grad(set_to_none=True)
                loss_fn(out).backward()
    finally:
        for h in handles:
            h.remove()
    grads = None
    if loss_fn is not None:
        grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().cpu().numpy()
                 for k, p in tm.named_parameters()}
    return _arrays(out), caps, grads


_RUNNERS: dict = {}  # (flax module, kwargs, mutable, loss_fn, dropout) -> (jitted run, {input signature: paths})


def _signature(tree):
    import jax

    return jax.tree.structure(tree), tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(tree))


def _runner(flax_module, kwargs, mutable, loss_fn, dropout_mode="off", channels_first=False):
    """A jitted run(params, rest, xs, masks) -> ((out, captures, new vars), grads) and the captured
    module paths per traced input signature. Cached, so repeated checks of one module
    (eval after a wrong port, a loop over checkpoints) compile once. masks: the torch side's
    dropout masks, which the Flax Dropout calls take in order (port/dropout.py)."""
    import jax
    from flax import linen as fnn

    from flaxport.port.dropout import FlaxMasks
    from flaxport.port.weights import split_rngs

    kwargs, _ = split_rngs(kwargs, None)
    try:
        key = (flax_module, tuple(sorted(kwargs.items())), tuple(mutable or ()), loss_fn, dropout_mode,
               channels_first)
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _RUNNERS:
        return _RUNNERS[key]
    paths_by_sig: dict = {}

    def forward(params, rest, xs, masks, rngs, paths):
        caps = []

        def record(next_fun, args, kw, context):
            out = next_fun(*args, **kw)
            if context.method_name == "__call__":
                paths.append((tuple(context.module.path), type(context.module)))
                caps.append([a for a in jax.tree.leaves(out) if hasattr(a, "shape") and hasattr(a, "dtype")])
            return out

        flax_masks = FlaxMasks(masks, dropout_mode, channels_first)
        with fnn.intercept_methods(record), flax_masks.linen():
            res = flax_module.apply({"params": params, **rest}, *xs, **kwargs, mutable=mutable, rngs=dict(rngs))
        flax_masks.finish()
        out, new = res if mutable else (res, {})
        return out, caps, new

    def run(params, rest, xs, masks, rngs):  # runs only while tracing
        paths = paths_by_sig.setdefault(_signature((params, rest, xs, masks)), [])
        paths.clear()
        if loss_fn is None:
            return forward(params, rest, xs, masks, rngs, paths), None
        (_, aux), grads = jax.value_and_grad(
            lambda p: (lambda r: (loss_fn(r[0]), r))(forward(p, rest, xs, masks, rngs, paths)), has_aux=True)(params)
        return aux, grads

    # One jit for forward (+ gradient): compiled once, it beats op-by-op dispatch. XLA's
    # backend optimisation level stays at its default: lowering it halves the compile
    # time on CPU but changed gradients by 1e-2 here (and GPUs refuse it).
    entry = (jax.jit(run), paths_by_sig)
    if key is not None:
        if len(_RUNNERS) >= 16:
            _RUNNERS.pop(next(iter(_RUNNERS)))
        _RUNNERS[key] = entry
    return entry


def _run_flax(flax_module, variables, xs, kwargs, train, loss_fn, masks=(), dropout_mode="off",
              channels_first=False):
    """(outputs, [(path, class, [arrays])] in completion order, new batch_stats or None, grads or None)."""
    import jax

    from flaxport.port.weights import split_rngs

    params = variables["params"]
    rest = {k: v for k, v in variables.items() if k != "params"}
    mutable = ["batch_stats"] if train and "batch_stats" in variables else False
    xs = [jax.numpy.asarray(x) for x in xs]
    masks = [jax.numpy.asarray(m) for m in masks]
    _, rngs = split_rngs(kwargs, jax.random.key(0))
    rngs.pop("params")
    run, paths_by_sig = _runner(flax_module, kwargs, mutable, loss_fn, dropout_mode, channels_first)
    with jax.default_matmul_precision("highest"):
        (out, caps, new), grads = run(params, rest, xs, masks, rngs)
    paths = paths_by_sig[_signature((jax.tree.map(jax.numpy.asarray, params), jax.tree.map(jax.numpy.asarray, rest),
                                     xs, masks))]
    captured = [(path, cls, [np.asarray(a) for a in c]) for (path, cls), c in zip(paths, caps)]
    return _arrays(out), captured, (new.get("batch_stats") if new else None), grads


class TorchPrecision:
    """No TF32 in torch matmuls/convs and no oneDNN for the duration (restored after)."""

    def __enter__(self):
        import torch

        self.saved = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
                      torch.backends.cudnn.allow_tf32, torch.backends.mkldnn.enabled)
        torch.set_float32_matmul_precision("highest")
        with _backend_flags_writable():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.mkldnn.enabled = False  # its CPU conv backward: a float32 running sum of bias grads

    def __exit__(self, *exc):
        import torch

        torch.set_float32_matmul_precision(self.saved[0])
        with _backend_flags_writable():
            (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.mkldnn.enabled) = self.saved[1:]


def _backend_flags_writable():
    """A context in which torch.backends flags may be set, as their own flags() contexts set them:
    torch's test suite (importing OpInfo's op_db) freezes them outside those contexts."""
    import torch.backends

    return getattr(torch.backends, "__allow_nonbracketed_mutation")()


# --------------------------------------------------------------------------- public API
def check_parity(torch_module, flax_module, variables, inputs, train: bool = False, loss_fn=None,
                 atol: float = 1e-5, rtol: float = 1e-5, *, grads: bool | None = None, flatten_shapes=None,
                 key_map: KeyMap | None = None, input_layout: str = "auto", flax_kwargs=None,
                 torch_kwargs=None, dropout: str = "equal", recheck_float64: bool = True,
                 seed: int = 0) -> ParityReport:
    """Run both modules on `inputs` and compare them layer by layer -> ParityReport.

    torch_module: left untouched (a deep copy runs, in train or eval mode as asked).
    variables: the Flax variables (e.g. port_weights' result). inputs: array/tensor or tuple,
    torch layout; Flax gets them channels-last as in port_weights. The Flax module gets the
    train/eval flag its __call__ names (train, deterministic, use_running_average) unless
    flax_kwargs says otherwise; in train mode batch_stats are mutable. flax_kwargs may hold
    `rngs` (a dict of keys, a key or a seed) for the Flax side's other random streams.
    loss_fn: out -> scalar, one callable for both frameworks or a (torch_fn, flax_fn) pair;
    gradients are compared when `grads` is True, by default in train mode or when a loss_fn is
    given (default loss: sum over outputs of mean(out**2)). flatten_shapes / key_map: as
    port_weights (key_map skips rebuilding it).
    dropout: 'equal' (torch's masks, drawn from `seed`, given to the Flax side) or 'off'.
    recheck_float64: when a float32 check fails, repeat it in float64 and label each failing
    row float32 rounding or a real divergence (`report.ok` is then False only for real ones).
    """
    from flaxport.port import noise
    from flaxport.port.dropout import check_mode

    check_mode(dropout)
    inputs = as_tuple(inputs)
    km = key_map or build_key_map(torch_module, flax_module, inputs, flatten_shapes=flatten_shapes,
                                  input_layout=input_layout, flax_kwargs=flax_kwargs, torch_kwargs=torch_kwargs)
    args = dict(train=train, loss_fn=loss_fn, atol=atol, rtol=rtol, grads=grads, km=km, flax_kwargs=flax_kwargs,
                torch_kwargs=torch_kwargs, dropout=dropout, seed=seed)
    report = _check(torch_module, flax_module, variables, inputs, **args)
    if report.strict_ok or not recheck_float64 or not noise.is_float32(variables, inputs):
        return report
    import jax

    try:
        with jax.enable_x64(True):
            report64 = _check(noise.torch_float64(torch_module), flax_module, noise.tree_float64(variables),
                              tuple(noise.array_float64(x) for x in inputs), **args)
    except Exception as e:  # the model cannot run in float64: keep the float32 verdict, say why
        report.recheck = f"not possible ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return report
    if report64.flax_dtype and report64.flax_dtype != "float64":
        report.recheck = noise.NOT_FLOAT64.format(report64.flax_dtype)
        return report
    report.recheck = noise.classify(report.rows, report64.rows)
    report.float64_report = report64
    report.why = noise.why(report.rows, torch_module, [to_torch_input(x) for x in inputs], torch_kwargs)
    return report


def _check(torch_module, flax_module, variables, inputs, *, train, loss_fn, atol, rtol, grads, km, flax_kwargs,
           torch_kwargs, dropout, seed) -> ParityReport:
    from flaxport.port.dropout import DropoutLog, describe, silence_recurrent_dropout

    cf = km.input_channels_first
    want_grads = (train or loss_fn is not None) if grads is None else grads
    if isinstance(loss_fn, (tuple, list)):
        t_loss, f_loss = loss_fn
    else:
        t_loss = f_loss = loss_fn
    if want_grads and loss_fn is None:
        t_loss, f_loss = _default_torch_loss, _default_flax_loss

    tm = set_torch_mode(copy.deepcopy(torch_module), train)
    notes = silence_recurrent_dropout(tm)
    log = DropoutLog()
    with TorchPrecision():
        t_out, t_caps, t_grads = _run_torch(tm, inputs, torch_kwargs or {}, t_loss if want_grads else None,
                                            (dropout, np.random.default_rng(seed), log))
    fkw = {**mode_kwargs(flax_module, train), **(flax_kwargs or {})}
    f_out, f_caps, f_stats, f_grads = _run_flax(flax_module, variables, [to_flax_input(x, cf) for x in inputs], fkw,
                                                train, f_loss if want_grads else None, [m for m, _, _ in log.masks],
                                                dropout, cf)

    mods = dict(tm.named_modules())
    rows = _forward_rows(km, mods, t_caps, f_caps, cf, atol, rtol)
    if len(t_out) == len(f_out):
        for i, (t, f) in enumerate(zip(t_out, f_out)):
            name = "output" if len(t_out) == 1 else f"output[{i}]"
            rows.append(_row("output", name, name, t, f, cf, atol, rtol))
    else:
        rows.append(Row("output", "output", "output", None, math.inf, math.inf, False,
                        f"torch returns {len(t_out)} arrays, flax {len(f_out)}"))
    flax_name = {leaf.torch_key: leaf.flax_name for leaf in km.leaves}
    flax_shape = {leaf.torch_key: km.flax_shapes[leaf.flax_path] for leaf in km.leaves}
    if train and f_stats is not None:
        ported = km.to_torch({"params": variables["params"], "batch_stats": f_stats})
        t_sd = tm.state_dict()
        for k in km.torch_keys:
            if k in flax_name and flax_name[k].startswith("batch_stats/"):
                rows.append(Row("running_stats", k, flax_name[k], flax_shape[k],
                                *compare(t_sd[k].detach().cpu().numpy(), ported[k], atol, rtol)))
    if want_grads:
        ported = km.to_torch({"params": f_grads})
        for k, g in t_grads.items():
            if k in ported:
                rows.append(Row("grad", k, flax_name[k], flax_shape[k], *compare(g, ported[k], atol, rtol)))
    report = ParityReport(rows, train, atol, rtol, dropout=describe(dropout, [len(log.masks)], notes) if train else "")
    report.flax_dtype = str(f_out[0].dtype) if f_out else ""
    return report


def _forward_rows(km, mods, t_caps, f_caps, cf, atol, rtol) -> list:
    """Rows pairing captured layer outputs, in torch completion order."""
    f_first: dict = {}
    f_class: dict = {}
    for path, cls, arrays in f_caps:
        f_first.setdefault(path, arrays)
        f_class.setdefault(path, cls)
    by_flax = {p.flax_path: p.torch_name for p in km.pairs}
    torch_by_canon = {canonical(n): n for n in t_caps}
    pairing: dict = {}  # torch name -> flax path
    for path in f_first:
        if not path:
            continue  # the root: compared as "output"
        tname = by_flax.get(path) or torch_by_canon.get(canonical("/".join(path)))
        if tname is not None and tname in t_caps and tname not in pairing:
            pairing[tname] = path
    # Parameter-free layers of known kinds (GELU, pools) with other names: by order within the kind.
    for kind in ("gelu", "pool"):
        t_left = [n for n in t_caps if n not in pairing and _torch_kind(mods[n]) == kind]
        f_used = set(pairing.values())
        f_left = [p for p in f_first if p and p not in f_used and _param_free_kind(f_class[p]) == kind]
        for n, p in zip(t_left, f_left):
            pairing[n] = p
    rows = []
    for tname, t_arrays in t_caps.items():
        path = pairing.get(tname)
        if path is None:
            continue
        f_arrays = f_first[path]
        kind = _torch_kind(mods[tname])
        layer_cf = kind in CHANNELS_FIRST_KINDS or channels_first_kind(kind) or (kind in (None, "gelu") and cf)
        fname = "/".join(path)
        if len(t_arrays) != len(f_arrays):
            rows.append(Row("forward", tname, fname, None, math.inf, math.inf, False,
                            f"torch returns {len(t_arrays)} arrays, flax {len(f_arrays)}"))
            continue
        for i, (t, f) in enumerate(zip(t_arrays, f_arrays)):
            suffix = "" if len(t_arrays) == 1 else f"[{i}]"
            rows.append(_row("forward", tname + suffix, fname + suffix, t, f, layer_cf, atol, rtol))
    return rows


def _param_free_kind(cls) -> str:
    from flaxport import nn as fp

    if issubclass(cls, fp.GELU):
        return "gelu"
    if issubclass(cls, (fp.MaxPool, fp.AvgPool)):
        return "pool"
    return ""
