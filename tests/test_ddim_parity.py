"""The Flax DDIM against its PyTorch twin: same weights, same noise and diffusion times.

Small settings keep it fast: batch 4, 32x32, widths 8-16(-24) instead of 32-64-96-128,
with the default's 2 blocks a stage, skips and shortcuts (the 4-width UNet at 32 and 64 is
checked for shapes). Jitted functions compile without XLA's backend optimisations, else
XLA:CPU spends ~30 s on one UNet train step.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from flaxport.workloads.ddim import config as config_lib
from flaxport.workloads.ddim import convert, model, schedule, step

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

from flaxport.workloads.ddim import model_torch, step_torch  # noqa: E402  (imports torch)

F = torch.nn.functional
FAST = step.FAST_COMPILE
SEED = 0


@pytest.fixture(scope="module")
def config():
    return dataclasses.replace(config_lib.get_config("default"), image_size=32, widths=(8, 16, 24), batch_size=4,
                               norm_mean=(0.2, 0.3, 0.4), norm_std=(0.3, 0.25, 0.35))


def _twin(config, dtype=torch.float32, seed=SEED):
    """A torch twin whose head is not zero (else every other gradient is exactly 0) and whose
    BN statistics are not 0 / 1; the EMA network starts as a copy of it."""
    ts = step_torch.init_state(config, seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        head = ts.model.head
        head.weight.copy_(torch.rand(head.weight.shape, generator=g) * 0.4 - 0.2)
        head.bias.copy_(torch.rand(head.bias.shape, generator=g) * 0.2 - 0.1)
        for m in ts.model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    ts.model.to(dtype)
    ts.ema_model.to(dtype)
    ts.ema_model.load_state_dict(ts.model.state_dict())
    return ts


def _draws(config, seed, dtype=np.float32):
    """(images in [0, 1], noise) NHWC and times (B, 1, 1, 1), as NumPy."""
    rng = np.random.default_rng(seed)
    b, s, c = config.batch_size, config.image_size, config.channels
    images = rng.integers(0, 256, (b, s, s, c)).astype(dtype) / dtype(255)
    return images, rng.standard_normal((b, s, s, c)).astype(dtype), rng.uniform(size=(b, 1, 1, 1)).astype(dtype)


def _nchw(a):
    return torch.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))


def _flax_step(config):
    def f(state, images, noises, times):
        return step.train_step_on(config, state, step.normalize(config, images), noises, times, return_grads=True)

    return jax.jit(f, compiler_options=FAST)


def _torch_step(ts, images, noises, times):
    loss, image_loss = step_torch.step(ts, step_torch.normalize(ts.config, _nchw(images)), _nchw(noises),
                                       torch.from_numpy(times))
    grads = {k: p.grad.detach().numpy().copy() for k, p in ts.model.named_parameters()}
    return loss.item(), image_loss.item(), grads


def _sd(module):
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def _assert_sd(got, want, what, rtol, atol, tiny_grads=None, lr=0.0):
    """Every key, to rtol/atol; where `tiny_grads` (|g| < 1e-5) Adam's first step
    lr * g / (|g| + eps) swings with the gradient's last bits, so those weights get 2 lr."""
    assert sorted(got) == sorted(want), what
    for k in want:
        bound = atol + rtol * np.abs(want[k])
        if tiny_grads is not None and k in tiny_grads:
            bound = np.where(np.abs(tiny_grads[k]) < 1e-5, 2 * lr, bound)
        worst = (np.abs(got[k] - want[k]) - bound).max()
        assert worst <= 0, f"{what}: {k} off by {worst:.3g} beyond the bound"


def _check_step(config, state, ts, draws, run, tol, k):
    images, noises, times = draws
    new_state, metrics, grads = run(state, *(jnp.asarray(a) for a in draws))
    loss_t, image_loss_t, grads_t = _torch_step(ts, images, noises, times)
    assert float(metrics["loss"]) == pytest.approx(loss_t, rel=tol["loss"])
    assert float(metrics["image_loss"]) == pytest.approx(image_loss_t, rel=tol["loss"])
    grads = convert.flax_to_torch(config, {"params": grads})
    _assert_sd(grads, grads_t, f"step {k} grads", **tol["grads"])
    lr = schedule.learning_rate(config, k - 1)
    tiny = grads_t if tol.get("tiny") else None
    _assert_sd(convert.flax_to_torch(config, new_state.variables(), k), _sd(ts.model), f"after step {k}",
               **tol["params"], tiny_grads=tiny, lr=lr)
    decay = schedule.ema_decay(config, k - 1)
    _assert_sd(convert.flax_to_torch(config, new_state.ema_variables(), k), _sd(ts.ema_model),
               f"EMA after step {k}", **tol["params"], tiny_grads=tiny, lr=lr * (1 - decay))
    return new_state


