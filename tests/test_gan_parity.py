"""The Flax GAN step against its PyTorch twin, from the same weights and the same inputs."""
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
d_step = jax.jit(step.d_step, static_argnums=2)


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


def _batch(rng, config):
    real = rng.choice(np.asarray(config.modes), size=(config.batch_size, 1)) + config.mode_std * rng.normal(
        size=(config.batch_size, 1))
    z = rng.normal(size=(config.batch_size, config.z_dim))
    return real.astype(np.float32), z.astype(np.float32)


@pytest.fixture(scope="module")
def config():
    return config_lib.get_config("default")


def test_one_step_then_three_more(config):
    assert config.z_dim == 512 and config.batch_size == 10
    ts = step_torch.init_state(config, SEED)
    state = convert.state_from_torch(config, ts)
    _assert_models(state, ts, "ported")
    rng = np.random.default_rng(0)

    real, z = _batch(rng, config)
    state, fx, pt = _full_step(state, ts, real, z)
    np.testing.assert_allclose([float(l) for l in fx["losses"]], pt["losses"], **TOL)
    np.testing.assert_allclose(np.asarray(fx["fake"]), pt["fake"], **TOL)
    _assert_tree(fx["g_grads"], pt["g_grads"], "G grads")
    _assert_tree(fx["d_grads"][0], pt["d_grads"][0], "D grads (real step)")
    _assert_tree(fx["d_grads"][1], pt["d_grads"][1], "D grads (fake step)")
    _assert_models(state, ts, "after step 1")  # params, running mean/var, num_batches_tracked

    for i in range(3):
        real, z = _batch(rng, config)
        state, fx, pt = _full_step(state, ts, real, z)
        np.testing.assert_allclose([float(l) for l in fx["losses"]], pt["losses"], **TOL)
        _assert_models(state, ts, f"after step {i + 2}")

    # Eval-mode generation with the trained running statistics.
    z = rng.normal(size=(64, config.z_dim)).astype(np.float32)
    ts.G.eval()
    with torch.no_grad():
        want = ts.G(torch.from_numpy(z))[:, 0].numpy()
    ts.G.train()
    np.testing.assert_allclose(np.asarray(step.generate(state, jnp.asarray(z))), want, **TOL)


def test_generate_eval_mode_fresh(config):
    ts = step_torch.init_state(config, SEED + 1)
    state = convert.state_from_torch(config, ts)
    z = np.random.default_rng(3).normal(size=(32, config.z_dim)).astype(np.float32)
    ts.G.eval()
    with torch.no_grad():
        want = ts.G(torch.from_numpy(z))[:, 0].numpy()
    np.testing.assert_allclose(np.asarray(step.generate(state, jnp.asarray(z))), want, **TOL)


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
    with pytest.raises(ValueError, match=r"net\.6\.weight"):
        convert.torch_to_flax(missing, like=like)

    wrong = dict(sd, **{"net.4.running_var": torch.ones(31)})
    with pytest.raises(ValueError, match=r"net\.4\.running_var"):
        convert.torch_to_flax(wrong)
    wrong = dict(sd, **{"net.0.weight": torch.zeros(64, 511)})  # consistent inside G, not with z_dim
    with pytest.raises(ValueError, match=r"net\.0\.weight"):
        convert.torch_to_flax(wrong, like=like)

    with pytest.raises(ValueError, match=r"net\.2\.weight"):  # ReLU has no weights
        convert.torch_to_flax(dict(sd, **{"net.2.weight": torch.ones(3)}), like=like)
    with pytest.raises(ValueError, match=r"head\.weight"):
        convert.torch_to_flax(dict(sd, **{"head.weight": torch.ones(1, 1)}))


@pytest.mark.parametrize("d_batchnorm", [True, False])
def test_init_state_tree_matches_torch(config, d_batchnorm):
    import dataclasses

    config = dataclasses.replace(config, d_batchnorm=d_batchnorm)
    state = step.init_state(config, jax.random.key(0))
    ts = step_torch.init_state(config, SEED)
    for ours, module in ((state.g, ts.G), (state.d, ts.D)):
        ported = convert.torch_to_flax(module.state_dict())
        fresh = {"params": ours.params, "batch_stats": ours.batch_stats}
        assert jax.tree.structure(fresh) == jax.tree.structure(ported)
        assert jax.tree.map(np.shape, fresh) == jax.tree.map(np.shape, ported)
        # Fresh statistics are torch's 0 / 1 too.
        jax.tree.map(np.testing.assert_array_equal, fresh["batch_stats"], ported["batch_stats"])
