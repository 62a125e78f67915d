"""check_parity: the zoo's faithful ports pass layer by layer (eval and train), classic
wrong ports are caught at the right layer, and the workloads' own twins pass.

Float32 with the default tolerances (max|diff| <= 1e-5 + 1e-5 * max|torch| per row).
"""
import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

import port_zoo  # noqa: E402  (imports torch)

from flaxport.port import build_key_map, check_parity, port_weights  # noqa: E402


@pytest.fixture(scope="module")
def zoo():
    return {name: (port_zoo.randomize_norms(t), f, x, fs) for name, (t, f, x, fs) in port_zoo.zoo().items()}


@pytest.mark.parametrize("name", ["resnet", "mlp", "decoder", "seq"])
def test_zoo_parity_eval_and_train(zoo, name):
    """Every ported layer's output, the output, and in train mode every gradient and the
    BatchNorm running statistics agree; the torch module itself is left untouched."""
    tm, fm, x, fs = zoo[name]
    before = {k: v.clone() for k, v in tm.state_dict().items()}
    km = build_key_map(tm, fm, x, flatten_shapes=fs)
    variables = km.to_flax(tm.state_dict())
    for train in (False, True):
        report = check_parity(tm, fm, variables, x, train=train, key_map=km)
        assert report.ok, str(report)
        forward = {r.torch_name for r in report.rows if r.phase == "forward"}
        assert {p.torch_name for p in km.pairs} <= forward  # each ported layer was compared
        phases = {r.phase for r in report.rows}
        assert phases >= ({"forward", "output", "grad"} if train else {"forward", "output"})
        has_bn = any(isinstance(m, torch.nn.BatchNorm2d) for m in tm.modules())
        assert ("running_stats" in phases) == (train and has_bn)
        if train:  # one gradient row per torch parameter
            assert sorted(r.torch_name for r in report.rows if r.phase == "grad") == sorted(
                k for k, _ in tm.named_parameters())
    assert all(torch.equal(before[k], v) for k, v in tm.state_dict().items())
    assert tm.training  # mode restored


def _first(report):
    first = report.first_divergence
    assert first is not None and not report.ok, str(report)
    return first.phase, first.torch_name, first.flax_name


def test_same_padding_on_stride2_conv_is_named(zoo):
    """Flax 'SAME' pads (0, 1) for k3 s2 on an even size, torch padding=1 pads (1, 1): same shapes, other numbers."""
    tm, _, x, fs = zoo["resnet"]
    fm = port_zoo.FlaxResNet(wrong="same_pad")
    report = check_parity(tm, fm, port_weights(tm, fm, x, flatten_shapes=fs), x, flatten_shapes=fs)
    assert _first(report) == ("forward", "block.conv1", "block/conv1")
    ok_rows = report.rows[:report.rows.index(report.first_divergence)]
    assert [r.torch_name for r in ok_rows] == ["stem", "bn0", "pool"] and all(r.ok for r in ok_rows)
    text = str(report)
    assert "FIRST DIVERGENCE at torch 'block.conv1' / flax 'block/conv1'" in text
    assert "FAIL <- first" in text.splitlines()[5]  # header line, table header, stem, bn0, pool, block.conv1
    header, *lines = text.splitlines()[1:]
    col = header.index("torch")  # aligned columns: every torch name starts under the header
    assert all(line[col:].startswith(r.torch_name) for line, r in zip(lines, report.rows))
    data = json.loads(report.to_json())
    assert data["ok"] is False and data["first_divergence"]["torch_name"] == "block.conv1"
    assert len(data["rows"]) == len(report.rows)


def test_flax_batchnorm_momentum_is_named_in_train_mode(zoo):
    """torch's momentum 0.1 given to stock Flax BatchNorm: forward agrees, running stats do not."""
    tm, _, x, _ = zoo["decoder"]
    fm = port_zoo.FlaxDecoder(wrong="flax_bn_momentum")
    report = check_parity(tm, fm, port_weights(tm, fm, x), x, train=True, grads=False)
    assert all(r.ok for r in report.rows if r.phase in ("forward", "output"))
    assert _first(report) == ("running_stats", "bn.running_mean", "batch_stats/bn/mean")


@pytest.mark.parametrize("wrong,layer", [("approx_gelu", "act"), ("ln_eps", "norm")])
def test_mlp_wrong_ports_are_named(zoo, wrong, layer):
    """tanh-approximate GELU (Flax's default) and LayerNorm eps 1e-6 (Flax's default) on
    rows of small variance."""
    tm, _, x, _ = zoo["mlp"]
    fm = port_zoo.FlaxMLP(wrong=wrong)
    report = check_parity(tm, fm, port_weights(tm, fm, x), x)
    assert _first(report) == ("forward", layer, layer)
    assert report.first_divergence.max_abs > 1e-4


def test_naive_fc_transpose_after_flatten_is_named(zoo):
    """Without flatten_shapes the fc kernel is weight.T: right shape, rows in torch's (c, h, w) order."""
    tm, fm, x, _ = zoo["resnet"]
    report = check_parity(tm, fm, port_weights(tm, fm, x), x)
    assert _first(report) == ("forward", "fc", "fc")