@pytest.mark.parametrize("conv_impl,widths", [("im2col", (8, 16)), ("native", (16, 32))])
def test_one_step_float32(config, conv_impl, widths):
    """Loss, image loss, every gradient, BN statistics, weights after AdamW, EMA weights and
    EMA statistics, from the same weights, images, noise and times, with im2col convs and
    with flaxport's FFI convs (widths multiples of 16, so every 3x3 conv runs on them; the
    float64 test runs XLA's conv op). One down/up stage of two blocks: each UNet step costs
    seconds of XLA compile."""
    config = dataclasses.replace(config, widths=widths, conv_impl=conv_impl)
    ts = _twin(config)
    state = convert.state_from_torch(config, ts)
    # The FFI conv sums each output's 9 x cin products in one chain, oneDNN and XLA in
    # blocks: the loss differs by 3e-6 relative (im2col 1e-6), inside the 1e-5.
    tol = {"loss": 1e-5 if conv_impl == "native" else 1e-6, "grads": dict(rtol=1e-3, atol=1e-5),
           "params": dict(rtol=1e-5, atol=1e-5), "tiny": True}
    _check_step(config, state, ts, _draws(config, 1), _flax_step(config), tol, 1)


def test_two_steps_float64(config):
    """Everything to 1e-6 (grads to 1e-9) over two steps of the warmup-cosine schedule
    (lr 0, then lr), with the default conv_impl: in float64 "native" falls back to XLA's
    conv op (a float64 im2col step compiles ~2x longer)."""
    config = dataclasses.replace(config, widths=(8, 16), lr_schedule="warmup_cosine",
                                 warmup_steps=1, schedule_steps=4)
    tol = {"loss": 1e-12, "grads": dict(rtol=1e-9, atol=1e-12), "params": dict(rtol=1e-6, atol=1e-8)}
    with jax.enable_x64(True):
        ts = _twin(config, torch.float64)
        state = convert.state_from_torch(config, ts)
        assert state.params["stem"]["kernel"].dtype == jnp.float64
        run = _flax_step(config)
        for k in (1, 2):
            state = _check_step(config, state, ts, _draws(config, k, np.float64), run, tol, k)
        assert int(state.step) == ts.steps_done == 2


def test_ema_decay_warms_up_alike_in_both_twins(config):
    """min(0.999, (1 + t) / (10 + t)) at update t, from Python ints (torch) and from the
    traced step counter (Flax); keras's constant with ema_warmup=False."""
    updates = [0, 1, 9, 90, 890, 8990, 8991, 20000]
    want = [min(0.999, (1 + t) / (10 + t)) for t in updates]
    assert [schedule.ema_decay(config, t) for t in updates] == want
    traced = jax.jit(jax.vmap(lambda t: schedule.ema_decay(config, t)))(jnp.asarray(updates))
    np.testing.assert_allclose(np.asarray(traced), want, rtol=1e-7)
    assert want[0] == 0.1 and want[-1] == 0.999
    keras = dataclasses.replace(config, ema_warmup=False)
    assert schedule.ema_decay(keras, 0) == schedule.ema_decay(keras, 20000) == 0.999


def test_ddim_sampling_float32(config):
    """10 DDIM steps from the same noise with the EMA network in eval mode (running BN
    statistics). An untrained network does not denoise, so the sampler's remixing scales
    the images by up to 0.95 / 0.02: the normalised images match to 1e-4 of their scale
    (~400), and with a data std of 0.002 the samples spread over [0, 1], matching to 1e-4."""
    config = dataclasses.replace(config, widths=(8, 16), norm_mean=(0.5,) * 3, norm_std=(0.002,) * 3)
    ts = _twin(config, seed=3)
    variables = jax.tree.map(jnp.asarray, convert.torch_to_flax(config, ts.ema_model.state_dict()))
    noise = np.random.default_rng(7).standard_normal((3, config.image_size, config.image_size, 3), np.float32)
    raw = np.asarray(step.reverse_diffusion.lower(config, variables, noise, 10).compile(FAST)(variables, noise))
    raw_t = step_torch.reverse_diffusion(config, ts.ema_model, _nchw(noise), 10).numpy().transpose(0, 2, 3, 1)
    assert np.abs(raw_t).max() > 10.0  # a sampler that does something
    np.testing.assert_allclose(raw, raw_t, rtol=0, atol=1e-4 * np.abs(raw_t).max())
    images = np.asarray(step.denormalize(config, jnp.asarray(raw)))
    images_t = step_torch.generate(config, ts, _nchw(noise), 10).numpy().transpose(0, 2, 3, 1)
    assert 0.0 <= images.min() and images.max() <= 1.0
    assert ((images_t > 0) & (images_t < 1)).mean() > 0.9 and images_t.std() > 0.1  # not all clipped
    np.testing.assert_allclose(images, images_t, rtol=0, atol=1e-4)
    # The reverse process (diffusion.png): the noisy image each step starts from, then the output.
    path = np.asarray(step.reverse_diffusion.lower(config, variables, noise, 10, True).compile(FAST)(variables, noise))
    path_t = step_torch.reverse_diffusion(config, ts.ema_model, _nchw(noise), 10, keep_path=True)
    assert path.shape == (11, *noise.shape) and tuple(path_t.shape) == (11, *_nchw(noise).shape)
    np.testing.assert_array_equal(path[0], noise)
    np.testing.assert_array_equal(path[-1], raw)
    np.testing.assert_allclose(path, path_t.numpy().transpose(0, 1, 3, 4, 2), rtol=0, atol=1e-4 * np.abs(raw_t).max())


