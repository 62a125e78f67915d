"""The proof `translate` runs: the translated model against torch, at every submodule boundary.

Both sides run in eval mode on the example inputs, in float64 (jax x64 and the torch
module in double) and in float32. torch's values at each boundary are the values its
own ATen ops compute for the captured graph (an fx Interpreter over the export, which
holds torch's kernels), and the final outputs come from running the torch module
itself. An unstable sort and a top-k leave the order of equal keys to their kernels: the
interpreter takes them in the order they come there, an order torch may give and the one the
translation gives (a mixture of experts sorts token slots by expert id, and the rows inside an
expert are compared in that order; a top-k over a causally masked row picks among -inf). The
torch module itself runs the same way (ties_in_order): where equal keys decide what the model
returns (a router HF initialises to zeros: every expert ties), its kernel's own order is one
answer among equals, and lowest index first the one the translation gives. The JAX side
records what every translated module call returns. Rows follow torch's execution order (a
call's row when it returns, as forward hooks would), so the first failing row is the first
submodule whose translation computes something else.

A row passes in float64 when max|torch - jax| <= atol + rtol * max|torch| (1e-5 each);
the float32 figure is reported beside it (float32 rounding, ~1e-6, is expected there).
A file written with conv="native" runs flaxport's float32-only kernels in the float32
column and XLA's convolution in the float64 one, so there the float32 figure counts too:
a row whose float32 difference exceeds 1e-3 x max|torch| fails.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

import numpy as np

from flaxport.port import draws as rnd
from flaxport.port.dropout import DropoutLog, DropoutMismatchError, FlaxMasks, graph_replay, torch_dropout
from flaxport.port.parity import ParityReport, Row, compare
from flaxport.port.report import SENSITIVE
from flaxport.port.weights import set_torch_mode
from flaxport.translate import marks
from flaxport.translate.capture import cast_floating
from flaxport.translate.copies import copy_as, on_copy
from flaxport.translate.sensitivity import MARGIN, NUDGE, torch_spread

ATOL = RTOL = 1e-5
# The proof compiles each program once and runs it once: XLA's backend optimisations cost
# more than they save (ResNet-18: 3.3 s to compile at the default level, 1.2 s at 0, same numbers).
FAST_COMPILE = {"xla_backend_optimization_level": 0}
# float32 rounding is ~1e-6 of max|torch|; a kernel that computes something else is off by order 1
NATIVE_FLOAT32_RTOL = 1e-3
# float32's unit roundoff over float64's (2^-24 / 2^-53), times 10: what the float64 column's
# difference becomes in float32 where the model itself amplifies rounding (MobileNetV2's deep
# ReLU6 stack: 4.9e-11 in float64)
ROUNDING_FLOAT32_OVER_FLOAT64 = 10 * 2.0 ** 29
# check_train where torch has no float64 kernel: a train forward in float32 rounds to ~1e-6 of max|torch|
FLOAT32_TOLERANCE = 1e-4


class ProofReport(ParityReport):
    """A ParityReport of the float64 check with the float32 figure of each row beside it."""

    def __init__(self, rows, atol, rtol, float32, precision: str, notes=()):
        super().__init__(rows, False, atol, rtol)
        self.float32 = float32  # per row: (max_abs, max_rel) or None
        self.precision = precision  # 'float64' (the proof) or 'float32' (when float64 could not run)
        self.notes = list(notes)

    @property
    def max_abs(self) -> float:
        return max((r.max_abs for r in self.rows if r.phase == "output"), default=0.0)

    @property
    def max_abs_float32(self) -> float:
        return max((f[0] for r, f in zip(self.rows, self.float32) if f and r.phase == "output"), default=0.0)

    def headline(self) -> str:
        first = self.first_divergence
        checked = sum(1 for r in self.rows if r.phase == "forward")
        if first is None:
            return (f"parity ({self.precision}, eval mode): OK, {checked} submodule outputs and "
                    f"{len(self.rows) - checked} model outputs; largest output difference "
                    f"{self.max_abs:.2g} ({self.precision}), {self.max_abs_float32:.2g} (float32)")
        return (f"parity ({self.precision}, eval mode): FAILED, first divergence at {first.torch_name!r} "
                f"(max |diff| {first.max_abs:.3g}, {first.note or 'over tolerance'})")

    def __str__(self) -> str:
        first = self.first_divergence
        table = [("#", "torch", "jax", "shape", f"max_abs {self.precision}", "rel", "max_abs float32", "")]
        for i, (r, f) in enumerate(zip(self.rows, self.float32)):
            status = "ok" if r.ok else ("FAIL <- first" if r is first else "FAIL")
            table.append((str(i), r.torch_name, r.flax_name, "x".join(map(str, r.shape or ())), f"{r.max_abs:.3g}",
                          f"{r.max_rel:.3g}", f"{f[0]:.3g}" if f else "-", status + (f" ({r.note})" if r.note else "")))
        widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
        return "\n".join([self.headline()] + lines)


def prove(t, module, atol: float = ATOL, rtol: float = RTOL) -> ProofReport:
    """Run the proof for Translation t of torch `module` (see module docstring)."""
    notes = []
    rows32 = run_side(t, module, "float32", atol, rtol)
    rows64 = None
    if t.plan.f64 is not None:
        try:
            rows64 = run_side(t, module, "float64", atol, rtol)
        except Exception as e:  # noqa: BLE001 - a model that cannot run in double: report float32 only
            notes.append(f"float64 could not run ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
                         "checked in float32")
    if rows64 is None:
        if t.plan.f64 is None:
            notes.append("the model could not be exported in float64; checked in float32")
        return ProofReport(rows32, atol, rtol, [(r.max_abs, r.max_rel) for r in rows32], "float32", notes)
    f32 = {(r.phase, r.torch_name): r for r in rows32}
    float32 = [(r.max_abs, r.max_rel) if (r := f32.get((row.phase, row.torch_name))) else None for row in rows64]
    for row in rows64:  # a float32 run that overflows is no proof either, whatever float64 says
        r32 = f32.get((row.phase, row.torch_name))
        if row.ok and r32 is not None and "NaN/inf" in r32.note:
            row.ok, row.note = False, f"float32: {r32.note}"
        elif row.ok and r32 is not None and r32.not_finite > row.not_finite:
            row.ok, row.note = False, (f"float32: torch computes NaN/inf here ({r32.not_finite} values) where "
                                       f"float64 gives {row.not_finite}")
    if _runs_native_kernels(t, module):
        blame_kernels(rows64, float32, atol, lambda: _float32_on_xla(t, module, atol, rtol))
    return ProofReport(rows64, atol, rtol, float32, "float64", notes)


def blame_kernels(rows64, float32, atol, float32_on_xla) -> None:
    """Fail the float64-proved rows whose float32 figure (max_abs, max_rel) says flaxport's kernels
    compute something else, unless XLA's convolutions give the same kind of figure there
    (float32_on_xla() -> {(phase, torch name): figure}, run only if a row is suspect): then float32
    rounding decides a discrete choice of the model (DETR-style top-k queries over encoder scores),
    which the float64 column shows the translation gets right."""
    suspects = [(row, figure, note) for row, figure in zip(rows64, float32)
                if row.ok and (note := native_kernel_fault(row, figure, atol))]
    on_xla = float32_on_xla() if suspects else {}
    for row, figure, note in suspects:
        xla = on_xla.get((row.phase, row.torch_name))
        if xla is not None and native_kernel_fault(row, xla, atol):
            row.note = (f"float32 off by {figure[1]:.2g} x max|torch| on flaxport's kernels and {xla[1]:.2g} on "
                        "XLA's convolutions: float32 rounding the model amplifies (float64 agrees)")
        else:
            row.ok, row.note = False, note


def _float32_on_xla(t, module, atol, rtol) -> dict:
    """The float32 figures of t's file run with XLA's convolutions in place of flaxport's kernels."""
    saved = t.namespace.get("flaxport_conv")
    t.namespace["flaxport_conv"] = None  # what the file does where flaxport is not installed
    try:
        rows = run_side(t, module, "float32", atol, rtol)
    finally:
        t.namespace["flaxport_conv"] = saved
    return {(r.phase, r.torch_name): (r.max_abs, r.max_rel) for r in rows}


