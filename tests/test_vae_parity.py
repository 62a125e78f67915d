"""The Flax VAE step against its PyTorch twin: same weights, same batch, same noise."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport.workloads.vae import config as config_lib
from flaxport.workloads.vae import convert, quality, step

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

from flaxport.workloads.vae import step_torch  # noqa: E402

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def config():
    return config_lib.get_config("default")


def _batch(config, seed):
    rng = np.random.default_rng(seed)
    x = (rng.random((config.batch_size, config.image_size ** 2)) < 0.3).astype(np.float32)
    eps = rng.normal(size=(config.batch_size, config.latents)).astype(np.float32)
    return x, eps


def _flax_step(state, x, eps):
    (loss, parts), grads = jax.value_and_grad(
        lambda p: step.loss_fn(state.apply_fn, p, jnp.asarray(x), jnp.asarray(eps)), has_aux=True)(state.params)
    return float(loss), {k: float(v) for k, v in parts.items()}, grads, state.apply_gradients(grads=grads)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_three_steps_match_torch(config, dtype):
    """Loss, its two parts, every gradient and every parameter after Adam, 3 steps."""
    with jax.enable_x64(dtype == "float64"):
        ts = step_torch.init_state(config, 0)
        if dtype == "float64":
            ts.model.double()
        state = convert.state_from_torch(config, ts)
        for k in range(3):
            x, eps = _batch(config, k)
            x, eps = x.astype(dtype), eps.astype(dtype)
            loss, parts, grads, state = _flax_step(state, x, eps)
            loss_t, bce_t, kl_t = step_torch.step(ts, torch.from_numpy(x), torch.from_numpy(eps))
            # KL sums 1 + logvar - exp(logvar) - mean^2, terms that nearly cancel: compare absolutely.
            np.testing.assert_allclose([loss, parts["bce"], parts["kl"]], [loss_t.item(), bce_t.item(), kl_t.item()],
                                       rtol=1e-6, atol=1e-5)
            got = convert.flax_to_torch({"params": grads})
            for name, p in ts.model.named_parameters():
                np.testing.assert_allclose(got[name], p.grad.numpy(), err_msg=f"step {k + 1} grad {name}", **TOL)
            # Adam's first steps are lr * g / (|g| + eps): a gradient within ~1e-6 of zero
            # swings with its rounding (see test_cnn_parity); those few weights get 2 lr.
            now = convert.flax_to_torch(state.variables())
            for name, p in ts.model.named_parameters():
                g, want = p.grad.numpy(), p.detach().numpy()
                bound = np.where((np.abs(g) < 1e-6) & (g != 0) & (dtype == "float32"), 2 * config.lr,
                                 1e-5 + 1e-5 * np.abs(want))
                assert (np.abs(now[name] - want) <= bound).all(), f"step {k + 1} param {name}"


def test_log_weights_and_bounds_match_torch(config):
    ts = step_torch.init_state(config, 1)
    state = convert.state_from_torch(config, ts)
    rng = np.random.default_rng(5)
    x = (rng.random((7, config.image_size ** 2)) < 0.3).astype(np.float32)
    eps_k = rng.normal(size=(7, 4, config.latents)).astype(np.float32)
    lw = np.asarray(step.log_weights(state.apply_fn, state.params, jnp.asarray(x), jnp.asarray(eps_k)))
    lw_t = step_torch.log_weights(ts.model, torch.from_numpy(x), torch.from_numpy(eps_k)).numpy()
    np.testing.assert_allclose(lw, lw_t, rtol=1e-5, atol=1e-3)  # ~500-nat magnitudes: 2e-6 relative
    # The bound: k = 1 is the ELBO of that sample; more samples can only tighten it.
    assert quality.iwae_nats(lw[:, :1]) == pytest.approx(-lw[:, 0].mean())
    assert quality.iwae_nats(lw) <= quality.iwae_nats(lw[:, :1]) + 1e-9


def test_round_trip_and_strictness(config):
    ts = step_torch.init_state(config, 0)
    sd = ts.model.state_dict()
    back = convert.flax_to_torch(convert.torch_to_flax(config, sd))
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
    with pytest.raises(ValueError, match=r"missing key 'decoder\.fc2\.bias'"):
        convert.torch_to_flax(config, {k: v for k, v in sd.items() if k != "decoder.fc2.bias"})
    with pytest.raises(ValueError, match=r"shape mismatch for 'encoder\.fc2_mean\.weight'"):
        convert.torch_to_flax(config, dict(sd, **{"encoder.fc2_mean.weight": torch.zeros(32, 500)}))
    state = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    ported = convert.torch_to_flax(config, sd)
    assert jax.tree.map(lambda a: a.shape, state.params) == jax.tree.map(lambda a: a.shape, ported["params"])
