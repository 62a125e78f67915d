"""The torch optimizer of train_step.py: read from --optimizer or a torch object, and written out
as make_optimizer(), the optax chain port/optimizers/chains.py builds for check_step."""
from __future__ import annotations

import ast
import dataclasses
import inspect

from flaxport.errors import first_line
from flaxport.translate.training.texts import TrainStepError, check_literals, literal_kwargs, read_call, split_name

PREFIXES = ("", "torch.optim", "optim")


def translated() -> list:
    from flaxport.port.optimizers.chains import NAMES

    return list(NAMES.values())


def parse_optimizer(text: str) -> tuple[str, dict]:
    """'torch.optim.AdamW(lr=1e-3)' -> ('AdamW', {'lr': 1e-3}), checked: torch accepts the
    arguments and a chain takes its steps (else one line, TrainStepError)."""
    from flaxport.port.optimizers import chains

    dotted, call = read_call(text, "--optimizer")
    prefix, name = split_name(dotted, PREFIXES)
    if prefix == "?":
        raise TrainStepError(f"--optimizer {text!r}: name a torch.optim class ({', '.join(translated())})")
    key = name.lower()
    if key in chains.REFUSED:
        raise TrainStepError(f"--optimizer {text!r}: {name} is not translated: {chains.REFUSED[key]}")
    if name not in translated():
        raise TrainStepError(f"--optimizer {text!r}: {name} is not a torch.optim optimizer "
                             f"(translated: {', '.join(translated())})")
    kwargs = literal_kwargs(call, text, "--optimizer")
    import torch

    check_literals("--optimizer", text, kwargs, getattr(torch.optim, name))
    make_torch_optimizer(name, kwargs, [_dummy_parameter()])  # torch's own checks of the arguments
    try:
        chains.links(key, chains.hyper(key, kwargs))
    except chains.UnsupportedOptimizerError as e:
        raise TrainStepError(f"--optimizer {text!r}: {e}") from None
    return name, kwargs


def _dummy_parameter():
    import torch

    return torch.nn.Parameter(torch.zeros(2, 2))  # 2-D: Muon takes matrices only


def make_torch_optimizer(name: str, kwargs: dict, params):
    import torch

    try:
        return getattr(torch.optim, name)(params, **kwargs)
    except Exception as e:  # noqa: BLE001 - torch's checks of the arguments (TypeError, ValueError, IndexError)
        raise TrainStepError(f"--optimizer torch.optim.{name}: {first_line(e)}") from None


@dataclasses.dataclass
class OptimizerSpec:
    """A torch optimizer as train_step.py writes it: its class, each param group's arguments that
    differ from torch's defaults (group 0 first) and, with several groups, each one's parameters
    by torch name."""

    name: str
    groups: list
    members: list | None = None

    @property
    def text(self) -> str:
        more = f" with {len(self.groups)} param groups" if len(self.groups) > 1 else ""
        return optimizer_text(self.name, self.groups[0]) + more

    def make(self, module):
        """The torch optimizer over `module`'s parameters, grouped as this spec groups them."""
        if self.members is None:
            return make_torch_optimizer(self.name, self.groups[0], module.parameters())
        params = dict(module.named_parameters())
        groups = [{"params": [params[n] for n in names], **kwargs}
                  for names, kwargs in zip(self.members, self.groups)]
        return make_torch_optimizer(self.name, {}, groups)


def optimizer_spec(optimizer, module=None) -> OptimizerSpec:
    """A torch optimizer over `module`'s parameters (several param groups allowed), or an
    --optimizer text / (name, kwargs) -> OptimizerSpec."""
    name, kwargs = as_optimizer(optimizer)
    if isinstance(optimizer, (str, tuple)) or len(optimizer.param_groups) == 1:
        return OptimizerSpec(name, [kwargs])
    if module is None:
        raise TrainStepError(f"{name} has {len(optimizer.param_groups)} param groups: pass the module they belong to")
    from flaxport.port.optimizers import chains

    names = {id(p): n for n, p in module.named_parameters()}
    members, groups = [], []
    defaults = chains.TORCH_DEFAULTS[name.lower()]
    for i, group in enumerate(optimizer.param_groups):
        unknown = [p for p in group["params"] if id(p) not in names]
        if unknown:
            raise TrainStepError(f"{name} param group {i} holds a tensor that is not a parameter of the module")
        members.append([names[id(p)] for p in group["params"]])
        hyper = {k: _plain(group.get("initial_lr", v) if k == "lr" else v) for k, v in group.items() if k in defaults}
        groups.append({k: v for k, v in hyper.items() if v != defaults[k]
                       and not (name == "AdamW" and k == "decoupled_weight_decay")})
    return OptimizerSpec(name, groups, members)


def as_optimizer(optimizer) -> tuple[str, dict]:
    """A torch optimizer object, a (class name, kwargs) pair or an --optimizer text -> (name, kwargs):
    the hyperparameters of its first param group that differ from torch's defaults."""
    from flaxport.port.optimizers import chains

    if isinstance(optimizer, str):
        return parse_optimizer(optimizer)
    if isinstance(optimizer, tuple):
        return optimizer
    name = type(optimizer).__name__
    key = name.lower()
    if key in chains.REFUSED:
        raise TrainStepError(f"torch.optim.{name} is not translated: {chains.REFUSED[key]}")
    if name not in translated():
        raise TrainStepError(f"{name} is not a torch.optim optimizer (translated: {', '.join(translated())})")
    group = {k: v for k, v in optimizer.param_groups[0].items() if k not in chains.IGNORED}
    defaults = chains.TORCH_DEFAULTS[key]
    kwargs = {k: _plain(v) for k, v in group.items() if k in defaults and _plain(v) != defaults[k]}
    kwargs.pop("decoupled_weight_decay", None) if name == "AdamW" else None
    return name, kwargs