def native_kernel_fault(row, figure, atol) -> str:
    """Why a float64 row's float32 figure (max_abs, max_rel) says flaxport's kernels compute
    something else ("" where it does not): off relative to max|torch|, over the proof's absolute
    tolerance (a layer whose exact output is zero, GroupNorm over a 1x1 map, has float32 rounding
    as large as its values), and over what float32 rounding gives where the float64 column
    already shows the model amplifying rounding."""
    if figure is None:
        return ""
    allowed = max(NATIVE_FLOAT32_RTOL, ROUNDING_FLOAT32_OVER_FLOAT64 * row.max_rel)
    if figure[1] <= allowed or figure[0] <= atol:
        return ""
    return f"float32 off by {figure[1]:.2g} x max|torch| on flaxport's kernels (over {allowed:.2g})"


def _runs_native_kernels(t, module) -> bool:
    """Whether t's file (conv="native") runs flaxport's kernels here: they take float32 only, a
    model in another dtype (bfloat16) runs XLA's convolutions, checked as any other."""
    import torch

    from flaxport.translate.emit import calls_native_conv

    values = [*module.parameters(), *t.example_args, *t.example_kwargs.values()]
    floats = [v.dtype for v in values if torch.is_tensor(v) and v.is_floating_point()]
    if not calls_native_conv(t.source) or any(d != torch.float32 for d in floats):
        return False
    from flaxport import kernels

    return kernels.available()


