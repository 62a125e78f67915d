"""Torch checkpoint files <-> Flax train states of the registered workloads.

Torch side, by file type:
  .pt / .pth     torch.load(weights_only=True) of one of
                 - a state_dict (a one-model workload: the module's keys; the GAN: keys
                   prefixed `G.` / `D.`, or a dict {"G": state_dict, "D": state_dict});
                 - the torch twin's own checkpoint (harness/torch_loop.py):
                   {"state": {"model": state_dict, "opt": ...} or {"G", "D", ...}, "meta": {...}},
                   whose meta must name this workload.
  .safetensors   flat tensors (prefixed keys for the GAN); metadata `flaxport_workload`
                 is written and, when present, checked.
Written back: .pt as the state_dict ({"G", "D"} for the GAN), .safetensors flat.

Flax side: the workload's train state (`workload.init_state`'s tree) with the torch
weights and BatchNorm statistics, step 0 and a fresh optimizer (torch's optimizer state is
not carried). BatchNorm `num_batches_tracked` has no Flax slot: the counters are returned
beside the state (and `convert` keeps them in the checkpoint's meta), and going back each
is that count plus the train-mode forwards the Flax state has run since (Part.forwards).

Every key, shape and dtype is checked: a mismatch is a PortError (one line, naming the key).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from flaxport.errors import UserError
from flaxport.port.twins import part_names, parts
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
        raise UserError(f"{path}: not a readable torch checkpoint: {_first_line(e)}") from e
    meta = None
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
    if not isinstance(obj, dict):
        raise UserError(f"{path} holds a {type(obj).__name__}, not a state_dict")
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
        raise UserError(f"{path}: not a readable safetensors file: {_first_line(e)}") from e
    if meta.get("flaxport_workload") not in (None, name):
        raise UserError(f"{path} holds a {meta['flaxport_workload']!r} model, not {name!r}")
    return out


def write_torch_file(path, flat: dict, workload) -> Path:
    """Write flat {torch key: array} as .pt (state_dict; {"G", "D"} for the GAN) or .safetensors,
    atomically (a temporary file renamed into place)."""
    path, name = Path(path), _name(workload)
    if path.suffix not in FILE_SUFFIXES:
        raise UserError(f"{path}: unknown checkpoint type {path.suffix!r} (use .pt, .pth or .safetensors)")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        if path.suffix == SAFETENSORS_SUFFIX:
            from safetensors.numpy import save_file

            save_file({k: np.array(v, order="C") for k, v in flat.items()}, tmp,  # ascontiguousarray makes 0-d 1-d
                      metadata={"flaxport_workload": name})
        else:
            import collections

            import torch

            tensors = collections.OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in flat.items())
            names = part_names(name)
            if len(names) > 1:  # {"G": state_dict, "D": state_dict}: what G.load_state_dict(ckpt["G"]) takes
                tensors = {n: collections.OrderedDict((k[len(n) + 1:], v) for k, v in tensors.items()
                                                      if k.startswith(n + ".")) for n in names}
            torch.save(tensors, tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


# --------------------------------------------------------------------------- state <-> flat
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
    return jax.eval_shape(lambda: wl.init_state(config, key))


def state_from_flat(workload, config, flat: dict, key=None) -> tuple:
    """(Flax train state, {torch key: num_batches_tracked}) from flat torch tensors.

    The state has the torch weights and BatchNorm statistics, step 0, and a freshly
    initialised optimizer; its tree is exactly `workload.init_state(config, key)`'s.
    """
    import jax
    import jax.numpy as jnp

    state = abstract_state(workload, config, key)
    counters = {}
    for part, sd in split(flat, workload, config):
        km = part.key_map()
        try:
            variables = km.to_flax(sd)
        except PortError as e:
            raise type(e)(f"{part.name} (keys {part.prefix}*): {e}" if part.prefix else str(e)) from None
        counters.update({part.prefix + k: int(np.asarray(sd[k])) for k in km.dropped if k in sd})
        ts = part.get(state)
        filled = {}
        for coll in ("params", "batch_stats"):
            target = getattr(ts, coll)
            if target is not None:  # None: a state without BatchNorm (vae)
                filled[coll] = _fill(target, variables.get(coll, {}), coll, km, part)
        params = filled["params"]
        ts = ts.replace(step=jnp.zeros((), jnp.int32), opt_state=ts.tx.init(params), **filled)
        if getattr(ts, "ema_params", None) is not None:
            ts = ts.replace(ema_params=params)  # an EMA of the torch weights starts at them
        state = part.put(state, ts)
    if abstract := [jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(state)
                    if isinstance(leaf, jax.ShapeDtypeStruct)]:
        raise PortError(f"the {_name(workload)} state has {abstract[0]}, which no torch tensor fills")
    return state, counters


def _fill(target, values: dict, coll: str, km, part):
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
                raise ShapeMismatchError(f"dtype mismatch: torch {part.prefix + leaf.torch_key!r} is {got.dtype}, "
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
    the train-mode forwards the state ran since.
    """
    import jax

    counters = counters or {}
    out = {}
    for part in parts(_name(workload), config):
        ts = part.get(state)
        variables = {"params": jax.device_get(ts.params)}
        if ts.batch_stats:
            variables["batch_stats"] = jax.device_get(ts.batch_stats)
        km = part.key_map()
        sd = km.to_torch(variables)
        for k in km.dropped:
            sd[k] = np.array(counters.get(part.prefix + k, 0) + part.forwards(state), dtype=np.int64)
        out.update({part.prefix + k: v for k, v in sd.items()})
    return out


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


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
