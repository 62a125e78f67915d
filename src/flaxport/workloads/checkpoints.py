"""Torch checkpoint files <-> Flax train states of the registered workloads.

Torch side, by file type:
  .pt / .pth     torch.load(weights_only=True) of one of
                 - a state_dict (a one-model workload: the module's keys; the GAN: keys
                   prefixed `G.` / `D.`, or a dict {"G": state_dict, "D": state_dict});
                 - the torch twin's own checkpoint (harness/torch_loop.py):
                   {"state": {"model": state_dict, "opt": ...} or {"G", "D", ...}, "meta": {...}},
                   whose meta must name this workload;
                 - ddim: also {"model": state_dict, "ema_model": state_dict} (what this
                   module writes; TorchDDIM.state_dict()'s keys for the two networks).
  .safetensors   flat tensors (prefixed keys for the GAN; ddim's EMA copy behind
                 `ema_model.`); metadata `flaxport_workload` is written and, when
                 present, checked.
Written back: .pt as the state_dict ({"G", "D"} for the GAN, {"model", "ema_model"} for
ddim), .safetensors flat.

Flax side: the workload's train state (`workload.init_state`'s tree) with the torch
weights and BatchNorm statistics, step 0 and a fresh optimizer (torch's optimizer state is
not carried). ddim's EMA network (ema_params, ema_batch_stats) comes from the file's EMA
copy (the torch twin checkpoint's `ema_model`) through the same key map; a file without
one (a bare state_dict) gives an EMA equal to the weights, as at the start of a run.
BatchNorm `num_batches_tracked` has no Flax slot: the counters are returned beside the
state (and `convert` keeps them in the checkpoint's meta), and going back each is that
count plus the train-mode forwards the Flax state has run since (Part.forwards).

Every key, shape and dtype is checked: a mismatch is a PortError (one line, naming the key).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from flaxport.errors import UserError, first_line
from flaxport.workloads.twins import ema_name, part_names, parts
from flaxport.port.weights import PortError, ShapeMismatchError, UnexpectedKeyError

TORCH_SUFFIXES = (".pt", ".pth")
SAFETENSORS_SUFFIX = ".safetensors"
FILE_SUFFIXES = TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,)


def _name(workload) -> str:
    return workload if isinstance(workload, str) else workload.name


def _np(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu()
        v = v.contiguous().numpy()
    return np.array(v, copy=True)


# --------------------------------------------------------------------------- torch files
def read_torch_file(path, workload) -> tuple[dict, dict | None]:
    """(flat {torch key: NumPy array}, the torch twin's meta or None) of a .pt/.pth/.safetensors file."""
    path, name = Path(path), _name(workload)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    if path.suffix == SAFETENSORS_SUFFIX:
        return _read_safetensors(path, name), None
    if path.suffix not in TORCH_SUFFIXES:
        raise UserError(f"{path}: unknown checkpoint type {path.suffix!r} (use .pt, .pth or .safetensors)")
    import torch

    try:  # weights_only: a checkpoint from elsewhere must not run code
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zip and torch errors alike
        raise UserError(f"{path}: not a readable torch checkpoint: {first_line(e)}") from e
    meta = None
    ema = ema_name(name)
    if isinstance(obj, dict) and set(obj) >= {"state", "meta"} and isinstance(obj["meta"], dict):
        meta = obj["meta"]  # the torch twin's checkpoint (harness/torch_loop.py)
        if meta.get("workload") not in (None, name):
            raise UserError(f"{path} is a {meta.get('workload')!r} checkpoint, not {name!r}")
        if meta.get("framework") not in (None, "torch"):
            raise UserError(f"{path} is a {meta.get('framework')!r} checkpoint, not a torch one")
        state = obj["state"]
        names = part_names(name)
        missing = [n for n in names if n not in state]
        if missing:
            raise UserError(f"{path}: the checkpoint's state has no {missing[0]!r} entry")
        obj = {n: state[n] for n in names} if len(names) > 1 else state["model"]
        if ema is not None and isinstance(state.get(ema), dict):
            obj = {"model": obj, ema: state[ema]}
    if not isinstance(obj, dict):
        raise UserError(f"{path} holds a {type(obj).__name__}, not a state_dict")
    if ema is not None and "model" in obj and set(obj) <= {"model", ema} and all(
            isinstance(v, dict) for v in obj.values()):  # {"model": sd, "ema_model": sd}
        flat = _flatten(obj["model"], path)
        flat.update(_flatten(obj.get(ema, {}), path, ema + "."))
        return flat, meta
    return _flatten(obj, path), meta


def _flatten(tree, path, prefix="") -> dict:
    """Nested dicts of tensors -> {"a.b.c": array}; anything else is an error naming the key."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, path, key + "."))
        elif hasattr(v, "detach") or isinstance(v, np.ndarray):
            out[key] = _np(v)
        else:
            raise UserError(f"{path}: {key!r} is a {type(v).__name__}, not a tensor (not a state_dict)")
    return out


def _read_safetensors(path, name) -> dict:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
            out = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise UserError(f"{path}: not a readable safetensors file: {first_line(e)}") from e
    if meta.get("flaxport_workload") not in (None, name):
        raise UserError(f"{path} holds a {meta['flaxport_workload']!r} model, not {name!r}")
    return out


def write_torch_file(path, flat: dict, workload) -> Path:
    """Write flat {torch key: array} as .pt (state_dict; {"G", "D"} for the GAN) or .safetensors,
    atomically (a temporary file renamed into place). The file is serialised in memory first,
    so a write error (a full disk) is the system's own reason, in one UserError line."""
    path, name = Path(path), _name(workload)
    if path.suffix not in FILE_SUFFIXES:
        raise UserError(f"{path}: unknown checkpoint type {path.suffix!r} (use .pt, .pth or .safetensors)")
    blob = _serialise(path.suffix, flat, name)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return path


def _serialise(suffix: str, flat: dict, name: str) -> bytes:
    if suffix == SAFETENSORS_SUFFIX:
        from safetensors.numpy import save

        return save({k: np.array(v, order="C") for k, v in flat.items()},  # ascontiguousarray makes 0-d 1-d
                    metadata={"flaxport_workload": name})
    import collections
    import io

    import torch

    tensors = collections.OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in flat.items())
    names, ema = part_names(name), ema_name(name)
    if len(names) > 1:  # {"G": state_dict, "D": state_dict}: what G.load_state_dict(ckpt["G"]) takes
        tensors = {n: collections.OrderedDict((k[len(n) + 1:], v) for k, v in tensors.items()
                                              if k.startswith(n + ".")) for n in names}
    elif ema is not None and any(k.startswith(ema + ".") for k in tensors):
        main, ema_sd = split_ema(tensors, name)  # {"model": sd, "ema_model": sd}, as TorchDDIM keeps them
        tensors = {"model": collections.OrderedDict(main), ema: collections.OrderedDict(ema_sd)}
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


