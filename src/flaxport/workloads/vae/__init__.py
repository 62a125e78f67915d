"""Variational autoencoder on binarized 28x28 images (seed article 003): digits or binarized MNIST."""
from __future__ import annotations

from flaxport.errors import UserError
from flaxport.workloads.vae import config as config_lib
from flaxport.workloads.vae import convert, model, plots, quality, step
from flaxport.workloads.registry import Workload

SOURCES = ("digits", "binarized_mnist")


def load_data(config, source=None, data_dir=None):
    """images uint8 (N, 28, 28, 1) in {0, 1}; no labels needed."""
    source = source or config.data
    if source == "digits":
        from flaxport.data import digits

        data = digits.binarized(size=config.image_size)
    elif source == "binarized_mnist":
        from flaxport.data import binarized_mnist

        data = binarized_mnist.load(data_dir)
    else:
        raise UserError(f"vae trains on {' or '.join(SOURCES)}, not {source!r}")
    shape = (config.image_size, config.image_size, 1)
    if data.train["image"].shape[1:] != shape:
        raise UserError(f"{data.name} images are {data.train['image'].shape[1:]}, the vae config expects {shape}")
    # Only images: a label column would be batched and shipped to the device for nothing.
    data.train = {"image": data.train["image"]}
    return data


def evaluate(config, state, data, key):
    import jax

    k_bounds, k_pics = jax.random.split(key)
    nelbo, log_w = step.evaluate_bounds(config, state, data.test["image"], k_bounds)
    return quality.summarize(config, nelbo, log_w, step.pictures(config, state, data.test["image"], k_pics))


WORKLOAD = Workload(
    name="vae",
    summary="VAE, Dense 500 encoder/decoder, 20 latents, binarized 28x28 digits or MNIST",
    get_config=config_lib.get_config,
    variants=config_lib.VARIANTS,
    data_sources=SOURCES,
    load_data=load_data,
    init_state=step.init_state,
    make_train_step=step.make_train_step,
    evaluate=evaluate,
    write_pictures=plots.write_pictures,
    torch_twin="flaxport.workloads.vae.step_torch",
    twin_parts=convert.twin_parts,
    keras_twin="flaxport.workloads.vae.step_keras",
    loss_keys=("loss",),
    train_flops=model.train_flops,
)