def run_side(t, module, precision: str, atol, rtol) -> list:
    """Rows comparing torch and JAX in one precision (eval mode)."""
    import jax
    import jax.numpy as jnp
    import torch

    f64 = precision == "float64"
    plan = t.plan
    capture = plan.f64 if f64 else plan.captures.get("eval") or next(iter(plan.captures.values()))
    dtype = torch.float64 if f64 else None
    args = [cast_floating(a, dtype) for a in t.example_args]
    kwargs = {k: cast_floating(v, dtype) for k, v in t.example_kwargs.items()}
    garbage_in = not_finite_in(module, args, kwargs)

    def forward(torch_module):
        with _torch_precision(), torch.no_grad(), ties_in_order(), torch_noise(capture) as (draws, masks):
            return torch_module(*args, **kwargs), draws, masks

    torch64 = None  # in float64 a copy cast as it is made, its buffers put back for the interpreter after
    if f64:
        torch64 = set_torch_mode(copy_as(module, dtype), False)
        kept = {name: b.clone() for name, b in torch64.named_buffers()}
        torch_out, draws, masks = forward(torch64)
        for name, b in torch64.named_buffers():
            b.copy_(kept[name])
        del kept
    else:  # the model's own weights, read in place (the eval capture's copy the interpreter runs shares them)
        torch_out, draws, masks = on_copy(module, forward, training=False)
    torch_leaves = output_leaves(torch_out)
    if f64 and not garbage_in and not _finite_leaves(torch_leaves):
        def float32_leaves():
            m, a, k = _float32_copy(module, args, kwargs, training=False)
            with _torch_precision(), torch.no_grad(), ties_in_order(), torch_noise(capture):
                return output_leaves(m(*a, **k))

        _float64_is_the_model(float32_leaves)
    compared = {node.name for frame in capture.root.walk() for node in plan.io(frame)[1]}
    try:
        env = _interpret(capture, args, kwargs, draws, masks, keep=compared, module=torch64)
    except rnd.DrawMismatch as e:
        return [_draws_differ(e)]
    del torch64  # a copy of the weights: the JAX side needs the room

    x64 = jax.enable_x64(True) if f64 else contextlib.nullcontext()
    with x64, jax.default_matmul_precision("highest"):
        model = t.new_model(dtype=jnp.float64 if f64 else None)
        model.eval()
        inputs = jax_arguments(t, dtype)
        try:
            with jax_noise(draws, masks):
                records, jax_out = _run_recorded(t, model, inputs)
        except (rnd.DrawMismatch, DropoutMismatchError) as e:
            return [_draws_differ(e)]
        records = [(path, [np.asarray(a) for a in _leaves(out)]) for path, out in records]
        jax_leaves = [np.asarray(a) for a in leaves_like(jax_out, torch_out)]

    rows = []
    calls: dict = {}  # a module torch shares is one object: its calls at all its paths, in order
    for path, values in records:
        calls.setdefault(path, []).append(values)
    nth = _shared_call_order(plan, capture, calls, env)
    for frame in _postorder(capture.root):
        if frame.parent is None or plan.kind(frame.path) not in ("layer", "generated", "sequential"):
            continue
        jax_calls = calls.get(_one_path(plan, frame.path), [])
        if nth[id(frame)] >= len(jax_calls):
            continue
        values = _frame_values(plan, frame, jax_calls[nth[id(frame)]])
        outputs = plan.io(frame)[1]
        flax_name = "/".join(str(p) for p in plan.nnx_path(frame.path))
        for i, node in enumerate(outputs):
            name = frame.name + ("" if len(outputs) == 1 else f"[{i}]")
            t_val = env.get(node.name)
            if t_val is None or i >= len(values) or values[i] is None:
                continue
            value = values[i]
            if plan.layout_by_name(node.name) == "last":  # kept channels-last inside (--layout nhwc)
                value = np.moveaxis(value, -1, 1)
            rows.append(_row("forward", name, flax_name, t_val, value, atol, rtol, garbage_in=garbage_in))
    if len(torch_leaves) != len(jax_leaves):
        rows.append(Row("output", "output", "output", None, math.inf, math.inf, False,
                        f"torch returns {len(torch_leaves)} arrays, the translation {len(jax_leaves)}"))
    else:
        unset = uninitialised_outputs(capture, len(torch_leaves))
        for i, (a, b) in enumerate(zip(torch_leaves, jax_leaves)):
            name = "output" if len(torch_leaves) == 1 else f"output[{i}]"
            rows.append(_row("output", name, name, a, b, atol, rtol, values=i not in unset, garbage_in=garbage_in))
    return rows


class Float64Differs(RuntimeError):
    """torch's own forward computes something else in float64 than in float32."""


def _finite_leaves(leaves) -> bool:
    return all(np.isfinite(a).all() for a in leaves if np.issubdtype(np.asarray(a).dtype, np.inexact))


def _float64_is_the_model(float32_leaves) -> None:
    """Raise Float64Differs where torch's float32 forward (`float32_leaves()`, its output leaves) is
    finite though its float64 outputs hold NaN/inf: the model is another model in float64 (HF's
    `(1.0 - mask) * torch.finfo(scores.dtype).min` with a float32 mask: float64's minimum overflows
    float32 to -inf, and 0 * -inf is NaN), so a float64 comparison proves nothing; the proof then runs
    in float32."""
    if _finite_leaves(float32_leaves()):
        raise Float64Differs("torch's own float64 forward gives NaN/inf where float32 does not "
                             "(a dtype's constant overflowing float32)")


def _float32_copy(module, args, kwargs, training: bool):
    """(module, args, kwargs) as float32 copies, in train or eval mode."""
    import torch

    args32, kwargs32 = cast_floating((list(args), dict(kwargs)), torch.float32)
    return set_torch_mode(copy_as(module, torch.float32), training), args32, kwargs32


def output_leaves(out) -> list:
    """The forward's output as NumPy leaves, in torch's flattening order: tensors (of any dtype) and the
    numbers it returns (sizes, .item()); None left out, as JAX's tree leaves leave it."""
    import torch

    return [to_numpy(a) for a in torch.utils._pytree.tree_leaves(out) if a is not None]


