"""The Flax GAN step against its PyTorch twin, from the same weights and the same inputs."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport.workloads.gan import config as config_lib
from flaxport.workloads.gan import convert, step

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

from flaxport.workloads.gan import step_torch  # noqa: E402  (imports torch)

TOL = dict(rtol=1e-5, atol=1e-5)
SEED = 0

g_step = jax.jit(step.g_step)
d_step = jax.jit(step.d_step)  # target traced: one compile for real and fake
generate = jax.jit(step.generate)


def _np(sd):
    return {k: v.detach().numpy().copy() for k, v in sd.items()}


def _assert_tree(flax_sd, torch_sd, what):
    assert sorted(flax_sd) == sorted(torch_sd), what
    for k in torch_sd:
        np.testing.assert_allclose(flax_sd[k], torch_sd[k], err_msg=f"{what}: {k}", **TOL)


def _assert_models(state, ts, what):
    """Parameters and BatchNorm running statistics of G and D."""
    sds = convert.torch_state_dicts(state)
    _assert_tree(sds["G"], _np(ts.G.state_dict()), f"{what} G")
    _assert_tree(sds["D"], _np(ts.D.state_dict()), f"{what} D")


def _assert_generate(state, ts, z):
    """Eval-mode samples: step.generate vs torch G.eval()(z)[:, 0]."""
    ts.G.eval()
    try:
        with torch.no_grad():
            want = ts.G(torch.from_numpy(z))[:, 0].numpy()
    finally:
        ts.G.train()
    np.testing.assert_allclose(np.asarray(generate(state, jnp.asarray(z))), want, **TOL)


def _full_step(state, ts, real, z):
    """One train step (g_step; d_step real->1, fake->0) on both sides; returns what was seen."""
    state, g_loss, fake, g_grads = g_step(state, jnp.asarray(z))
    state, d_loss_real, d_grads_real = d_step(state, jnp.asarray(real), 1.0)
    state, d_loss_fake, d_grads_fake = d_step(state, jax.lax.stop_gradient(fake), 0.0)
    flax = dict(losses=[g_loss, d_loss_real, d_loss_fake], fake=fake,
                g_grads=convert.flax_to_torch({"params": g_grads}),
                d_grads=[convert.flax_to_torch({"params": g}) for g in (d_grads_real, d_grads_fake)])

    losses = []  # step_torch.criterion is an nn.Module: record each loss as it is computed
    hook = step_torch.criterion.register_forward_hook(lambda m, i, o: losses.append(o.item()))
    try:
        g_loss_t, fake_t = step_torch.g_step(ts, torch.from_numpy(z))
        g_grads_t = {k: p.grad.numpy().copy() for k, p in ts.G.named_parameters()}
        d_grads_t = []
        d_loss_t = step_torch.d_step(ts, torch.from_numpy(real), fake_t, grads_out=d_grads_t)
    finally:
        hook.remove()
    assert losses[0] == pytest.approx(g_loss_t.item()) and len(losses) == 3
    assert (losses[1] + losses[2]) / 2 == pytest.approx(d_loss_t.item())
    torch_side = dict(losses=losses, fake=fake_t.detach().numpy(), g_grads=g_grads_t,
                      d_grads=[{k: v.numpy() for k, v in g.items()} for g in d_grads_t])
    return state, flax, torch_side


def _batch(rng, config, dtype=np.float32):
    real = rng.choice(np.asarray(config.modes), size=(config.batch_size, 1)) + config.mode_std * rng.normal(
        size=(config.batch_size, 1))
    z = rng.normal(size=(config.batch_size, config.z_dim))
    return real.astype(dtype), z.astype(dtype)


@pytest.fixture(scope="module")
def config():
    return config_lib.get_config("default")


def _bn_shadowed(config):
    """torch keys whose value float32 rounding noise, amplified by Adam, moves (see below).

    A Linear bias feeding a train-mode BatchNorm cancels out of the output: its gradient
    is 0 analytically, and rounding noise (~1e-9) in each framework. Adam normalises the
    gradient by sqrt(v) + eps with eps = 1e-8, so it turns that noise into steps of up to
    lr, different in each framework. G's last bias is shadowed the same way by D's first
    BatchNorm. The running means after those biases track them. Nothing else depends on
    them in train mode, so losses, gradients and every other tensor still agree to 1e-5;
    the float64 test below shows these agree too once the noise is far below eps.
    """
    g = {f"net.{3 * i}.bias" for i in range(len(config.g_widths))}
    g |= {f"net.{3 * i + 1}.running_mean" for i in range(len(config.g_widths))}
    g.add(f"net.{3 * len(config.g_widths)}.bias")
    d = {f"net.{3 * i}.bias" for i in range(len(config.d_widths))}
    d |= {f"net.{3 * i + 1}.running_mean" for i in range(len(config.d_widths))}
    return {"G": g, "D": d}


def test_four_steps_float32(config):
    """The default config as it trains. One full step, then 3 more, everything compared."""
    assert config.z_dim == 512 and config.batch_size == 10 and config.d_batchnorm
    ts = step_torch.init_state(config, SEED)
    state = convert.state_from_torch(config, ts)
    _assert_models(state, ts, "ported")
    _assert_generate(state, ts, np.random.default_rng(3).normal(size=(32, config.z_dim)).astype(np.float32))
    shadowed = _bn_shadowed(config)
    rng = np.random.default_rng(0)

    for k in range(1, 5):
        real, z = _batch(rng, config)
        state, fx, pt = _full_step(state, ts, real, z)
        np.testing.assert_allclose([float(l) for l in fx["losses"]], pt["losses"], **TOL)
        # From step 2 on, fake carries G's (shadowed) last bias: an offset common to the
        # batch, which D's first BatchNorm removes. Compare it centred, the offset below.
        fake = np.asarray(fx["fake"])
        np.testing.assert_allclose(fake - fake.mean(), pt["fake"] - pt["fake"].mean(), **TOL)
        np.testing.assert_allclose(fake.mean(), pt["fake"].mean(), rtol=0, atol=1e-5 + 2 * (k - 1) * config.g_lr)
        _assert_tree(fx["g_grads"], pt["g_grads"], f"step {k} G grads")
        _assert_tree(fx["d_grads"][0], pt["d_grads"][0], f"step {k} D grads (real step)")
        _assert_tree(fx["d_grads"][1], pt["d_grads"][1], f"step {k} D grads (fake step)")
        # The shadowed biases' gradients are noise around an exact 0, on both sides.
        for grads, keys in ((fx["g_grads"], shadowed["G"]), (pt["g_grads"], shadowed["G"]),
                            *((g, shadowed["D"]) for g in fx["d_grads"] + pt["d_grads"])):
            for key in keys & grads.keys():
                assert np.abs(grads[key]).max() < 1e-6, key

        # Adam moves a parameter by at most ~lr per update (|m_hat| / sqrt(v_hat) <= ~1), so
        # two noise-driven walks part by at most 2 lr per update: k G updates, 2k D updates.
        # D's first running mean also sees G's last bias through D's first Linear (|w| <= 1).
        shadow_tol = 2 * (k * config.g_lr + 2 * k * config.d_lr)
        sds = convert.torch_state_dicts(state)
        for m, module in (("G", ts.G), ("D", ts.D)):
            want = _np(module.state_dict())
            assert sorted(sds[m]) == sorted(want)
            for key, value in want.items():
                tol = dict(rtol=0, atol=shadow_tol) if key in shadowed[m] else TOL
                np.testing.assert_allclose(sds[m][key], value, err_msg=f"step {k} {m} {key}", **tol)

    # Eval-mode generation after training reads the shadowed biases and running means,
    # so it is compared in float64 (test_four_steps_float64); in float32 before training.


def test_four_steps_float64(config):
    """Same as above in float64 on both sides: rounding noise (~1e-17) is far below Adam's
    eps, so every tensor, the shadowed ones included, agrees to 1e-5 (in fact ~1e-13).
    This is the check that the two steps compute the same function."""
    with jax.enable_x64(True):
        ts = step_torch.init_state(config, SEED)
        ts.G.double()  # in place: the optimizers keep the same Parameter objects
        ts.D.double()
        state = convert.state_from_torch(config, ts)
        assert state.g.params["net_0"]["kernel"].dtype == jnp.float64
        rng = np.random.default_rng(0)
        for k in range(1, 5):
            real, z = _batch(rng, config, np.float64)
            state, fx, pt = _full_step(state, ts, real, z)
            np.testing.assert_allclose([float(l) for l in fx["losses"]], pt["losses"], **TOL)
            np.testing.assert_allclose(np.asarray(fx["fake"]), pt["fake"], **TOL)
            _assert_tree(fx["g_grads"], pt["g_grads"], f"step {k} G grads")
            _assert_tree(fx["d_grads"][0], pt["d_grads"][0], f"step {k} D grads (real step)")
            _assert_tree(fx["d_grads"][1], pt["d_grads"][1], f"step {k} D grads (fake step)")
            _assert_models(state, ts, f"after step {k}")  # params, running stats, counters

        _assert_generate(state, ts, rng.normal(size=(64, config.z_dim)))


def test_round_trip_is_exact(config):
    ts = step_torch.init_state(config, SEED)
    for module in (ts.G, ts.D):
        sd = module.state_dict()
        back = convert.flax_to_torch(convert.torch_to_flax(sd))
        assert list(back) == list(sd)
        for k, v in sd.items():
            assert back[k].dtype == v.numpy().dtype, k
            np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
        module.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


def test_strictness(config):
    ts = step_torch.init_state(config, SEED)
    sd = ts.G.state_dict()
    like = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0))).g.variables()

    missing = dict(sd)
    del missing["net.1.running_mean"]
    with pytest.raises(ValueError, match=r"net\.1\.running_mean"):
        convert.torch_to_flax(missing)
    missing = {k: v for k, v in sd.items() if not k.startswith("net.6.")}  # a whole layer
    with pytest.raises(ValueError, match=r"net\.6\.(weight|bias)"):
        convert.torch_to_flax(missing, like=like)

    wrong = dict(sd, **{"net.4.running_var": torch.ones(31)})
    with pytest.raises(ValueError, match=r"net\.4\.running_var"):
        convert.torch_to_flax(wrong)
    wrong = dict(sd, **{"net.0.weight": torch.zeros(64, 511)})  # consistent inside G, not with z_dim
    with pytest.raises(ValueError, match=r"net\.0\.weight"):
        convert.torch_to_flax(wrong, like=like)

    with pytest.raises(ValueError, match=r"unexpected key 'net\.2\."):  # net.2 is a ReLU
        convert.torch_to_flax(dict(sd, **{"net.2.weight": torch.ones(64, 64), "net.2.bias": torch.ones(64)}),
                              like=like)
    with pytest.raises(ValueError, match=r"net\.0\.running_mean"):  # a Linear has no statistics
        convert.torch_to_flax(dict(sd, **{"net.0.running_mean": torch.zeros(64)}))
    with pytest.raises(ValueError, match=r"head\.weight"):
        convert.torch_to_flax(dict(sd, **{"head.weight": torch.ones(1, 1)}))


@pytest.mark.parametrize("d_batchnorm", [True, False])
def test_init_state_tree_matches_torch(config, d_batchnorm):
    config = dataclasses.replace(config, d_batchnorm=d_batchnorm)
    # The shapes init_state produces (traced, not run: the values are not needed here).
    state = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    ts = step_torch.init_state(config, SEED)
    for ours, module in ((state.g, ts.G), (state.d, ts.D)):
        ported = convert.torch_to_flax(module.state_dict())
        fresh = {"params": ours.params, "batch_stats": ours.batch_stats}
        assert jax.tree.structure(fresh) == jax.tree.structure(ported)
        assert jax.tree.map(lambda a: (a.shape, a.dtype), fresh) == jax.tree.map(
            lambda a: (a.shape, a.dtype), ported)
