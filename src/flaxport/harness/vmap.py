"""Many runs as one program: seeds and hyperparameter settings stacked on a leading axis.

A stack trains K members (seeds, settings of a sweep, or both) as one compiled epoch:
every state leaf (parameters, optimizer state, BatchNorm statistics, step counters) gets
a leading axis of K, the workload's train step is `jax.vmap`ped over it, and the epoch
runs as one `lax.scan`, as `epoch.ScanRunner` runs one member. Member m draws exactly
what its own single run draws: its epoch permutations from its `data` stream, its step
keys from its `train` stream (`epoch.epoch_batches`, `epoch.step_key`), so seed s of a
stack is the run `train --seed s`, up to how XLA rounds the batched kernels.

Swept hyperparameters travel as (K,) arrays. Inside the vmapped step each member's
config is the base config with its values (tracers) put in, and the member's state is
re-dressed with the optimizer and model that config builds (`workload.init_state` is
traced for its static parts; XLA drops its arithmetic). This is what
`optax.inject_hyperparams` does for an optimizer, done for the whole state, and the
optimizer state keeps the single run's layout: a member's checkpoint is an ordinary
single-run checkpoint. Only fields a config class lists in `SWEEPABLE` may be swept.

Files: each member has its own workdir (`seed2/`, `lr=3e-4_seed2/`) with config.json,
metrics.jsonl, pictures and, once the stack finishes, a checkpoint, so `evaluate`,
`sample` and `train --resume` work on each. The stack checkpoints itself each epoch in
`<workdir>/checkpoints` (one Orbax save of the stacked state), which `--resume` uses.
The stack keeps a single run's promises (harness/workdir.py, harness/store.py): it locks
its workdir and every member's, checks everything (members, seeds, the checkpoint it
resumes) before any file changes, and its checkpoints are atomic and checksummed.
A member whose loss or state turns NaN/inf is dropped (a warning, its metrics stop at
its last good epoch); its slot trains on from its initial state, ignored.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from flaxport.errors import TrainingDiverged, UserError, first_line
from flaxport.harness import rng
from flaxport.harness.epoch import epoch_batches, step_key
from flaxport.harness.loop import RunResult
from flaxport.harness.metrics import EpochLog, info, plain, steps_per_epoch
from flaxport.harness.progress import EpochProgress
from flaxport.harness.store import open_store
from flaxport.harness.workdir import claim, write_text

NAME = "jax-vmap"


@dataclasses.dataclass(frozen=True)
class Member:
    """One run of a stack: its workdir name, its seed, its swept {config field: value}."""

    name: str
    seed: int
    settings: dict = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------- planning


def sweepable(config) -> tuple:
    """The config fields a stack may sweep (the config class's SWEEPABLE)."""
    return tuple(getattr(type(config), "SWEEPABLE", ()))


def parse_sweep(config, items: list) -> list:
    """`--sweep KEY=v1,v2` strings -> [(key, [(raw, value), ...])], each checked.

    Refused with one line: a key that is not a field, a field that changes shapes or the
    program (sizes, widths, switches, data), a value that is not a finite number, an
    empty or repeated value, a key given twice. (The field's own rule, as for --set, is
    the caller's: cli/stack.py.)
    """
    workload = type(config).__module__.split(".")[-2]
    allowed = sweepable(config)
    fields = {f.name: f for f in dataclasses.fields(config)}
    out, seen = [], set()
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise UserError(f"--sweep expects KEY=V1,V2,..., got {item!r}")
        if key not in fields or key == "variant":
            raise UserError(f"--sweep: {workload} config has no field {key!r}")
        if key in seen:
            raise UserError(f"--sweep {key}: given twice; list every value in one --sweep {key}=V1,V2")
        seen.add(key)
        if key not in allowed:
            current = getattr(config, key)
            why = ("changes shapes or the program" if isinstance(current, (int, tuple, bool)) else
                   "is not a hyperparameter the vectorised step can carry as an array")
            raise UserError(f"--sweep {key}: {why} ({type(current).__name__} {current!r}); "
                            f"{workload} sweeps {', '.join(allowed) or 'nothing'}")
        values, raws = [], [r.strip() for r in raw.split(",")]
        for r in raws:
            try:
                v = float(r)
            except ValueError:
                raise UserError(f"--sweep {key}: cannot read {r!r} as float") from None
            if not math.isfinite(v):
                raise UserError(f"--sweep {key}: {r!r} is not a finite number")
            if v in [x for _, x in values]:
                raise UserError(f"--sweep {key}: {r!r} is listed twice")
            values.append((r, v))
        out.append((key, values))
    return out


def count(seeds: int | None, sweep: list) -> int:
    """How many members `plan` makes (without making them)."""
    return math.prod(len(values) for _, values in sweep) * (seeds or 1)


def plan(seed: int, seeds: int | None, sweep: list) -> list:
    """Members for `--seed S --seeds K --sweep ...`: the sweep's cross product, times the
    seeds S..S+K-1. Names: `seed2`; `lr=3e-4_b1=0.5`; `lr=3e-4_b1=0.5_seed2`."""
    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    grid = [[]]
    for key, values in sweep:
        grid = [g + [(key, raw, v)] for g in grid for raw, v in values]
    seed_list = list(range(seed, seed + (seeds or 1)))
    members = []
    for g in grid:
        for s in seed_list:
            parts = [f"{k}={raw}" for k, raw, _ in g]
            if seeds is not None or not g:
                parts.append(f"seed{s}")
            members.append(Member("_".join(parts), s, {k: v for k, _, v in g}))
    return members


# ----------------------------------------------------------------------------- the program


def stack_states(states: list):
    """Member states (one structure) -> one state whose leaves carry a leading member axis.

    The result has member 0's static fields (apply_fn, tx): treedefs of states built from
    different configs differ only there, and the stacked step re-dresses each member."""
    treedef = jax.tree_util.tree_structure(states[0])
    leaves = [jax.tree_util.tree_leaves(s) for s in states]
    if any(len(l) != len(leaves[0]) for l in leaves):
        raise ValueError("member states differ in structure")
    return jax.tree_util.tree_unflatten(treedef, [jnp.stack(col) for col in zip(*leaves)])


def _stack_epoch(member_step, batch_size, steps, state, data, keys, hparams, epoch):
    """(stacked state, data {name: (N, ...)}, keys {data, train: (K,)}, hparams {field: (K,)},
    epoch) -> (state, {metric: (steps, K)}); every member's batches and keys as its single run's."""
    batches = jax.vmap(lambda k: epoch_batches(data, k, epoch, batch_size, steps), out_axes=1)(keys["data"])
    step_keys = jax.vmap(lambda t: jax.vmap(lambda i: step_key(t, epoch, i, steps))(jnp.arange(steps)),
                         out_axes=1)(keys["train"])

    def body(state, xs):
        batch, key = xs
        return jax.vmap(member_step)(state, batch, key, hparams)

    return lax.scan(body, state, (batches, step_keys))


class StackRunner:
    """The compiled stacked epoch, and how a stacked state splits into member states."""

    name = "vmap"

    def __init__(self, workload, config, members: list, steps: int, member_state_shape):
        self.workload, self.config, self.members, self.steps = workload, config, members, steps
        self.swept = sorted({k for m in members for k in m.settings})
        self.treedef = jax.tree_util.tree_structure(member_state_shape)
        base_step = workload.make_train_step(config)

        def member_step(state, batch, key, hp):
            if not hp:
                return base_step(state, batch, key)
            cfg = dataclasses.replace(config, **hp)
            # The member's optimizer and model, built from its (traced) hyperparameters;
            # the init arithmetic is unused and XLA removes it.
            dressed = jax.tree_util.tree_structure(workload.init_state(cfg, key))
            state = jax.tree_util.tree_unflatten(dressed, jax.tree_util.tree_leaves(state))
            state, metrics = workload.make_train_step(cfg)(state, batch, key)
            return jax.tree_util.tree_unflatten(self.treedef, jax.tree_util.tree_leaves(state)), metrics

        self._jitted = jax.jit(partial(_stack_epoch, member_step, config.batch_size, steps), donate_argnums=(0,))
        self._compiled = None
        k = len(members)
        self._unstack = jax.jit(lambda s: [[leaf[i] for leaf in jax.tree_util.tree_leaves(s)] for i in range(k)])
        self._finite = jax.jit(jax.vmap(
            lambda s: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(s)
                                         if jnp.issubdtype(x.dtype, jnp.inexact)] or [jnp.bool_(True)]))))

    def hparams(self) -> dict:
        return {k: jnp.asarray([m.settings[k] for m in self.members], jnp.float32) for k in self.swept}

    def compile(self, state, data, keys) -> float:
        """Compile ahead of time (state, data, keys may be abstract); returns the seconds it took."""
        t0 = time.perf_counter()
        hp = {k: jax.ShapeDtypeStruct((len(self.members),), jnp.float32) for k in self.swept}
        self._compiled = self._jitted.lower(state, data, keys, hp, jnp.int32(0)).compile()
        return time.perf_counter() - t0

    def memory(self):
        """XLA's memory analysis of the compiled epoch (None where the backend gives none)."""
        try:
            return self._compiled.memory_analysis()
        except Exception:  # noqa: BLE001 - not every backend implements it
            return None

    def run_epoch(self, state, data, keys, hparams, epoch: int):
        state, metrics = self._compiled(state, data, keys, hparams, jnp.int32(epoch))
        return state, jax.device_get(metrics)

    def split(self, state, treedefs: list) -> list:
        """The stacked state as K member states, each with its own static fields."""
        return [jax.tree_util.tree_unflatten(td, leaves) for td, leaves in zip(treedefs, self._unstack(state))]

    def finite(self, state) -> np.ndarray:
        """(K,) bool: every float leaf of member m is finite."""
        return np.asarray(self._finite(state))