# --------------------------------------------------------------------------- state <-> flat
def split_ema(flat: dict, workload) -> tuple[dict, dict]:
    """(the model's flat keys, the EMA copy's flat keys without their `ema_model.` prefix) of
    a workload with an EMA copy (ddim); (flat, {}) for one without."""
    ema = ema_name(_name(workload))
    if ema is None:
        return dict(flat), {}
    pre = ema + "."
    return ({k: v for k, v in flat.items() if not k.startswith(pre)},
            {k[len(pre):]: v for k, v in flat.items() if k.startswith(pre)})


def split(flat: dict, workload, config) -> list:
    """[(Part, its state_dict)] of a flat dict (wrapper prefixes removed, see _unwrap); a key no
    part takes is an UnexpectedKeyError."""
    ps = parts(_name(workload), config)
    out, taken = [], set()
    for p in ps:
        sd = {k[len(p.prefix):]: v for k, v in flat.items() if k.startswith(p.prefix)}
        taken |= {p.prefix + k for k in sd}
        out.append((p, _unwrap(sd)))
    if extra := [k for k in flat if k not in taken]:
        hint = f" (keys start with {' or '.join(repr(p.prefix) for p in ps)})" if ps[0].prefix else ""
        raise UnexpectedKeyError(f"unexpected key {extra[0]!r}{hint}")
    return out


