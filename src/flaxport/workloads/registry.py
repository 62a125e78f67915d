"""name -> Workload record. The CLI and the loops talk only to this record.

The table below is read without importing jax, so the CLI can set XLA flags first.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from flaxport.errors import UserError


@dataclasses.dataclass(frozen=True)
class Workload:
    """What a workload gives the harness.

    get_config(variant) -> config dataclass (variants: default, smoke, bench, ...)
    load_data(config, source, data_dir) -> flaxport.data.Dataset
    init_state(config, key) -> Flax state pytree
    make_train_step(config) -> train_step(state, batch, key) -> (state, {metric: scalar})
    evaluate(config, state, data, key) -> (quality {name: number|list}, artifacts {name: array})
    write_pictures(workdir, data, artifacts, label) -> [paths]
    train_flops(config) -> FLOPs of one train step (optional)
    torch_twin: module path of the PyTorch twin (imported only when used)
    twin_parts(config, torch_state=None) -> [workloads.twins.Part]: its models beside the twin's
      (convert.py), for `flaxport convert` / `parity`; part_names: their names without building
      them (more than one: prefixed flat keys); ema_name: the twin's key of an EMA copy, or None
    keras_twin: module path of the Keras 3 twin, where there is one
    checkpoint_metric: the quality key `compare` reports first
    """

    name: str
    summary: str
    get_config: Callable[[str], Any]
    variants: tuple
    data_sources: tuple
    load_data: Callable
    init_state: Callable
    make_train_step: Callable
    evaluate: Callable
    write_pictures: Callable
    torch_twin: str
    loss_keys: tuple = ("loss",)
    # train_flops(config) -> model FLOPs of one train step (2 x multiply-adds of the convs and
    # matmuls, forward and backward), for effective GFLOP/s in `compare`; None: not reported.
    train_flops: Callable | None = None
    keras_twin: str | None = None
    # configure(config, data) -> config: settings that come from the training data (DDIM's
    # normalisation statistics); train and compare apply it, so config.json records them.
    configure: Callable | None = None
    twin_parts: Callable | None = None
    part_names: tuple = ("model",)
    ema_name: str | None = None


# name: (package, one-line summary, prefers single-threaded XLA on CPU)
_TABLE = {
    "gan": ("flaxport.workloads.gan", "least-squares GAN, BatchNorm MLPs, 1-D two-mode mixture", True),
    "cnn": ("flaxport.workloads.cnn", "Conv-BN-ReLU-Pool x2 + Dense classifier, digits or CIFAR-10 at 32x32x3", False),
    "vae": ("flaxport.workloads.vae", "VAE, Dense 500 encoder/decoder, 20 latents, binarized 28x28 digits or MNIST", False),
    "ddim": ("flaxport.workloads.ddim", "DDIM: residual UNet, cosine schedule, EMA; digits 16x16 or Flowers 102 64x64", False),
}


def names() -> list[str]:
    return list(_TABLE)


def summary(name: str) -> str:
    return _TABLE[_check(name)][1]


def prefers_single_thread(name: str) -> bool:
    return _TABLE[_check(name)][2]


def get(name: str) -> Workload:
    return importlib.import_module(_TABLE[_check(name)][0]).WORKLOAD


def _check(name: str) -> str:
    if name not in _TABLE:
        raise UserError(f"unknown workload {name!r}; choose one of: {', '.join(_TABLE)}")
    return name