def _plain(v):
    """A group value as a literal (a 0-d tensor learning rate as a float)."""
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, (list, tuple)):
        return tuple(_plain(e) for e in v)
    return v


def optimizer_text(name: str, kwargs: dict) -> str:
    return f"torch.optim.{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def chain_code(chain, indent: str = "    ") -> str:
    """optax.chain(...) of a chains.links list, one commented transformation a line."""
    lines = ["optax.chain("]
    for link in chain:
        if link.why:
            lines.append(f"{indent}# {link.why}")
        lines.append(f"{indent}{link.code},")
    return "\n".join(lines) + "\n)"


def transform_sources(names) -> list:
    """The source of transforms.py's functions `names` and of everything of that module they use
    (their state classes, rate_at), each once, what is used before its user."""
    from flaxport.port.optimizers import transforms

    module_names = {n for n, v in vars(transforms).items() if (inspect.isfunction(v) or inspect.isclass(v))
                    and getattr(v, "__module__", "") == transforms.__name__}
    order: list = []

    def visit(name):
        if name in order:
            return
        source = inspect.getsource(getattr(transforms, name))
        used = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)} & module_names - {name}
        for dep in sorted(used):
            visit(dep)
        order.append(name)

    for name in names:
        visit(name)
    return [inspect.getsource(getattr(transforms, n)) for n in order]


def make_optimizer_code(spec: OptimizerSpec, schedule=None, clip=(), paths=None) -> tuple[str, list]:
    """make_optimizer() for `spec` -> (its source, the sources it calls: transforms.py's, the
    schedule functions, PARAM_GROUPS). schedule: ScheduleLinks or None; clip: chains.Links that
    come first (torch's clipping); paths: {torch name: NNX path} (for several groups)."""
    from flaxport.port.optimizers import chains

    key = spec.name.lower()
    several = len(spec.groups) > 1
    lines, used = [], list(chains.custom(clip))
    group_chains = []
    for i, kwargs in enumerate(spec.groups):
        h = chains.hyper(key, kwargs)
        suffix = f"_{i}" if several else ""
        lr, momentum = chains.Expr(f"learning_rate{suffix}"), None
        if schedule is None:
            lines.append(f"{lr} = {float(h['lr'])!r}")
        else:
            lines.append(f"{lr} = every({schedule.lr[i].code}, scheduler_every)")
            if schedule.momentum:
                momentum = chains.Expr(f"momentum{suffix}")
                lines.append(f"{momentum} = every({schedule.momentum[i].code}, scheduler_every)")
        chain = chains.links(key, h, lr, momentum)
        used += chains.custom(chain)
        group_chains.append(chain)
    if several:
        lines.append("groups = {")
        for i, (chain, kwargs) in enumerate(zip(group_chains, spec.groups)):
            lines.append(f"    # param_groups[{i}]: {_args(kwargs) or 'the optimizer defaults'}")
            lines.append(f"    {i}: " + chain_code(chain).replace("\n", "\n    ") + ",")
        lines.append("}")
        labels = _Code("optax.multi_transform(groups, [PARAM_GROUPS[path] for path in param_paths])")
        lines.append("return " + (chain_code(list(clip) + [labels]) if clip else labels.code))
    else:
        lines.append("return " + chain_code(list(clip) + group_chains[0]))
    params = (["param_paths"] if several else []) + (["scheduler_every=1"] if schedule is not None else [])
    doc = [f"{spec.text} as optax: torch's steps, in torch's order."]
    if schedule is not None or several:
        doc.append("")
    if schedule is not None:
        doc.append("scheduler_every: optimizer steps per scheduler.step() (1: torch steps the scheduler every "
                   "batch; the batches of an epoch: once an epoch).")
    if several:
        doc.append("param_paths: each parameter's NNX path, in the order of the parameters the step updates.")
    import textwrap

    wrapped = [part for line in doc for part in (textwrap.wrap(line, 100) or [""])]
    doc_text = "\n    ".join(wrapped) + ("\n    " if len(wrapped) > 1 else "")
    code = [f"def make_optimizer({', '.join(params)}):", f'    """{doc_text}"""']
    code += ["    " + part for line in lines for part in line.split("\n")]
    extra = transform_sources(list(dict.fromkeys(used)))
    if schedule is not None:
        extra += schedule_sources(schedule)
    if several:
        extra.append(group_table(spec, paths))
    return "\n".join(code), extra


@dataclasses.dataclass
class _Code:
    """A chain entry that is code as it stands (not a call of a Link's function)."""

    code: str
    why: str = ""


def _args(kwargs) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def group_table(spec: OptimizerSpec, paths: dict) -> str:
    """PARAM_GROUPS: each parameter's torch param group by its NNX path, torch's name beside it."""
    rows = [f'    "{"/".join(map(str, paths[name]))}": {i},  # {name}'
            for i, names in enumerate(spec.members) for name in names]
    return ("# torch's param_groups: the group of each parameter, by its NNX path (torch's name after the #)\n"
            "PARAM_GROUPS = {\n" + "\n".join(rows) + "\n}")


def schedule_sources(found) -> list:
    """The source of the schedules.py functions `found` (ScheduleLinks) calls, `every` and the
    translated lambdas: what make_optimizer needs."""
    from flaxport.port import schedules
    from flaxport.port.optimizers import schedule_links

    names = schedule_links.functions(found.lr + (found.momentum or [])) + ["every"]
    helpers = ["as_steps"] + (["anneal"] if "one_cycle" in names else [])
    sources = [inspect.getsource(getattr(schedules, n)) for n in helpers + names]
    return sources + [t.source for t in found.lambdas.values()]
