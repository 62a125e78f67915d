"""Config validation in one place: every field's allowed values, and the memory a config needs.

Each workload's config.py names its fields' rules in `RULES` ({field: kind or tuple of
allowed values}; the dataclass's `CHOICES` count too), settings that depend on each other
in `CHECKS` ((field, predicate(config), what it must be: text or text(config)), ...), and
what the config needs in memory in `memory_estimate(config)`. This module applies them to
`--set` values, to a config.json read back (hand-edited: a list, a string batch size, an
unknown variant, a negative count) and, before anything is allocated, to the memory a run
would take.
Every refusal is one UserError line naming the setting.
"""
from __future__ import annotations

import dataclasses
import math
import sys

from flaxport.errors import UserError

SEED_LIMIT = 2**63  # seeds are 0 .. 2**63 - 1: what every framework's generator takes


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# kind: (the type it is read as, test, what it must be)
KINDS = {
    "size": (int, lambda v: _int(v) and v >= 1, "a whole number, at least 1"),
    "count": (int, lambda v: _int(v) and v >= 0, "a whole number, at least 0"),
    "seed": (int, lambda v: _int(v) and 0 <= v < SEED_LIMIT, "a whole number from 0 to 2**63 - 1"),
    "sizes": (tuple, lambda v: bool(v) and all(_int(x) and x >= 1 for x in v),
              "a non-empty list of whole numbers >= 1 (e.g. 64,32)"),
    "nonnegative": (float, lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    "positive": (float, lambda v: _real(v) and v > 0, "a finite number > 0"),
    "fraction": (float, lambda v: _real(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "beta": (float, lambda v: _real(v) and 0 <= v < 1, "a number in [0, 1) (Adam's betas)"),
    "finite": (float, _real, "a finite number"),
    "values": (tuple, lambda v: bool(v) and all(_real(x) for x in v), "a non-empty list of finite numbers"),
    "stats": (tuple, lambda v: all(_real(x) for x in v), "a list of finite numbers"),
    "flag": (bool, lambda v: isinstance(v, bool), "true or false"),
}


def rules(config) -> dict:
    """{field: kind name or tuple of allowed values} for a config instance or class."""
    cls = config if isinstance(config, type) else type(config)
    module = sys.modules[cls.__module__]
    return {**getattr(cls, "CHOICES", {}), **getattr(module, "RULES", {})}


def problem(config, field: str, value) -> str | None:
    """What is wrong with `value` for `field` of `config` (by its rule), or None."""
    rule = rules(config).get(field)
    if isinstance(rule, tuple):
        if value not in rule:
            return f"must be one of {', '.join(map(str, rule))}"
        return None
    if rule is None:
        return None
    _, ok, what = KINDS[rule]
    return None if ok(value) else f"must be {what}"


def check(config, where: str, blame=None):
    """`config` if every field keeps its rule and every CHECKS entry holds; else one UserError.

    where: the source named in the message ("--set", a config.json path). blame: fields the
    user changed (only those can be wrong in a variant's own settings); None: all of them.
    """
    names = [f.name for f in dataclasses.fields(config) if f.name != "variant"]
    for name in names if blame is None else [n for n in names if n in blame]:
        value = getattr(config, name)
        why = problem(config, name, value)
        if why:
            raise UserError(f"{where}: {name} {why}, got {_show(value)}")
    module = sys.modules[type(config).__module__]
    for field, ok, what in getattr(module, "CHECKS", ()):
        try:
            good = ok(config)
        except (ArithmeticError, ValueError, TypeError):
            good = False
        if not good:
            text = what(config) if callable(what) else f"{what}, got {_show(getattr(config, field))}"
            raise UserError(f"{where}: {field} {text}")
    return config


def parse_value(config, field: str, raw: str):
    """A --set string read as the field's type (tuples: comma-separated; bools: true/false/1/0)."""
    current = getattr(config, field)
    rule = rules(config).get(field)
    try:
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(current, tuple):
            kind = int if rule == "sizes" else type(current[0]) if current else float
            return tuple(kind(x) for x in raw.split(",") if x.strip())
        return type(current)(raw)
    except ValueError:
        kind = "list" if isinstance(current, tuple) else type(current).__name__
        raise UserError(f"--set {field}: cannot read {raw!r} as {kind}") from None


def from_dict(workload, saved, where: str):
    """The config a run used, from config.json's "config" object, every field checked.

    A field missing from the file takes its variant's value (runs written before the field
    existed); an unknown variant, a value of the wrong type or out of range is refused."""
    if not isinstance(saved, dict):
        raise UserError(f"{where}: \"config\" is a JSON {type(saved).__name__}, not an object of settings")
    variant = saved.get("variant", "default")
    if variant not in workload.variants:
        raise UserError(f"{where}: unknown config variant {variant!r} for {workload.name}; "
                        f"one of: {', '.join(workload.variants)}")
    base = workload.get_config(variant)
    values = {}
    for f in dataclasses.fields(base):
        if f.name == "variant" or f.name not in saved:
            continue
        values[f.name] = _from_json(base, f.name, saved[f.name], where)
    return check(dataclasses.replace(base, **values), where)


def _from_json(base, field: str, value, where: str):
    default = getattr(base, field)
    rule = rules(base).get(field)
    if isinstance(default, tuple) and isinstance(value, list):
        value = tuple(value)
    elif isinstance(default, float) and _int(value):
        value = float(value)
    want = bool if isinstance(default, bool) else type(default)
    elements_ok = not isinstance(value, tuple) or all(_int(x) if rule == "sizes" else _real(x) for x in value)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)) or not elements_ok:
        kind = "list" if want is tuple else want.__name__
        raise UserError(f"{where}: {field} must be of type {kind} (like {_show(default)}), got {value!r}")
    return value


def check_seed(seed, flag: str = "--seed") -> int:
    if not _int(seed) or not 0 <= seed < SEED_LIMIT:
        raise UserError(f"{flag} must be a whole number from 0 to 2**63 - 1, got {_show(seed)}")
    return seed


def check_memory(workload_name: str, config, context: str = "") -> None:
    """Refuse, before anything is allocated, a config whose estimated peak memory exceeds
    what this machine has free (host memory plus swap; an accelerator's own memory).

    memory_estimate(config) -> [(bytes, what), ...]: the first entry is what stays for the
    whole run (the train state), each other one a peak on top of it (a batch, evaluation).
    The estimates are lower bounds, so a refusal is certain, not a guess.
    """
    module = sys.modules[type(config).__module__]
    estimate = getattr(module, "memory_estimate", None)
    if estimate is None:
        return
    parts = estimate(config)
    state, peaks = parts[0], parts[1:] or [(0, "")]
    worst = max(peaks, key=lambda p: p[0])
    need = state[0] + worst[0]
    budget = available_bytes()
    if budget is None or need <= budget:
        return
    what = worst[1] if worst[0] >= state[0] else state[1]
    raise UserError(f"{context}{workload_name} needs about {size_text(need)} of memory ({what}), more than the "
                    f"{size_text(budget)} free here; lower those settings")


def available_bytes() -> int | None:
    """Free memory: MemAvailable + SwapFree (Linux), else physical memory; None if unknown.
    Where JAX already runs on an accelerator, no more than that device's memory."""
    host = _host_bytes()
    device = None
    if "jax" in sys.modules:
        try:
            dev = sys.modules["jax"].local_devices()[0]
            if dev.platform != "cpu":
                device = (dev.memory_stats() or {}).get("bytes_limit")
        except Exception:  # noqa: BLE001 - no backend, no statistics: the host's figure stands
            device = None
    known = [b for b in (host, device) if b]
    return min(known) if known else None


def _host_bytes() -> int | None:
    try:
        info = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        return info["MemAvailable"] + info.get("SwapFree", 0)
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def size_text(n: float) -> str:
    """A byte count as people read it: 1.5e9 -> "1.5 GB"."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def _show(value) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(empty)"
    return repr(value) if isinstance(value, str) else str(value)