# ----------------------------------------------------------------------------- memory


def _nbytes(tree) -> int:
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
               if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))


def available_bytes() -> int | None:
    """Memory the stack may use: the device's free memory, or the host's MemAvailable on CPU."""
    dev = jax.devices()[0]
    stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def member_bytes(workload, config, data, steps: int) -> tuple[int, int]:
    """(state bytes, epoch-batch bytes) of one member, from shapes alone (nothing allocated)."""
    shape = jax.eval_shape(lambda: workload.init_state(config, jax.random.key(0)))
    batch = sum(math.prod((steps, config.batch_size) + a.shape[1:]) * a.dtype.itemsize for a in data.train.values())
    return _nbytes(shape), batch


def check_memory(workload, config, k: int, data, steps: int, runner: StackRunner | None = None) -> int:
    """Refuse, before anything is allocated, a stack that cannot fit; returns the estimate (bytes).

    Without a compiled runner: K x (state, its update, the gradients: 3 states, plus the
    epoch's batches). With one: XLA's own figures for the compiled epoch (arguments,
    outputs, temporaries) plus the member copies taken for evaluation."""
    state, batches = member_bytes(workload, config, data, steps)
    estimate = k * (3 * state + batches)
    how = f"3 x its {_mib(state)} state (state, update, gradients) and {_mib(batches)} of epoch batches"
    mem = runner.memory() if runner is not None else None
    if mem is not None:
        compiled = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                    + mem.temp_size_in_bytes + k * state)
        if compiled > estimate:
            estimate, how = compiled, "XLA's figures for the compiled epoch, plus a copy of its state for evaluation"
    free = available_bytes()
    if free is not None and estimate > 0.9 * free:
        raise UserError(f"{k} members need about {_gib(estimate)} ({_mib(estimate / k)} each: {how}), "
                        f"{_gib(free)} free; train fewer members at once")
    return estimate


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB"