def to_numpy(a):
    """A tensor (any dtype NumPy lacks, such as bfloat16, widened) or a number, as NumPy."""
    import torch

    if not torch.is_tensor(a):
        return np.asarray(a)
    a = a.detach().resolve_conj().resolve_neg()  # a lazily conjugated view: its values
    if a.dtype in (torch.bfloat16, torch.complex32):
        a = a.to(torch.complex64 if a.is_complex() else torch.float32)
    return a.numpy()


# Ops whose result torch leaves uninitialised: only their shape and dtype mean anything.
UNINITIALISED = {"aten.empty.memory_format", "aten.empty.default", "aten.empty_like.default",
                 "aten.new_empty.default", "aten.empty_strided.default", "aten.new_empty_strided.default",
                 "aten.empty_permuted.default"}


def uninitialised_outputs(capture, count: int) -> set:
    """Positions among the `count` output leaves that hold an uninitialised tensor (torch.empty and
    views of it), which the proof compares on shape alone."""
    from flaxport.translate.capture import VIEW_OPS

    outputs = [o for o in capture.outputs if o is not None]
    if len(outputs) != count:
        return set()
    found = set()
    for i, node in enumerate(outputs):
        while hasattr(node, "op") and node.op == "call_function" and str(node.target) in VIEW_OPS and node.args:
            node = node.args[0]
        if hasattr(node, "op") and str(node.target) in UNINITIALISED:
            found.add(i)
    return found


def _draws_differ(e) -> Row:
    """The failed row of a translation whose random draws are not torch's (count, shapes)."""
    return Row("output", "output", "output", None, math.inf, math.inf, False, f"random draws: {e}")


def _row(phase, tname, fname, t, f, atol, rtol, values: bool = True, garbage_in: bool = True) -> Row:
    """One comparison; `garbage_in`: the weights or inputs hold NaN/inf (see _not_finite)."""
    t, f = np.asarray(t), np.asarray(f)
    if t.shape != f.shape:
        return Row(phase, tname, fname, tuple(f.shape), math.inf, math.inf, False,
                   f"shape: torch {tuple(t.shape)} vs jax {tuple(f.shape)}")
    if not values:
        return Row(phase, tname, fname, tuple(f.shape), 0.0, 0.0, True, "uninitialised in torch: shape compared")
    if t.dtype == bool or np.issubdtype(t.dtype, np.integer):
        same = bool(np.array_equal(t, f))
        return Row(phase, tname, fname, tuple(f.shape), 0.0 if same else math.inf, 0.0 if same else math.inf, same,
                   "" if same else "integer values differ")
    if why := _not_finite(phase, t, f, garbage_in):
        return Row(phase, tname, fname, tuple(f.shape), math.inf, math.inf, False, why)
    # where both give the same NaN or +-inf (an attention mask, var of one value): compared as equal
    same_bad = ~np.isfinite(t)
    count = int(same_bad.sum())
    note = f"NaN or inf on both sides at the same places ({count} of {t.size} values)" if count else ""
    return Row(phase, tname, fname, tuple(f.shape),
               *compare(np.where(same_bad, 0.0, t), np.where(same_bad, 0.0, f), atol, rtol), note, not_finite=count)


def _not_finite(phase, t, f, garbage_in: bool) -> str:
    """Why a row's numbers prove nothing, or where the translation is not finite and torch is; ''
    when they can be compared. NaN from NaN/inf weights or inputs (`garbage_in`) proves nothing, nor
    does inf in an output then; NaN an op makes of finite values (var of one value, 0/0) is the
    op's answer, which the translation must give at the same places."""
    t_bad, f_bad = ~np.isfinite(t), ~np.isfinite(f)
    if garbage_in and (np.isnan(t).any() or (phase == "output" and t_bad.any())):
        return (f"torch computes NaN/inf here ({int(t_bad.sum())} of {t.size} values): nothing to compare; "
                "check the weights and the inputs")
    infinite = np.isinf(t)
    if (f_bad & ~t_bad).any():
        return f"the translation computes NaN/inf where torch does not ({int((f_bad & ~t_bad).sum())} values)"
    if (t_bad & ~f_bad).any():
        return f"torch computes NaN/inf where the translation does not ({int((t_bad & ~f_bad).sum())} values)"
    if (np.isnan(t) != np.isnan(f)).any() or (t[infinite] != f[infinite]).any():
        return "NaN where the other side has inf, or infinities of opposite sign"
    return ""


def not_finite_in(module, args, kwargs) -> bool:
    """Whether a floating tensor among the module's parameters and buffers or the inputs holds NaN/inf."""
    import torch

    tensors = [*module.parameters(), *module.buffers(), *args, *kwargs.values()]
    return any(torch.is_tensor(v) and (v.is_floating_point() or v.is_complex()) and not torch.isfinite(v).all()
               for v in tensors)


def _frame_values(plan, frame, values) -> list:
    """The JAX leaves of a call, aligned with the frame's output nodes."""
    spec = plan.specs.get(frame.path)
    outputs = plan.io(frame)[1]
    if spec is not None and spec.core:
        order = {0: [0], 1: [1], 2: [2]}  # leaves of (out, (h, c)) / (out, h): in core-op order
        out = []
        for node in outputs:
            idx = node.args[1] if "getitem" in str(node.target) or marks.position(node) is not None else 0
            out.append(values[order[idx][0]] if idx < len(values) else None)
        return out
    return [values[i] if i is not None and i < len(values) else None for i in plan.translation_positions(frame)]


