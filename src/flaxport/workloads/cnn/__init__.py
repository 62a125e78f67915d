"""CNN classifier on 32x32x3 images (seed article 001): digits (embedded) or CIFAR-10."""
from __future__ import annotations

from flaxport.errors import UserError
from flaxport.workloads.cnn import config as config_lib
from flaxport.workloads.cnn import convert, model, plots, quality, step
from flaxport.workloads.registry import Workload

SOURCES = ("digits", "cifar10")


def load_data(config, source=None, data_dir=None):
    """The config's dataset (or `source`): images uint8 NHWC (N, 32, 32, 3), labels int32."""
    source = source or config.data
    if source == "digits":
        from flaxport.data import digits

        data = digits.load(size=config.image_size, channels=config.channels)
    elif source == "cifar10":
        from flaxport.data import cifar10

        data = cifar10.load(data_dir)
    else:
        raise UserError(f"cnn trains on {' or '.join(SOURCES)}, not {source!r}")
    shape = (config.image_size, config.image_size, config.channels)
    if data.train["image"].shape[1:] != shape:
        raise UserError(f"{data.name} images are {data.train['image'].shape[1:]}, the cnn config expects {shape}")
    return data


def evaluate(config, state, data, key):
    del key  # deterministic
    val_loss, accuracy, preds = step.predict(config, state, data.test["image"], data.test["label"])
    return quality.summarize(config, val_loss, accuracy, data.test["label"], preds)


WORKLOAD = Workload(
    name="cnn",
    summary="Conv-BN-ReLU-Pool x2 + Dense classifier, digits or CIFAR-10 at 32x32x3",
    get_config=config_lib.get_config,
    variants=config_lib.VARIANTS,
    data_sources=SOURCES,
    load_data=load_data,
    init_state=step.init_state,
    make_train_step=step.make_train_step,
    evaluate=evaluate,
    write_pictures=plots.write_pictures,
    torch_twin="flaxport.workloads.cnn.step_torch",
    twin_parts=convert.twin_parts,
    loss_keys=("loss",),
    train_flops=model.train_flops,
)