def _mib(n) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 / 10 else f"{n / 2**10:.0f} KiB"


# ----------------------------------------------------------------------------- the loop


def _has_checkpoint(d: Path) -> bool:
    ckpt = d / "checkpoints"
    return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def claim_stack(workdir: Path, dirs: list, identity: dict, resume: bool) -> list:
    """Lock the stack's workdir and every member's, after their checks; nothing is written.

    Returns the claims, the stack's first: commit each member's once every check of the
    run has passed, release all of them at the end (`release_all`). A refusal (a single
    run's workdir, checkpoints without --resume, another workload's member, a member in
    use) releases what was claimed, removing the folders this call made."""
    try:
        single = (workdir / "config.json").exists()
    except OSError as e:  # a name too long for the file system
        raise UserError(f"workdir {workdir} is not writable: {e.strerror or e}") from e
    if single:
        raise UserError(f"workdir {workdir} holds a single run; choose another --workdir for a stack")
    held = [claim(workdir, {}, resume=resume, has_checkpoint=_has_checkpoint)]
    try:
        for d in dirs:
            held.append(claim(d, identity, resume=resume, has_checkpoint=_has_checkpoint))
    except BaseException:
        release_all(held)
        raise
    return held


def release_all(held: list) -> None:
    """Release claims, members before the stack (whose folder holds theirs)."""
    for h in reversed(held):
        h.release()