def leaves_like(out, torch_out) -> list:
    """The JAX output's arrays in the order torch's output flattens (JAX sorts dict keys)."""
    import jax

    if isinstance(out, dict) and hasattr(torch_out, "keys"):
        return [a for k in torch_out.keys() if k in out for a in leaves_like(out[k], torch_out[k])]
    if isinstance(out, (tuple, list)) and hasattr(torch_out, "to_tuple"):
        torch_out = torch_out.to_tuple()
    if isinstance(out, (tuple, list)) and isinstance(torch_out, (tuple, list)) and len(out) == len(torch_out):
        return [a for o, t in zip(out, torch_out) for a in leaves_like(o, t)]
    return jax.tree.leaves(out)


def _leaves(out) -> list:
    import jax

    return jax.tree.leaves(out)


def _run_recorded(t, model, inputs):
    """(records [(torch module path, output)], model output): every translated call recorded,
    in one jitted call (one compile instead of one per op)."""
    import jax
    from flax import nnx

    plan = t.plan
    classes = {type(model)}
    for _, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module):
            classes.add(type(node))
    owners = {next((k for k in c.__mro__ if "__call__" in vars(k)), None) for c in classes} - {None}
    graphdef, state = nnx.split(model)
    paths = []

    def run(state, xs):
        m = nnx.merge(graphdef, state)
        ids = {id(obj): path for obj, path in _objects(m, plan).items()}
        records = []
        saved = {}
        for cls in owners:
            original = vars(cls)["__call__"]

            def wrapper(self, *a, _original=original, **k):
                out = _original(self, *a, **k)
                path = ids.get(id(self))
                if path is not None:
                    records.append((path, out))
                return out

            saved[cls] = original
            cls.__call__ = wrapper
        try:
            out = m(*xs)
        finally:
            for cls, original in saved.items():
                cls.__call__ = original
        paths[:] = [p for p, _ in records]
        return out, [r for _, r in records]

    out, values = jax.jit(run, compiler_options=FAST_COMPILE)(state, list(inputs))
    return list(zip(paths, values)), out


def _objects(model, plan) -> dict:
    """{module object: torch path} for every recorded (layer, generated, sequential) module."""
    from flax import nnx

    out = {}
    for path, kind in plan.kinds.items():
        if not path or kind not in ("layer", "generated", "sequential"):
            continue
        obj = model
        try:
            for part in plan.nnx_path(path):
                obj = obj[part] if isinstance(part, int) or isinstance(obj, (nnx.List, nnx.Dict)) else getattr(obj, part)
        except (AttributeError, IndexError, KeyError, TypeError):
            continue
        out[obj] = _one_path(plan, path)
    return out


def _shared_call_order(plan, capture, calls, env) -> dict:
    """{id(frame): which of its module's recorded JAX calls is this torch call}. In call order,
    except for a module torch shares: the translation may call it from its paths in another
    order (`self.mix_b(x[:, :2])` computed before `self.mix_a(x)`), so each torch call takes the
    unclaimed JAX call closest to its own outputs."""
    nth, index, claimed = {}, {}, {}
    for frame in capture.root.walk():
        key = _one_path(plan, frame.path)
        nth[id(frame)] = index.get(key, 0)
        index[key] = nth[id(frame)] + 1
        if frame.path not in plan.shared or frame.parent is None:
            continue
        want = [env.get(node.name) for node in plan.io(frame)[1]]
        taken = claimed.setdefault(key, set())
        free = [j for j in range(len(calls.get(key, []))) if j not in taken]
        if free:
            got = {j: _frame_values(plan, frame, calls[key][j]) for j in free}
            nth[id(frame)] = min(free, key=lambda j: (_largest_difference(got[j], want), j))
            taken.add(nth[id(frame)])
    return nth


def _largest_difference(got: list, want: list) -> float:
    """Largest absolute difference between two lists of outputs (None in `want`: not compared);
    inf where their number or shapes differ."""
    if len(got) != len(want) or any(w is not None and (g is None or np.shape(g) != np.shape(w))
                                    for g, w in zip(got, want)):
        return math.inf
    return max([float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)), initial=0))
                for g, w in zip(got, want) if w is not None] or [0.0])


def _one_path(plan, path: str) -> str:
    """The first of the paths of a module torch shares (plan.shared), else path itself."""
    return plan.shared.get(path, [path])[0]