def _unwrap(sd: dict) -> dict:
    """A state_dict saved from a wrapped module, without the wrapper's prefix: `module.`
    (DataParallel / DistributedDataParallel) or `_orig_mod.` (torch.compile), when every key has it."""
    for prefix in ("module.", "_orig_mod."):
        if sd and all(k.startswith(prefix) for k in sd):
            sd = {k[len(prefix):]: v for k, v in sd.items()}
    return sd


def abstract_state(workload, config, key=None):
    """The workload's train state as shapes and dtypes only (nothing computed)."""
    import jax

    from flaxport.workloads import registry

    wl = registry.get(_name(workload)) if isinstance(workload, str) else workload
    key = jax.random.key(0) if key is None else key
    # The key goes in as an argument, so init_state sees a tracer: ddim's init_state jits
    # itself with compiler options when its key is concrete, which a trace may not nest.
    return jax.eval_shape(lambda k: wl.init_state(config, k), key)


def state_from_flat(workload, config, flat: dict, key=None) -> tuple:
    """(Flax train state, {torch key: num_batches_tracked}) from flat torch tensors.

    The state has the torch weights and BatchNorm statistics, step 0, and a freshly
    initialised optimizer; its tree is exactly `workload.init_state(config, key)`'s. A
    part's EMA copy (Part.ema: ddim) is filled from the flat `ema_model.*` keys when there
    are any (strictly: all of them, through the same key map), else from the weights.
    """
    import jax
    import jax.numpy as jnp

    state = abstract_state(workload, config, key)
    main, ema_flat = split_ema(flat, workload)
    ema = ema_name(_name(workload))
    ema_sds = {p.name: sd for p, sd in split(ema_flat, workload, config)} if ema_flat else {}
    counters = {}
    for part, sd in split(main, workload, config):
        km = part.key_map()
        variables = _to_flax(km, sd, part)
        counters.update({part.prefix + k: int(np.asarray(sd[k])) for k in km.dropped if k in sd})
        ts = part.get(state)
        filled = _fill_variables(ts, ("params", "batch_stats"), variables, km, part, part.prefix)
        params = filled["params"]
        ts = ts.replace(step=jnp.zeros((), jnp.int32), opt_state=ts.tx.init(params), **filled)
        if part.ema:
            if part.name in ema_sds:  # the torch twin's ema_model
                ema_sd = ema_sds[part.name]
                prefix = f"{ema}.{part.prefix}"
                ema_vars = _to_flax(km, ema_sd, part, prefix)
                counters.update({prefix + k: int(np.asarray(ema_sd[k])) for k in km.dropped if k in ema_sd})
                ts = ts.replace(**_fill_variables(ts, part.ema, ema_vars, km, part, prefix))
            else:  # no EMA in the file: it starts at the weights, as a fresh run's does
                ts = ts.replace(**{f: filled[c] for f, c in zip(part.ema, ("params", "batch_stats")) if c in filled})
        elif getattr(ts, "ema_params", None) is not None:
            ts = ts.replace(ema_params=params)  # an EMA of the torch weights starts at them
        state = part.put(state, ts)
    if abstract := [jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(state)
                    if isinstance(leaf, jax.ShapeDtypeStruct)]:
        raise PortError(f"the {_name(workload)} state has {abstract[0]}, which no torch tensor fills")
    return state, counters


def _to_flax(km, sd: dict, part, prefix: str | None = None) -> dict:
    """km.to_flax(sd), its PortError prefixed with the flat keys' prefix (`G.`, `ema_model.`)."""
    prefix = part.prefix if prefix is None else prefix
    try:
        return km.to_flax(sd)
    except PortError as e:
        raise type(e)(f"{part.name if prefix == part.prefix else prefix.rstrip('.')} (keys {prefix}*): {e}"
                      if prefix else str(e)) from None


