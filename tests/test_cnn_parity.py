"""The Flax CNN step against its PyTorch twin, from the same weights and the same batch."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport.workloads.cnn import config as config_lib
from flaxport.workloads.cnn import convert, step

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

from flaxport.workloads.cnn import step_torch  # noqa: E402  (imports torch)

TOL = dict(rtol=1e-5, atol=1e-5)
SEED = 0
SHADOWED = {"conv1.bias", "conv2.bias"}  # feed a train-mode BatchNorm: gradient 0 analytically


def _batch(config, seed=0, n=None):
    rng = np.random.default_rng(seed)
    n = n or config.batch_size
    images = rng.integers(0, 256, size=(n, config.image_size, config.image_size, config.channels), dtype=np.uint8)
    return {"image": images, "label": rng.integers(0, config.num_classes, size=n).astype(np.int32)}


def _grads_and_step(config, state, batch):
    """Flax gradients (torch keys) and the state after train_step on `batch`."""
    images = step.to_float(jnp.asarray(batch["image"]))
    (loss, _), grads = jax.value_and_grad(lambda p: step.loss_and_stats(state, p, images, batch["label"]),
                                          has_aux=True)(state.params)
    new_state, metrics = jax.jit(step.make_train_step(config))(state, batch, jax.random.key(0))
    np.testing.assert_allclose(float(metrics["loss"]), float(loss), rtol=1e-6)
    return float(loss), convert.flax_to_torch(config, {"params": grads}), new_state


def _torch_step(ts, batch, dtype=torch.float32):
    x = step_torch.to_input(ts, torch.from_numpy(batch["image"])).to(dtype)
    loss, _ = step_torch.step(ts, x, torch.from_numpy(batch["label"]).long())
    grads = {k: p.grad.detach().contiguous().numpy().copy() for k, p in ts.model.named_parameters()}
    return loss.item(), grads


def _eval_logp_torch(ts, images, dtype=torch.float32):
    ts.model.eval()
    try:
        with torch.no_grad():
            return ts.model(step_torch.to_input(ts, torch.from_numpy(images)).to(dtype)).numpy()
    finally:
        ts.model.train()


def _assert_sd(flax_sd, torch_sd, what, skip=()):
    assert sorted(flax_sd) == sorted(torch_sd), what
    for k in torch_sd:
        if k not in skip:
            np.testing.assert_allclose(flax_sd[k], torch_sd[k], err_msg=f"{what}: {k}", **TOL)


def _sd(ts):
    return {k: v.detach().contiguous().numpy().copy() for k, v in ts.model.state_dict().items()}


@pytest.fixture(scope="module")
def config():
    return config_lib.get_config("default")


@pytest.mark.parametrize("conv_impl,channels_last", [("native", False), ("im2col", False), ("xla", False), ("im2col", True)])
def test_one_step_float32(config, conv_impl, channels_last):
    """Loss, every gradient, BatchNorm statistics, parameters after Adam, eval logits.

    channels_last is how torch-tuned runs (oneDNN's NHWC kernels): the same function."""
    config = dataclasses.replace(config, conv_impl=conv_impl)
    ts = step_torch.init_state(config, SEED, channels_last=channels_last)
    state = convert.state_from_torch(config, ts)
    test_images = _batch(config, seed=5, n=16)["image"]
    flax_logp = state.apply_eval(step.to_float(jnp.asarray(test_images)))
    np.testing.assert_allclose(np.asarray(flax_logp), _eval_logp_torch(ts, test_images), **TOL)

    batch = _batch(config)
    loss, grads, state = _grads_and_step(config, state, batch)
    loss_t, grads_t = _torch_step(ts, batch)
    assert loss == pytest.approx(loss_t, rel=1e-6)
    _assert_sd(grads, grads_t, "grads")
    for k in SHADOWED:  # noise around an exact 0 on both sides
        assert np.abs(grads[k]).max() < 1e-6 and np.abs(grads_t[k]).max() < 1e-6, k
    # Adam turns that noise into steps of up to lr, different in each framework (see the
    # GAN parity test); nothing else in train mode depends on these biases, and the float64
    # test below shows they agree once the noise is far below Adam's eps.
    # Adam's first step is lr * g / (|g| + eps): where |g| is near eps = 1e-8 the update
    # swings with the gradient's last bits (d update / d g = lr / 4eps = 25000 at |g| = eps),
    # so those few weights are allowed up to 2 lr as well.
    after = convert.flax_to_torch(config, state.variables(), num_batches_tracked=1)
    _assert_sd(after, _sd(ts), "after one step", skip=set(grads_t) | {"bn1.running_mean", "bn2.running_mean"})
    for k, g in grads_t.items():
        tiny = (np.abs(g) < 1e-6) & (g != 0)  # exact zeros (dead ReLUs) move by exactly 0 on both sides
        assert tiny.mean() < 1e-2 or k in SHADOWED, (k, tiny.mean())
        want = _sd(ts)[k]
        bound = np.where(tiny, 2 * config.lr, 1e-5 + 1e-5 * np.abs(want))
        worst = np.abs(after[k] - want) - bound
        assert worst.max() <= 0, f"after one step: {k} off by {worst.max():.3g} beyond the bound"
    # The running means see those biases too (momentum 0.1 of the batch mean).
    for k in ("bn1.running_mean", "bn2.running_mean"):
        np.testing.assert_allclose(after[k], _sd(ts)[k], rtol=0, atol=1e-5)


def test_two_steps_float64(config):
    """Everything, the shadowed biases and eval logits after training included, to 1e-5."""
    with jax.enable_x64(True):
        ts = step_torch.init_state(config, SEED)
        ts.model.double()
        state = convert.state_from_torch(config, ts)
        assert state.params["conv1"]["kernel"].dtype == jnp.float64
        for k in range(2):
            batch = _batch(config, seed=k)
            loss, grads, state = _grads_and_step(config, state, batch)
            loss_t, grads_t = _torch_step(ts, batch, torch.float64)
            assert loss == pytest.approx(loss_t, rel=1e-9)
            _assert_sd(grads, grads_t, f"step {k + 1} grads")
            _assert_sd(convert.flax_to_torch(config, state.variables(), k + 1), _sd(ts), f"after step {k + 1}")
        images = _batch(config, seed=9, n=8)["image"]
        flax_logp = np.asarray(state.apply_eval(step.to_float(jnp.asarray(images)).astype(jnp.float64)))
        np.testing.assert_allclose(flax_logp, _eval_logp_torch(ts, images, torch.float64), **TOL)


def test_fc1_rows_are_permuted_not_transposed(config):
    """Copying fc1.weight.T as is (the naive port) runs, and computes something else."""
    ts = step_torch.init_state(config, SEED)
    state = convert.state_from_torch(config, ts)
    naive = state.params.copy()
    naive["fc1"] = {**naive["fc1"], "kernel": jnp.asarray(ts.model.fc1.weight.detach().numpy().T)}
    images = _batch(config, seed=3, n=16)["image"]
    x = step.to_float(jnp.asarray(images))
    want = _eval_logp_torch(ts, images)
    np.testing.assert_allclose(np.asarray(state.apply_eval(x)), want, **TOL)
    assert np.abs(np.asarray(state.apply_eval(x, params=naive)) - want).max() > 1e-2


def test_round_trip_and_strictness(config):
    ts = step_torch.init_state(config, SEED)
    sd = ts.model.state_dict()
    back = convert.flax_to_torch(config, convert.torch_to_flax(config, sd), num_batches_tracked=0)
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
    ts.model.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)

    with pytest.raises(ValueError, match=r"missing key 'bn2\.running_var'"):
        convert.torch_to_flax(config, {k: v for k, v in sd.items() if k != "bn2.running_var"})
    with pytest.raises(ValueError, match=r"shape mismatch for 'fc1\.weight'"):
        convert.torch_to_flax(config, dict(sd, **{"fc1.weight": torch.zeros(256, 2304)}))  # a padding=0 model
    with pytest.raises(ValueError, match=r"unexpected key 'fc3\.weight'"):
        convert.torch_to_flax(config, dict(sd, **{"fc3.weight": torch.zeros(1)}))


def test_init_state_tree_matches_torch(config):
    state = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    ported = convert.torch_to_flax(config, step_torch.init_state(config, SEED).model.state_dict())
    fresh = {"params": state.params, "batch_stats": state.batch_stats}
    assert jax.tree.map(lambda a: (a.shape, a.dtype), fresh) == jax.tree.map(lambda a: (a.shape, a.dtype), ported)