def jax_arguments(t, dtype) -> list:
    """The translated model's positional arguments: the example's, as JAX arrays (cast when dtype)."""
    import jax.numpy as jnp
    import torch
    from torch.utils import _pytree

    def convert(leaf):
        if not torch.is_tensor(leaf):
            return leaf
        leaf = cast_floating(leaf, dtype)
        if leaf.dtype == torch.bfloat16:  # NumPy has no bfloat16: through float32, exactly
            return jnp.asarray(leaf.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(_np(leaf))

    out = []
    for value in t.call_arguments:
        if hasattr(value, "to_tuple"):  # a HF ModelOutput: the translation reads it as a tuple
            value = value.to_tuple()
        out.append(_pytree.tree_map(convert, value))
    return out


def draws_noise(capture) -> bool:
    """Does the captured forward draw random numbers (randn_like, rand, bernoulli, ...)?"""
    return any(n.op == "call_function" and rnd.op_name(getattr(n.target, "overloadpacket", None))
               for n in capture.graph.nodes)


@contextlib.contextmanager
def torch_noise(capture):
    """Within: torch's random draws (a Draws; None where the captured forward draws none) and its
    dropout masks (a DropoutLog: dropout that is on in eval mode too, F.dropout(training=True),
    SDPA's dropout_p) are recorded. -> (draws, masks), for jax_noise to replay"""
    draws, masks = (rnd.Draws() if draws_noise(capture) else None), DropoutLog()
    with _recording(draws), torch_dropout("equal", np.random.default_rng(0), masks):
        yield draws, masks


@contextlib.contextmanager
def jax_noise(draws, masks):
    """Within (while the JAX side is traced): jax.random's samplers and dropout take torch_noise's
    draws and masks."""
    with _replay(draws), FlaxMasks([m for m, _, _ in masks.masks], "equal", False).nnx():
        yield


def _recording(draws):
    return rnd.torch_recording(draws) if draws is not None else contextlib.nullcontext()


def _replay(draws):
    return rnd.jax_replay(draws.standard) if draws is not None else contextlib.nullcontext()


def _interpret(capture, args, kwargs, draws=None, masks=None, keep=None, module=None) -> dict:
    """{node name: NumPy value} of the captured graph run by torch on the inputs (random ops
    return torch's `draws` of the module's own run, dropout its `masks`: a DropoutLog), for the
    computed nodes named in `keep` (None: every one), with the parameters and buffers of `module`
    (None: the capture's own copy)."""
    import torch
    import torch.fx
    from torch.utils import _pytree

    module = capture.module if module is None else module
    params = dict(module.named_parameters(remove_duplicate=False))  # tied weights: every name
    buffers = dict(module.named_buffers(remove_duplicate=False))
    from flaxport.translate.capture import signature_arguments

    flat_inputs = [leaf for _, value in signature_arguments(module, args, kwargs)
                   for leaf in _pytree.tree_leaves(value) if torch.is_tensor(leaf)]
    values = []
    for node in capture.graph.nodes:
        if node.op != "placeholder":
            continue
        ph = capture.placeholders[node]
        if ph.kind == "param":
            values.append(params[ph.target].detach())
        elif ph.kind == "buffer":
            values.append(buffers[ph.target].detach().clone())
        elif ph.kind == "constant":
            values.append(ph.value.clone() if torch.is_tensor(ph.value) else ph.value)
        elif ph.kind == "literal":
            values.append(ph.value)
        else:
            values.append(flat_inputs[ph.index])
    env = {}

    views = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}
    sorts = {torch.ops.aten.sort.default, torch.ops.aten.sort.stable}
    replay = rnd.torch_replay(draws) if draws is not None else None
    dropped = graph_replay(masks.masks) if masks is not None and masks.masks else None

    class Recorder(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target in views:  # the capture dropped torch's contiguous() calls
                target = torch.ops.aten.reshape.default
            if target in sorts:
                target, kwargs = torch.ops.aten.sort.stable, {**_sort_arguments(args, kwargs), "stable": True}
                args = args[:1]
            if target is torch.ops.aten.topk.default:
                return _stable_topk(*args, **kwargs)
            run = super().call_function
            if dropped is not None:
                run = functools.partial(dropped, run=run)
            if replay is not None:
                return replay(target, args, kwargs, run)
            return run(target, args, kwargs)

        def run_node(self, n):
            result = super().run_node(n)
            if n.op == "call_function" and torch.is_tensor(result) and (keep is None or n.name in keep):
                env[n.name] = to_numpy(result).copy()
            return result

    gm = capture.program.graph_module
    with _torch_precision(), torch.no_grad():
        Recorder(gm, graph=capture.graph).run(*values)
    return env


def _stable_topk(x, k, dim=-1, largest=True, sorted=True):
    """torch.topk, equal values in the order they come (the lowest index first, as lax.top_k)."""
    import torch

    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k), indices.narrow(dim, 0, k)