def train_stack(workload, config, members: list, *, workdir, epochs: int | None = None, resume: bool = False,
                data=None, checkpoints: bool = True, progress: bool = True, quiet: bool = False,
                name: str = NAME) -> list:
    """Train `members` (see `plan`) as one vmapped program; returns one RunResult per member.

    Every member's RunResult carries the stack's epoch_seconds and compile_seconds and
    settings {"runner": "vmap", "members": K, ...}: a stacked epoch trains K member-epochs.
    """
    epochs = config.epochs if epochs is None else epochs
    workdir = Path(workdir)
    k = len(members)
    steps = steps_per_epoch(data, config.batch_size)
    check_memory(workload, config, k, data, steps)  # before compiling or allocating anything
    if len({m.name for m in members}) != k:
        raise UserError("two members of the stack have the same name")
    configs = [dataclasses.replace(config, **m.settings) for m in members]

    # Compile from shapes: the memory check sees XLA's figures before a state exists.
    member_shape = jax.eval_shape(lambda: workload.init_state(config, jax.random.key(0)))
    runner = StackRunner(workload, config, members, steps, member_shape)
    abstract = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((k,) + s.shape, s.dtype), member_shape)
    data_spec = {n: jax.ShapeDtypeStruct(a.shape, a.dtype) for n, a in data.train.items()}
    key_spec = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), k))
    try:
        compile_seconds = runner.compile(abstract, data_spec, {"data": key_spec, "train": key_spec})
    except Exception as e:  # noqa: BLE001 - a step that cannot be batched (an FFI call without a rule, ...)
        raise UserError(f"{workload.name} cannot be vectorised with these settings: {first_line(e)}") from e
    check_memory(workload, config, k, data, steps, runner)

    identity = {"workload": workload.name, "framework": "jax"}
    dirs = [workdir / m.name for m in members]
    saved_configs = [{**dataclasses.asdict(c), "seed": m.seed, "runner": "scan"} for c, m in zip(configs, members)]
    held = claim_stack(workdir, dirs, identity, resume)
    try:
        return _train_claimed(workload, config, members, configs, saved_configs, runner, compile_seconds, held,
                              workdir=workdir, dirs=dirs, identity=identity, epochs=epochs, resume=resume, data=data,
                              steps=steps, checkpoints=checkpoints, progress=progress, quiet=quiet, name=name)
    finally:
        release_all(held)