def _fill_variables(ts, fields: tuple, variables: dict, km, part, prefix: str) -> dict:
    """{field: filled tree} for the TrainState's (params field, batch_stats field); a field that
    is None (a state without BatchNorm: vae) stays out."""
    out = {}
    for field, coll in zip(fields, ("params", "batch_stats")):
        target = getattr(ts, field)
        if target is not None:
            out[field] = _fill(target, variables.get(coll, {}), coll, km, part, prefix)
    return out


def _fill(target, values: dict, coll: str, km, part, prefix: str = ""):
    """target (a tree of ShapeDtypeStructs) with the arrays of `values` at the same paths; dtypes
    checked in the torch state_dict's order (the key map checked names and shapes)."""
    import jax
    import jax.numpy as jnp

    want = {tuple(getattr(k, "key", getattr(k, "name", k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(target)}
    for leaf in km.leaves:
        if leaf.flax_path[0] == coll and leaf.flax_path[1:] in want:
            got = _at(values, leaf.flax_path[1:], coll)
            if got.dtype != want[leaf.flax_path[1:]].dtype:
                raise ShapeMismatchError(f"dtype mismatch: torch {prefix + leaf.torch_key!r} is {got.dtype}, "
                                         f"the Flax model takes {want[leaf.flax_path[1:]].dtype} (cast it first)")

    def put(path, _):
        return jnp.asarray(_at(values, tuple(getattr(k, "key", getattr(k, "name", k)) for k in path), coll))

    return jax.tree_util.tree_map_with_path(put, target)


def _at(values: dict, names: tuple, coll: str):
    node = values
    for n in names:
        if not isinstance(node, dict) or n not in node:  # the model and the workload's state disagree
            raise PortError(f"the Flax state's {coll}/{'/'.join(map(str, names))} has no torch tensor")
        node = node[n]
    return node


def flat_from_state(workload, config, state, counters: dict | None = None) -> dict:
    """flat {torch key: NumPy array} of a Flax train state, in the torch modules' key order.

    counters: num_batches_tracked at conversion (state_from_flat's); each key gets that plus
    the train-mode forwards the state ran since. A part's EMA copy (ddim) follows the
    model's keys behind `ema_model.`; its counters are the model's, as the torch twin's
    EMA update copies them.
    """
    import jax

    counters = counters or {}
    ema = ema_name(_name(workload))
    out, ema_out = {}, {}
    for part in parts(_name(workload), config):
        ts = part.get(state)
        km = part.key_map()
        fields = [("params", "batch_stats", part.prefix)]
        if part.ema:
            fields.append((*part.ema, f"{ema}.{part.prefix}"))
        for p_field, s_field, prefix in fields:
            variables = {"params": jax.device_get(getattr(ts, p_field))}
            if getattr(ts, s_field):
                variables["batch_stats"] = jax.device_get(getattr(ts, s_field))
            sd = km.to_torch(variables)
            for k in km.dropped:
                start = counters.get(prefix + k, counters.get(part.prefix + k, 0))
                sd[k] = np.array(start + part.forwards(state), dtype=np.int64)
            (out if prefix == part.prefix else ema_out).update({prefix + k: v for k, v in sd.items()})
    return {**out, **ema_out}


# --------------------------------------------------------------------------- public entry
def init_state_from_torch(workload, config, path, key):
    """A Flax train state for `workload` (a name or Workload record) and `config`, its weights
    and BatchNorm statistics read from the torch checkpoint `path` (.pt/.pth/.safetensors,
    any form read_torch_file takes); step 0, optimizer freshly initialised.

    `key` plays the part it plays in `workload.init_state(config, key)` (nothing torch fills
    is random). Raises UserError/PortError (one line, naming the key) on any mismatch.
    `flaxport train WORKLOAD --init-from PATH` calls this.
    """
    flat, _ = read_torch_file(path, workload)
    state, _ = state_from_flat(workload, config, flat, key)
    return state