@contextlib.contextmanager
def ties_in_order():
    """Within: torch's sorts and top-k take equal keys lowest index first (stable), as the
    interpreter and lax.top_k do. torch leaves the order of equal keys to its kernels (its CPU
    top-k puts the highest index first), so any order is torch's answer."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    aten = torch.ops.aten

    class InOrder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is aten.topk.default:
                return _stable_topk(*args, **kwargs)
            if func in (aten.sort.default, aten.sort.stable):
                return aten.sort.stable(args[0], **_sort_arguments(args, kwargs), stable=True)
            return func(*args, **kwargs)

    with InOrder():
        yield


def _sort_arguments(args, kwargs) -> dict:
    """dim and descending of an aten.sort call (default or stable overload) as keywords."""
    named = dict(zip(("dim", "descending"), args[1:]))
    return {"dim": kwargs.get("dim", named.get("dim", -1)),
            "descending": kwargs.get("descending", named.get("descending", False))}


@contextlib.contextmanager
def _torch_precision():
    from flaxport.port.parity import TorchPrecision

    with TorchPrecision():
        yield


def _postorder(frame):
    for child in frame.children:
        yield from _postorder(child)
    yield frame


def _np(v):
    return v.detach().numpy() if hasattr(v, "detach") else np.asarray(v)


def markdown(t) -> str:
    """parity.md: what was checked, how, and every row."""
    import jax
    import torch

    r = t.report
    lines = [f"# Parity: {t.torch_class.__name__} -> {t.root_class} (Flax NNX)", ""]
    if r is None:
        return "\n".join(lines + ["Not checked (translate ran with check=False).", ""])
    lines += [f"**{r.headline()}**", "",
              f"Eval mode, the example inputs ({_inputs_text(t.example_args, t.example_kwargs)}); "
              f"both sides in {r.precision} (jax x64, torch `.double()`), float32 beside it. "
              f"A row passes when max|torch - jax| <= {r.atol:g} + {r.rtol:g} x max|torch|. "
              "torch's values at each submodule boundary come from its own ATen kernels on the captured graph; "
              "the outputs from running the torch module.", "",
              f"torch {torch.__version__}, jax {jax.__version__}.", ""]
    lines += [f"Note: {n}" for n in r.notes + t.notes]
    lines += ["", f"| # | torch module | jax module | shape | max abs ({r.precision}) | rel | max abs (float32) | |",
              "|---|---|---|---|---|---|---|---|"]
    first = r.first_divergence
    for i, (row, f) in enumerate(zip(r.rows, r.float32)):
        status = "ok" if row.ok else ("**FAIL, first**" if row is first else "FAIL")
        lines.append(f"| {i} | `{row.torch_name}` | `{row.flax_name}` | {'x'.join(map(str, row.shape or ()))} | "
                     f"{row.max_abs:.2e} | {row.max_rel:.2e} | {f[0]:.2e} | {status}"
                     + (f" ({row.note})" if row.note else "") + " |" if f else
                     f"| {i} | `{row.torch_name}` | `{row.flax_name}` | {'x'.join(map(str, row.shape or ()))} | "
                     f"{row.max_abs:.2e} | {row.max_rel:.2e} | - | {status} |")
    return "\n".join(lines) + "\n"


def _inputs_text(args, kwargs) -> str:
    return ", ".join([_shape_text(a) for a in args] + [f"{k}={_shape_text(v)}" for k, v in kwargs.items()])


def _shape_text(a) -> str:
    """`(2, 5, 8) float32`; a tuple, list or dict of inputs as one, item by item."""
    if hasattr(a, "shape"):
        return f"{tuple(a.shape)} {str(a.dtype).replace('torch.', '')}"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {_shape_text(v)}" for k, v in a.items()) + "}"
    if isinstance(a, list):
        return "[" + ", ".join(_shape_text(v) for v in a) + "]"
    if isinstance(a, tuple):
        return "(" + ", ".join(_shape_text(v) for v in a) + (",)" if len(a) == 1 else ")")
    return repr(a)


# --------------------------------------------------------------------------- train mode
def check_train(t, module, precision: str = "float64", atol: float = ATOL, rtol: float = RTOL) -> ParityReport:
    """One train-mode forward on both sides from the same state, dropout off on both (torch's
    dropout probabilities set to 0, the translation's nnx.Dropout made deterministic):
    the outputs, then every buffer torch updated (BatchNorm running statistics and
    num_batches_tracked) against the translation's. -> ParityReport(train=True)."""
    import torch

    f64 = precision == "float64"
    dtype = torch.float64 if f64 else None
    args = [cast_floating(a, dtype) for a in t.example_args]
    kwargs = {k: cast_floating(v, dtype) for k, v in t.example_kwargs.items()}
    garbage_in = not_finite_in(module, args, kwargs)
    capture = t.plan.captures.get("train") or next(iter(t.plan.captures.values()))
    rng_state = torch.get_rng_state()

    def run(m, args, kwargs, record=contextlib.nullcontext()):
        with _torch_precision(), torch.no_grad(), ties_in_order(), _torch_dropout_off(m), record, \
                torch_dropout("off", None, DropoutLog()):
            return m(*args, **kwargs)

    def forward(m):
        """(m, its output, its buffers before: what a train-mode forward updates, torch's draws)."""
        draws = rnd.Draws() if draws_noise(capture) else None
        torch.set_rng_state(rng_state)  # a forward run again (on a copy of its own) draws what the first drew
        before = {k: v.detach().clone() for k, v in m.named_buffers()}
        return m, run(m, args, kwargs, _recording(draws)), before, draws

    try:
        # in the model's dtype the copy reads the parameters in place; in float64 it is cast, its own
        torch_module, torch_out, before, draws = on_copy(module, forward, training=True, dtype=dtype)
        if f64 and not garbage_in and not _finite_leaves(output_leaves(torch_out)):
            _float64_is_the_model(lambda: output_leaves(run(*_float32_copy(module, args, kwargs, training=True))))
    except RuntimeError as e:
        if not f64 or not any(word in str(e).lower() for word in ("double", "float64")):
            raise
        # a kernel torch has no float64 form of (grouped_mm on a CPU, which a mixture of experts calls
        # in eager mode), a float32 the model pins meeting float64 weights (a router that runs
        # `hidden_states.float()` against its own weight), or a model float64 makes another
        # (Float64Differs): both sides in float32, at float32's tolerance
        report = check_train(t, module, "float32", FLOAT32_TOLERANCE, FLOAT32_TOLERANCE)
        why = f"float32: torch cannot run it in float64 ({str(e).splitlines()[0][:120]})"
        return dataclasses.replace(report, rows=[dataclasses.replace(r, note=r.note or why) for r in report.rows])
    torch_leaves = output_leaves(torch_out)
    after = dict(torch_module.named_buffers())
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    del torch_module  # in float64 a copy of the weights: the JAX side needs the room

    def train_copy():  # torch_spread's, made only where a row fails
        return set_torch_mode(copy_as(module, dtype), True)

    return _compare_train(t, torch_out, torch_leaves, before, after, changed, run, args, kwargs, garbage_in, capture,
                          draws, rng_state, train_copy, f64, atol, rtol)


def _compare_train(t, torch_out, torch_leaves, before, after, changed, run, args, kwargs, garbage_in, capture, draws,
                   rng_state, train_copy, f64: bool, atol, rtol) -> ParityReport:
    """check_train's rows, torch's train-mode forward done: `torch_out` (`torch_leaves`), the buffers
    `before` and `after` it, the names of those it `changed`; train_copy() makes the torch module
    again for torch_spread."""
    import jax
    import jax.numpy as jnp
    import torch
    from flax import nnx

    dtype = torch.float64 if f64 else None
    x64 = jax.enable_x64(True) if f64 else contextlib.nullcontext()
    with x64, jax.default_matmul_precision("highest"):
        model = t.new_model(dtype=jnp.float64 if f64 else None)
        model.train()
        model.set_attributes(nnx.Dropout, deterministic=True, raise_if_not_found=False)
        inputs = jax_arguments(t, dtype)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)

        def step(params, rest, xs):
            m = nnx.merge(graphdef, params, rest)
            return m(*xs), nnx.state(m, nnx.Not(nnx.Param))  # a jitted function's outputs are new arrays

        try:
            with _replay(draws), FlaxMasks([], "off", False).nnx():
                jax_out, rest = jax.jit(step, compiler_options=FAST_COMPILE)(params, rest, inputs)
        except rnd.DrawMismatch as e:
            return ParityReport([_draws_differ(e)], True, atol, rtol)
        nnx.update(model, rest)
        jax_leaves = [np.asarray(a) for a in leaves_like(jax_out, torch_out)]
        saved = _state_dict_of(t, model)
    rows = []
    unset = uninitialised_outputs(capture, len(torch_leaves))
    for i, (a, b) in enumerate(zip(torch_leaves, jax_leaves)):
        rows.append(_row("output", f"output[{i}]" if len(torch_leaves) > 1 else "output", "output", a, b, atol, rtol,
                         values=i not in unset, garbage_in=garbage_in))
    if len(torch_leaves) != len(jax_leaves):
        rows.append(Row("output", "output", "output", None, math.inf, math.inf, False,
                        f"torch returns {len(torch_leaves)} arrays, the translation {len(jax_leaves)}"))
    for k in changed:
        if k not in saved:
            rows.append(Row("running_stats", k, "-", None, math.inf, math.inf, False, "no translated variable"))
            continue
        rows.append(_row("running_stats", k, "/".join(map(str, t.names[k])), after[k].numpy(), saved[k], atol, rtol,
                         garbage_in=garbage_in))
    if f64 and not all(r.ok for r in rows):
        own = torch_spread(train_copy(), before, args, kwargs, rng_state,
                           lambda m, a, k: [np.asarray(leaf) for leaf in output_leaves(run(m, a, k))],
                           {row.torch_name: leaf for row, leaf in zip(rows, torch_leaves)},
                           {k: after[k].numpy() for k in changed})
        rows = [_within_spread(r, own.get(r.torch_name, 0.0)) for r in rows]
    return ParityReport(rows, True, atol, rtol)