def _train_claimed(workload, config, members, configs, saved_configs, runner, compile_seconds, held, *, workdir,
                   dirs, identity, epochs, resume, data, steps, checkpoints, progress, quiet, name) -> list:
    """train_stack, once the stack's and every member's workdir are claimed (nothing written yet)."""
    k = len(members)
    member_keys = [rng.streams(m.seed) for m in members]
    states = [workload.init_state(c, kk["init"]) for c, kk in zip(configs, member_keys)]
    treedefs = [jax.tree_util.tree_structure(s) for s in states]
    # Dressed in the static fields the program was compiled with (from the shapes above).
    state = jax.tree_util.tree_unflatten(runner.treedef, jax.tree_util.tree_leaves(stack_states(states)))
    del states
    keys = {n: jnp.stack([kk[n] for kk in member_keys]) for n in ("data", "train")}
    hparams = runner.hparams()
    meta = {**identity, "variant": config.variant, "members": [m.name for m in members],
            "seeds": [m.seed for m in members]}
    dropped: dict = {}  # member name -> why
    records: dict = {}  # member name -> its metrics.jsonl records so far (in the stack's checkpoint)

    ckpt = open_store("jax", workdir / "checkpoints") if checkpoints else None
    logs = []
    try:
        start = 0
        if resume and ckpt is not None and ckpt.latest() is not None:
            state, saved = ckpt.restore(state, meta)  # refuses another stack's checkpoint: nothing written yet
            start = int(saved["epochs_done"])
            dropped = dict(saved.get("dropped", {}))
            records = {m: list(r) for m, r in saved.get("records", {}).items()}
        # Every check passed: from here on the stack changes its workdirs. A finished stack
        # only puts back what a member lost (its folder deleted): config.json, its records.
        for h, c, d in zip(held[1:], saved_configs, dirs):
            if start < epochs or not (d / "config.json").exists():
                h.commit(c)
        if start < epochs:
            held[0].commit(None)  # the stack's own folder holds no config.json (that marks a single run)
            if ckpt is not None:
                ckpt.clean_leftovers()
                for moved in ckpt.set_aside_damaged():
                    info(f"moved the damaged checkpoint to {moved}")
        if resume and start and not quiet:
            info(f"resuming the {k}-member {workload.name} stack from epoch {start} in {workdir}")
        if start >= epochs and not quiet:
            info(f"{workdir} already holds {start} epochs; nothing to train (ask for more with --epochs)")
        data_dev = jax.device_put(data.train)
        for m, d in zip(members, dirs):
            _restore_records(d, records.get(m.name, []), start)
        logs = [EpochLog(d, steps, start, progress=False, quiet=True) for d in dirs]
        bar = EpochProgress(steps, enabled=progress and not quiet)
        qualities, artifacts = [{} for _ in members], [{} for _ in members]
        epoch_seconds = []
        members_now = None
        for epoch in range(start, epochs):
            bar.start(epoch + 1, epochs)
            t0 = time.perf_counter()
            state, metrics = runner.run_epoch(state, data_dev, keys, hparams, epoch)
            run_seconds = time.perf_counter() - t0
            bar.advance(steps)
            bar.close()
            first = {"compile_seconds": compile_seconds} if epoch == start else {}
            seconds = run_seconds + first.get("compile_seconds", 0.0)
            epoch_seconds.append(seconds)
            finite = runner.finite(state)
            members_now = None  # one set of member copies at a time
            members_now = runner.split(state, treedefs)
            for i, m in enumerate(members):
                if m.name in dropped:
                    continue
                ev = partial(_evaluate, workload, configs[i], members_now[i], data, member_keys[i])
                try:
                    if not finite[i]:
                        raise TrainingDiverged(f"the train state became NaN/inf in epoch {epoch + 1}")
                    qualities[i], artifacts[i] = logs[i].end(epoch, {n: v[:, i] for n, v in metrics.items()},
                                                             seconds, run_seconds, ev, **first)
                except TrainingDiverged as e:
                    dropped[m.name] = str(e).split(";")[0]  # the rest names a checkpoint a member lacks
                    if not quiet:
                        info(f"flaxport: warning: member {m.name} dropped: {e}")
            if len(dropped) == k:
                raise TrainingDiverged(f"every member of the stack diverged (first: {members[0].name}: "
                                       f"{dropped[members[0].name]})")
            for i, m in enumerate(members):  # a dropped member's NaNs must not reach a checkpoint:
                if m.name in dropped and not finite[i]:  # its slot restarts from its initial state
                    fresh = workload.init_state(configs[i], member_keys[i]["init"])
                    fresh = jax.tree_util.tree_unflatten(runner.treedef, jax.tree_util.tree_leaves(fresh))
                    state = jax.tree_util.tree_map(lambda a, b: a.at[i].set(b), state, fresh)
            if not quiet:
                info(_console_line(epoch, epochs, members, logs, dropped, seconds))
            if ckpt is not None:
                now = {m.name: records.get(m.name, []) + log.history for m, log in zip(members, logs)}
                ckpt.save(epoch + 1, state, {**meta, "epochs_done": epoch + 1, "dropped": dropped,
                                             "records": json.loads(json.dumps(now, default=plain))},
                          step=(epoch + 1) * steps)
    finally:
        for log in logs:
            log.close()
        if ckpt is not None:
            ckpt.close()

    done = max(start, epochs)
    if members_now is None:  # nothing trained (a finished stack resumed): report its quality
        members_now = runner.split(state, treedefs)
        for i, m in enumerate(members):
            if m.name not in dropped:
                qualities[i], artifacts[i] = _evaluate(workload, configs[i], members_now[i], data, member_keys[i])
    results = []
    for i, (m, d) in enumerate(zip(members, dirs)):
        alive = m.name not in dropped
        if alive:
            if checkpoints:
                _save_member(d, members_now[i], {**identity, "variant": config.variant, "seed": m.seed}, done)
            workload.write_pictures(d, data, artifacts[i], f"{workload.name} {name} {m.name}, epoch {done}")
        settings = {"runner": "vmap", "members": k, "member": m.name, "swept": m.settings,
                    "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), "dropped": dropped.get(m.name)}
        results.append(RunResult(name, "jax", epoch_seconds, compile_seconds if epoch_seconds else 0.0,
                                 qualities[i] if alive else {}, logs[i].history if logs else [],
                                 members_now[i], artifacts[i], settings))
    return results


def _restore_records(workdir: Path, records: list, epochs_done: int) -> None:
    """A member's metrics.jsonl made whole from the stack's saved records of its first
    `epochs_done` epochs, when some are missing (its folder was deleted)."""
    path = workdir / "metrics.jsonl"
    have = set()
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            have.add(json.loads(line).get("epoch"))
        except (ValueError, AttributeError):
            continue  # a line cut by a crash: MetricsWriter drops it
    want = [r for r in records if r["epoch"] <= epochs_done]
    if {r["epoch"] for r in want} - have:
        write_text(path, "".join(json.dumps(r) + "\n" for r in want))


def _evaluate(workload, config, state, data, keys):
    return workload.evaluate(config, state, data, rng.at(keys["eval"], 0))


def _save_member(workdir: Path, state, meta: dict, epochs_done: int) -> None:
    """The member's own single-run checkpoint (what evaluate, sample and --resume read)."""
    ckpt = open_store("jax", workdir / "checkpoints")
    try:  # the member's workdir is claimed by the stack: its unfinished saves may go
        ckpt.clean_leftovers()
        if ckpt.latest() != epochs_done:
            ckpt.save(epochs_done, state, {**meta, "epochs_done": epochs_done})
    finally:
        ckpt.close()


def _console_line(epoch: int, epochs: int, members: list, logs: list, dropped: dict, seconds: float) -> str:
    """'epoch 2/5 | 4 members | g_loss 0.25 (0.24-0.27) | w1 0.06 (0.01-0.21) | 3.10 s'."""
    live = [log.history[-1] for m, log in zip(members, logs) if m.name not in dropped and log.history]
    parts = [f"epoch {epoch + 1}/{epochs}", f"{len(live)} member{'s' if len(live) != 1 else ''}"
             + (f" ({len(dropped)} dropped)" if dropped else "")]
    for group in ("train", "quality"):
        keys = [kk for kk, v in (live[0][group] if live else {}).items() if isinstance(v, (int, float))]
        stats = []
        for kk in keys[:3]:
            vals = [r[group][kk] for r in live]
            stats.append(f"{kk} {np.median(vals):.4f} ({min(vals):.4f}-{max(vals):.4f})")
        if stats:
            parts.append(" ".join(stats))
    parts.append(f"{seconds:.2f} s")
    return " | ".join(parts)
