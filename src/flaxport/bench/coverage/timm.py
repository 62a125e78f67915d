"""timm's model families for the coverage benchmark: the smallest model of each, at the smallest input it accepts.

A family is a timm module (`timm.list_modules()`: resnet, efficientnet, vision_transformer,
...). Its smallest model is the one with the fewest parameters, counted on the meta device
(nothing allocated, nothing downloaded); it is built with `pretrained=False` and fed a batch
of 2 images at the smallest side, of 32, 48, 64, 96, 128, 160, 192, 224, 256 and the model's
own, that it runs on in eval mode (a model with a fixed input size is built for that side,
`img_size=`, where it takes one).
"""
from __future__ import annotations

from flaxport.bench.coverage.runner import select
from flaxport.errors import first_line

BATCH = 2
SIDES = (32, 48, 64, 96, 128, 160, 192, 224, 256)


def names(filter: str | None = None) -> list[str]:
    """timm's model families (its modules with registered models), sorted; those `filter` selects."""
    from flaxport.bench.zoos import import_timm

    timm = import_timm()
    return select(sorted(timm.list_modules()), filter)


def build(name: str) -> list[tuple]:
    """[(model in eval mode, (images,), {})]: family `name`'s smallest model at its smallest input."""
    import torch

    from flaxport.bench.zoos import import_timm

    timm = import_timm()
    model_name = smallest(name)
    default = timm.get_pretrained_cfg_value(model_name, "input_size") or (3, 224, 224)
    fixed = bool(timm.get_pretrained_cfg_value(model_name, "fixed_input_size"))
    failures, model = [], None
    for side in dict.fromkeys([*SIDES, default[-1]]):
        torch.manual_seed(0)
        try:
            if model is None or fixed:  # a model with a fixed input size is built again for the next side
                model = _create(timm, model_name, side if fixed and side != default[-1] else None).eval()
            x = torch.randn(BATCH, default[0], side, side, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                model(x)
        except Exception as e:  # noqa: BLE001 - a larger side may fit
            failures.append(f"{side}: {type(e).__name__}: {first_line(e, 160)}")
            continue
        return [(model, (x,), {})]
    raise RuntimeError(f"{model_name} ran on none of the sides tried (the smallest: {failures[0]})")


def smallest(family: str) -> str:
    """The model of `family` with the fewest parameters (ties: the first by name)."""
    import torch

    from flaxport.bench.zoos import import_timm

    timm = import_timm()
    counts = {}
    for model_name in sorted(timm.list_models(module=family)):
        try:
            with torch.device("meta"):
                model = timm.create_model(model_name, pretrained=False)
        except Exception:  # noqa: BLE001 - a model that cannot be built on the meta device is not ranked
            continue
        counts[model_name] = sum(p.numel() for p in model.parameters())
    if not counts:
        raise RuntimeError(f"no model of the timm family {family!r} could be built")
    return min(counts, key=lambda n: (counts[n], n))


def _create(timm, model_name: str, side: int | None):
    """The model with random weights, built for images of `side` where it has a fixed input size."""
    if side is not None:
        try:
            return timm.create_model(model_name, pretrained=False, img_size=side)
        except TypeError:  # takes no img_size: only its own size can run
            pass
    return timm.create_model(model_name, pretrained=False)
