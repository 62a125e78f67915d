"""Least-squares GAN on a 1-D two-mode Gaussian mixture (seed article 000)."""
from __future__ import annotations

from flaxport.data import mixture
from flaxport.errors import UserError
from flaxport.workloads.gan import config as config_lib
from flaxport.workloads.gan import convert, plots, quality, step
from flaxport.workloads.registry import Workload


def load_data(config, source=None, data_dir=None):
    if source not in (None, "mixture"):
        raise UserError(f"gan trains on the synthetic 'mixture' only, not {source!r}")
    return mixture.load(config.modes, config.mode_std, config.n_per_mode, config.data_seed)


def evaluate(config, state, data, key):
    return quality.evaluate_samples(config, step.sample(config, state, key, config.n_eval), data)


WORKLOAD = Workload(
    name="gan",
    summary="least-squares GAN, BatchNorm MLPs, 1-D two-mode mixture",
    get_config=config_lib.get_config,
    variants=config_lib.VARIANTS,
    data_sources=("mixture",),
    load_data=load_data,
    init_state=step.init_state,
    make_train_step=step.make_train_step,
    evaluate=evaluate,
    write_pictures=plots.write_pictures,
    torch_twin="flaxport.workloads.gan.step_torch",
    twin_parts=convert.twin_parts,
    part_names=("G", "D"),
    loss_keys=("g_loss", "d_loss"),
)
