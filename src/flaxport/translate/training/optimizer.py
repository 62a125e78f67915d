"""The torch optimizer of train_step.py: read from --optimizer or a torch object, and written out
as make_optimizer(), the optax chain port/optimizers/chains.py builds for check_step."""
from __future__ import annotations

import ast
import inspect

from flaxport.translate.training.texts import TrainStepError, literal_kwargs, read_call, split_name

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
    except (TypeError, ValueError) as e:
        raise TrainStepError(f"--optimizer torch.optim.{name}: {str(e).splitlines()[0]}") from None


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
