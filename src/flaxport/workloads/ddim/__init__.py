"""DDIM on 16x16 digits or 64x64 Oxford Flowers (keras-io example, seed article 002)."""
from __future__ import annotations

import dataclasses

import numpy as np

from flaxport.errors import UserError
from flaxport.workloads.ddim import config as config_lib
from flaxport.workloads.ddim import convert, model, plots, quality, step
from flaxport.workloads.registry import Workload

SOURCES = ("digits", "flowers102")


def load_data(config, source=None, data_dir=None):
    """train/test {'image': uint8 (N, s, s, 3)}, s = config.image_size (labels dropped)."""
    source = source or config.data
    levels = len(config.widths) - 1
    if config.channels != 3:
        raise UserError(f"ddim: both sources are RGB; channels must be 3, got {config.channels}")
    if config.image_size % (1 << levels):
        raise UserError(f"ddim: image_size {config.image_size} must be divisible by {1 << levels} "
                        f"(the UNet halves it {levels} times for widths {config.widths})")
    if source == "digits":
        from flaxport.data import digits

        data = digits.load(size=config.image_size, channels=3)
    elif source == "flowers102":
        from flaxport.data import flowers102

        data = flowers102.load(data_dir, config.image_size)
    else:
        raise UserError(f"ddim trains on {' or '.join(SOURCES)}, not {source!r}")
    # Only images: a label column would be batched and shipped to the device for nothing.
    # keras's dataset_repetitions: an epoch passes over every training image that many
    # times (the copies shuffled together), so the per-epoch evaluation comes less often.
    train = data.train["image"]
    data.train = {"image": np.tile(train, (config.dataset_repetitions, 1, 1, 1))}
    data.test = {"image": data.test["image"]}
    data.meta = {**data.meta, "n_unique_train": len(train), "dataset_repetitions": config.dataset_repetitions}
    return data


def configure(config, data):
    """config with the training images' per-channel mean/std (keras's Normalization.adapt),
    unless both were given (--set norm_mean=... norm_std=...)."""
    if len(config.norm_mean) == config.channels and len(config.norm_std) == config.channels:
        return config
    return dataclasses.replace(config, **step.data_stats(data.train["image"]))


def evaluate(config, state, data, key):
    """(quality.py's quality, {'samples', 'diffusion', 'about'}) of the EMA network (or the
    trained one: config.sample_weights); deterministic (fixed NumPy draws, shared with the
    torch twin), so `key` is unused."""
    del key
    ema = config.sample_weights == "ema"
    variables = state.ema_variables() if ema else state.variables()
    chunk = config.batch_size

    def sampler(steps):  # x -> (images, path); one compiled program where KID and pictures share the steps
        f = step.compiled_sampler(config, variables, steps, chunk, keep_path=True)
        return quality.path_sampler(lambda x: f(variables, x))

    samples, _ = quality.in_chunks(sampler(config.kid_diffusion_steps), [quality.kid_noise(config)], chunk)
    test = data.test["image"]
    noise, times = quality.val_draws(config, len(test))
    val, val_image = quality.in_chunks(lambda *a: step.val_losses(config, variables, *a), [test, noise, times], chunk)
    draw = sampler(config.plot_diffusion_steps)  # compiled here, off the clock
    (pictures, path), seconds = quality.timed(quality.in_chunks, draw, [quality.picture_noise(config)], chunk)
    about = {"framework": "jax", "steps": config.plot_diffusion_steps, "weights": "EMA" if ema else "online"}
    scores = quality.sample_scores(config, samples, data)
    return quality.summarize(scores, val, val_image, seconds, pictures, path, about)


WORKLOAD = Workload(
    name="ddim",
    summary="DDIM: residual UNet, cosine schedule, EMA; digits 16x16 or Flowers 102 64x64",
    get_config=config_lib.get_config,
    variants=config_lib.VARIANTS,
    data_sources=SOURCES,
    load_data=load_data,
    init_state=step.init_state,
    make_train_step=step.make_train_step,
    evaluate=evaluate,
    write_pictures=plots.write_pictures,
    torch_twin="flaxport.workloads.ddim.step_torch",
    twin_parts=convert.twin_parts,
    ema_name="ema_model",
    loss_keys=("loss", "image_loss"),
    train_flops=model.train_flops,
    configure=configure,
)
