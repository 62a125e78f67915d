"""torchvision's classification, segmentation, video and optical-flow models for the coverage benchmark (weights=None).

Every model `torchvision.models.list_models` lists in those four groups, built with
`weights=None` (and `weights_backbone=None`: nothing is downloaded), fed a batch of 2 at the
smallest size, of a short list per group, that it runs on in eval and in train mode: images of 32 to 299
pixels (a model with a fixed image size, such as ViT or MaxViT, is built for that size), clips
of 4 to 16 frames, and for optical flow two images of 64 to 256 pixels with 2 flow updates
instead of 12 (each update is the same code again).
"""
from __future__ import annotations

import inspect

from flaxport.bench.coverage.runner import select
from flaxport.errors import first_line

BATCH = 2
GROUPS = ("classification", "segmentation", "video", "optical_flow")
SIDES = (32, 64, 96, 112, 128, 160, 224, 299)  # 112: ViT-H/14's patches; 299: Inception v3 in train mode
FRAMES = (4, 8, 16)
FLOW_SIDES = (64, 128, 256)
FLOW_UPDATES = 2


def names(filter: str | None = None) -> list[str]:
    """Every model of the four groups, group by group, sorted within each; those `filter` selects."""
    return select([n for group in GROUPS for n in _listed(group)], filter)


def build(name: str) -> list[tuple]:
    """[(model in eval mode, args, kwargs)]: model `name` (weights=None) at its smallest input
    (one its forward runs on in eval and in train mode)."""
    import torch

    group = next(g for g in GROUPS if name in _listed(g))
    failures, model, sized = [], None, False
    for size, args, kwargs in _candidates(group):
        torch.manual_seed(0)
        try:
            if model is None or sized:  # a model built for one image size is built again for the next
                model, sized = _create(name, size if group == "classification" else None)
            model.eval()
            with torch.no_grad():  # both modes: the benchmark runs the train-mode forward too (Inception's
                model(*args, **kwargs)  # auxiliary head, on only in train mode, needs 75 pixels more)
                model.train()(*args, **kwargs)
            model.eval()
        except Exception as e:  # noqa: BLE001 - a larger input may fit
            failures.append(f"{size}: {type(e).__name__}: {first_line(e, 160)}")
            continue
        return [(model, args, kwargs)]
    raise RuntimeError(f"{name} ran on none of the inputs tried (the smallest: {failures[0]})")


def _listed(group: str) -> list[str]:
    from flaxport.bench.zoos import import_torchvision

    models = import_torchvision().models
    module = models if group == "classification" else getattr(models, group)
    return sorted(models.list_models(module=module))


def _candidates(group: str):
    """(size, args, kwargs) of the group's inputs, smallest first."""
    import torch

    g = torch.Generator().manual_seed(1)
    if group == "video":
        for side in (32, 64, 96, 112, 224):
            for frames in FRAMES:
                yield f"{frames}x{side}x{side}", (torch.randn(BATCH, 3, frames, side, side, generator=g),), {}
    elif group == "optical_flow":
        for side in FLOW_SIDES:
            images = [torch.randn(BATCH, 3, side, side, generator=g) for _ in range(2)]
            yield side, tuple(images), {"num_flow_updates": FLOW_UPDATES}
    else:
        for side in SIDES:
            yield side, (torch.randn(BATCH, 3, side, side, generator=g),), {}


def _create(name: str, side) -> tuple:
    """(the model with random weights (its backbone's too), built for images of `side` where it takes
    an image_size (ViT) or input_size (MaxViT): whether it was)."""
    from flaxport.bench.zoos import import_torchvision

    models = import_torchvision().models
    builder = models.get_model_builder(name)
    kwargs = {"weights": None}
    if "weights_backbone" in inspect.signature(builder).parameters:
        kwargs["weights_backbone"] = None
    for size in ({"image_size": side}, {"input_size": (side, side)}) if side is not None else ():
        try:
            return builder(**kwargs, **size), True
        except TypeError:  # takes no such size
            pass
    return builder(**kwargs), False