@pytest.mark.parametrize("rank", [1, 3])
def test_conv1d_transpose_and_conv3d_in_sequentials(rank):
    """Rank-3 (N, C, L) and rank-5 inputs go channels-last; Flax's nn.Sequential names its
    layers layers_0, ... so they pair with torch's 0, 1, ... by call order."""
    from flax import linen as nn

    from flaxport import nn as fpnn

    torch.manual_seed(0)
    if rank == 1:
        tm = torch.nn.Sequential(torch.nn.ConvTranspose1d(3, 5, 4, stride=2, padding=1), torch.nn.BatchNorm1d(5))
        fm = nn.Sequential([fpnn.ConvTranspose1d(5, 4, 2, 1), fpnn.BatchNorm(use_running_average=True)])
        x = port_zoo.image((2, 3, 6))
    else:
        tm = torch.nn.Sequential(torch.nn.Conv3d(2, 4, (3, 2, 3), padding=1, stride=(1, 2, 1)),
                                 torch.nn.BatchNorm3d(4))
        fm = nn.Sequential([fpnn.Conv3d(4, (3, 2, 3), padding=1, stride=(1, 2, 1)),
                            fpnn.BatchNorm(use_running_average=True)])
        x = port_zoo.image((2, 2, 4, 5, 3))
    tm = port_zoo.randomize_norms(tm).eval()
    km = build_key_map(tm, fm, x)
    assert [p.flax_name for p in km.pairs] == ["layers_0", "layers_1"] and km.input_channels_first
    report = check_parity(tm, fm, km.to_flax(tm.state_dict()), x, key_map=km)
    assert report.ok and [r.torch_name for r in report.rows] == ["0", "1", "output"], str(report)


# --------------------------------------------------------------------------- workloads
def _assert_same_tree(a, b):
    fa = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(a)}
    fb = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(b)}
    assert sorted(fa) == sorted(fb)
    for k in fa:
        assert np.asarray(fa[k]).dtype == np.asarray(fb[k]).dtype, k
        np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


def _both_modes(tm, fm, variables, inputs, **kw):
    for train in (False, True):
        report = check_parity(tm, fm, variables, inputs, train=train, **kw)
        assert report.ok, str(report)


def test_gan_generator():
    from flaxport.workloads.gan import config, convert, model, model_torch

    cfg = config.get_config("default")
    torch.manual_seed(0)
    tm, fm = port_zoo.randomize_norms(model_torch.generator(cfg)), model.generator(cfg)
    z = torch.randn(8, cfg.z_dim)
    variables = port_weights(tm, fm, z)
    _assert_same_tree(variables, convert.torch_to_flax(tm.state_dict()))
    _both_modes(tm, fm, variables, z)


def test_cnn():
    from flaxport.workloads.cnn import config, convert, model, model_torch

    cfg = dataclasses.replace(config.get_config("default"), conv_impl="xla")  # compiles faster than im2col
    torch.manual_seed(0)
    tm, fm = port_zoo.randomize_norms(model_torch.CNN(cfg)), model.cnn(cfg)
    x = torch.rand(2, cfg.channels, cfg.image_size, cfg.image_size)
    fs = {"fc1": model.flat_geometry(cfg)}
    variables = port_weights(tm, fm, x, flatten_shapes=fs)
    _assert_same_tree(variables, convert.torch_to_flax(cfg, tm.state_dict()))
    _both_modes(tm, fm, variables, x, flatten_shapes=fs)


def test_vae():
    from flaxport.workloads.vae import config, convert, model, model_torch

    cfg = config.get_config("default")
    torch.manual_seed(0)
    tm, fm = model_torch.VAE(cfg), model.vae(cfg)
    inputs = ((torch.rand(4, cfg.image_size ** 2) > 0.5).float(), torch.randn(4, cfg.latents))
    variables = port_weights(tm, fm, inputs)
    _assert_same_tree(variables, convert.torch_to_flax(cfg, tm.state_dict()))
    _both_modes(tm, fm, variables, inputs)


def test_ddim():
    """The UNet's two inputs in torch layout: noisy images (N, C, H, W) and noise variances
    (N, 1, 1, 1), which are the same array channels-last. Smoke widths (one compile per mode).
    BatchNorm without scale/offset: only the statistics are drawn; keras's zero biases and zero
    head are drawn too (a zero head zeroes every gradient behind it)."""
    from flaxport.workloads.ddim import config, convert, model, model_torch

    cfg = config.get_config("smoke")
    torch.manual_seed(0)
    tm, fm = model_torch.UNet(cfg), model.unet(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in tm.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                assert not m.affine
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(1, 1.5, generator=g)
        for p in tm.parameters():
            if not p.any():
                p.normal_(0, 0.1, generator=g)
    inputs = (port_zoo.image((4, cfg.channels, cfg.image_size, cfg.image_size)), torch.rand(4, 1, 1, 1, generator=g))
    variables = port_weights(tm, fm, inputs)
    _assert_same_tree(variables, convert.torch_to_flax(cfg, tm.state_dict()))
    km = build_key_map(tm, fm, inputs)
    assert km.input_channels_first
    back, want = km.to_torch(variables), convert.flax_to_torch(cfg, variables)
    assert list(back) == list(tm.state_dict()) and sorted(back) == sorted(want)
    assert all(np.array_equal(back[k], want[k]) and back[k].dtype == want[k].dtype for k in want)
    _both_modes(tm, fm, variables, inputs, key_map=km)