def test_layers_match_torch_and_keras_semantics():
    """Bilinear x2 = torch interpolate (align_corners=False) = jax.image.resize; average pool;
    the embedding; the schedule on NumPy, JAX and torch arrays; the torch/optax lr schedules."""
    x = np.random.default_rng(0).standard_normal((2, 5, 6, 3)).astype(np.float32)
    up = np.asarray(model.upsample_bilinear2x(jnp.asarray(x)))
    up_t = F.interpolate(_nchw(x), scale_factor=2, mode="bilinear", align_corners=False).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(up, up_t, rtol=0, atol=1e-6)
    np.testing.assert_allclose(up, np.asarray(jax.image.resize(jnp.asarray(x), (2, 10, 12, 3), "bilinear")),
                               rtol=0, atol=1e-6)
    pooled_t = F.avg_pool2d(_nchw(x[:, :4]), 2).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(np.asarray(model.average_pool2x(jnp.asarray(x[:, :4]))), pooled_t, atol=1e-7)

    t = np.linspace(0, 1, 11)
    noise_rates, signal_rates = schedule.diffusion_schedule(t, 0.02, 0.95)
    np.testing.assert_allclose([signal_rates[0], signal_rates[-1]], [0.95, 0.02], rtol=1e-12)
    np.testing.assert_allclose(noise_rates ** 2 + signal_rates ** 2, 1.0, rtol=1e-12)
    for other in (schedule.diffusion_schedule(torch.from_numpy(t), 0.02, 0.95),
                  schedule.diffusion_schedule(jnp.asarray(t, jnp.float32), 0.02, 0.95)):
        np.testing.assert_allclose(np.asarray(other[0]), noise_rates, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(np.asarray(other[1]), signal_rates, rtol=1e-6, atol=1e-7)
    speeds = schedule.embedding_angular_speeds(32, 1.0, 1000.0)
    assert speeds.shape == (16,) and speeds[0] == pytest.approx(2 * np.pi) and speeds[-1] == pytest.approx(2000 * np.pi)
    v = np.array([0.0, 0.3, 1.0], np.float32).reshape(3, 1, 1, 1)
    emb = np.asarray(model.sinusoidal_embedding(jnp.asarray(v), speeds))
    np.testing.assert_allclose(emb[0, 0, 0], np.r_[np.zeros(16), np.ones(16)])
    np.testing.assert_allclose(emb[1, 0, 0, :16], np.sin(2 * np.pi * np.exp(np.linspace(0, np.log(1000), 16)) * 0.3),
                               atol=1e-3)  # float32 angles up to 2000 pi: ~1e-4 absolute

    cfg = dataclasses.replace(config_lib.get_config("default"), lr_schedule="warmup_cosine", warmup_steps=10,
                              schedule_steps=100)
    steps = [0, 1, 9, 10, 11, 55, 99, 100, 150]
    optax_lr = np.asarray(optax.warmup_cosine_decay_schedule(0.0, cfg.lr, 10, 100, 0.0)(jnp.asarray(steps)))
    # optax computes in float32: 1 + cos(pi p) loses digits near the end of the decay
    np.testing.assert_allclose([schedule.learning_rate(cfg, k) for k in steps], optax_lr, rtol=1e-6, atol=1e-6 * cfg.lr)
    with pytest.raises(ValueError, match="schedule_steps"):
        step.optimizer(dataclasses.replace(cfg, schedule_steps=0))


def test_round_trip_and_strictness(config):
    ts = step_torch.init_state(config, SEED)
    sd = ts.model.state_dict()
    back = convert.flax_to_torch(config, convert.torch_to_flax(config, sd), num_batches_tracked=0)
    assert sorted(back) == sorted(sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
    ts.model.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)

    with pytest.raises(ValueError, match=r"missing key 'up1_0\.norm\.running_var'"):
        convert.torch_to_flax(config, {k: v for k, v in sd.items() if k != "up1_0.norm.running_var"})
    with pytest.raises(ValueError, match=r"unexpected key 'mid0\.norm\.weight'"):  # an affine BatchNorm
        convert.torch_to_flax(config, dict(sd, **{"mid0.norm.weight": torch.ones(16)}))
    wider = model_torch.UNet(dataclasses.replace(config, widths=(8, 16, 40))).state_dict()
    with pytest.raises(ValueError, match=r"shape mismatch for 'mid0\.shortcut\.weight'"):
        convert.torch_to_flax(config, wider)
    variables = convert.torch_to_flax(config, sd)
    variables["params"]["mid1"]["shortcut"] = {"kernel": np.zeros((1, 1, 24, 24)), "bias": np.zeros(24)}
    with pytest.raises(ValueError, match=r"unexpected Flax parameter 'mid1/shortcut/bias'"):
        convert.flax_to_torch(config, variables)


def test_init_matches_torch_and_keras(config):
    """The Flax tree (eval_shape of init_state) equals the converted torch tree; keras's init:
    zero head kernel, zero biases, glorot-uniform bounds; the UNet runs at 32 and 64."""
    state = jax.eval_shape(lambda: step.init_state(config, jax.random.key(0)))
    ported = convert.torch_to_flax(config, step_torch.init_state(config, SEED).model.state_dict())
    fresh = {"params": state.params, "batch_stats": state.batch_stats}
    shape_of = lambda t: jax.tree.map(lambda a: (a.shape, np.dtype(a.dtype)), t)  # noqa: E731
    assert shape_of(fresh) == shape_of(ported)
    assert shape_of(state.ema_params) == shape_of(state.params)
    p = ported["params"]
    assert not p["head"]["kernel"].any() and not p["down0_0"]["conv1"]["bias"].any()
    k = p["down1_0"]["conv1"]["kernel"]  # (3, 3, 8, 16): bound sqrt(6 / (72 + 144))
    assert 0.8 * np.sqrt(6 / 216) < np.abs(k).max() <= np.sqrt(6 / 216)

    default = dataclasses.replace(config_lib.get_config("default"), image_size=64)
    out = jax.eval_shape(lambda x, v: model.unet(default).init_with_output(jax.random.key(0), x, v, train=True)[0],
                         *model.dummy_inputs(default))
    assert out.shape == (2, 64, 64, 3)
    with torch.no_grad():
        net = model_torch.UNet(default).eval()
        for side in (32, 64):
            assert net(torch.zeros(1, 3, side, side), torch.zeros(1, 1, 1, 1)).shape == (1, 3, side, side)


def test_train_step_plumbing(config):
    """The harness-facing pieces: uint8 batches convert alike; make_train_step refuses a
    config without data statistics; data_stats gives keras's adapt() numbers."""
    images_u8 = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    x = np.asarray(step.normalize(config, step.to_float(jnp.asarray(images_u8))))
    ts = step_torch.init_state(dataclasses.replace(config, widths=(8, 16)), SEED)
    x_t = step_torch.to_input(ts, torch.from_numpy(images_u8)).numpy().transpose(0, 2, 3, 1)
    np.testing.assert_allclose(x, x_t, rtol=1e-6, atol=1e-6)
    stats = step.data_stats(images_u8)
    np.testing.assert_allclose(stats["norm_mean"], (images_u8 / 255.0).mean((0, 1, 2)))
    np.testing.assert_allclose(stats["norm_std"], (images_u8 / 255.0).std((0, 1, 2)))
    with pytest.raises(ValueError, match="norm_mean"):
        step.make_train_step(dataclasses.replace(config, norm_mean=()))


def test_a_torch_runs_ema_network_exports_with_the_weights_the_hand_written_map_gives(config):
    from flaxport.workloads.ddim import export

    ts = _twin(config)
    with torch.no_grad():  # the EMA network apart from the model, so taking the wrong one shows
        for p in ts.ema_model.parameters():
            p.mul_(0.5)
    got = export.ema_variables(config, "torch", ts)
    want = convert.torch_to_flax(config, ts.ema_model.state_dict())
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), b)