def _within_spread(row: Row, own: float) -> Row:
    """A failing float64 row no further from torch than MARGIN x torch's own result moves when its
    inputs move in the 14th digit (translate/sensitivity.py) is marked as rounding, with the figure."""
    if row.ok or row.note or not 0 < row.max_abs <= MARGIN * own:
        return row
    return dataclasses.replace(row, cause=f"{SENSITIVE}: torch moves by up to {own:.3g} when its inputs move by up "
                                          f"to {NUDGE:g} of themselves")


def _state_dict_of(t, model) -> dict:
    from flax import nnx

    flat = dict(nnx.to_flat_state(nnx.state(model)))
    return {name: np.asarray(flat[path].get_value()) for name, path in t.names.items() if path in flat}


@contextlib.contextmanager
def _torch_dropout_off(module):
    """Dropout probabilities 0 for the duration: modules' p, RNN inter-layer dropout, and the
    functional forms (F.dropout, scaled_dot_product_attention's dropout_p) forward code calls."""
    import torch
    import torch.nn.functional as F

    saved_p = []
    for m in module.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            saved_p.append((m, "p", m.p))
            m.p = 0.0
        elif isinstance(m, torch.nn.RNNBase):
            saved_p.append((m, "dropout", m.dropout))
            m.dropout = 0.0
        elif isinstance(m, torch.nn.MultiheadAttention):
            saved_p.append((m, "dropout", m.dropout))
            m.dropout = 0.0
    sdpa, dropout = F.scaled_dot_product_attention, F.dropout

    def no_dropout_sdpa(*a, **k):
        if len(a) > 4:  # (query, key, value, attn_mask, dropout_p, ...)
            a = a[:4] + (0.0,) + a[5:]
        else:
            k["dropout_p"] = 0.0
        return sdpa(*a, **k)

    F.scaled_dot_product_attention = no_dropout_sdpa
    F.dropout = lambda x, p=0.5, training=True, inplace=False: x
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = sdpa, dropout
        for m, attr, value in saved_p:
            setattr(m, attr, value)
