"""port_weights / to_torch_state_dict: layer pairing, conversions, exact round trips, strict errors.

No Flax computation runs here (the Flax modules are only initialised abstractly), so
these tests are cheap; the numbers the ports compute are checked in test_port_parity.py.
"""
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import port_zoo  # noqa: E402  (imports torch)

from flaxport import nn as fpnn  # noqa: E402
from flaxport.errors import UserError  # noqa: E402
from flaxport.port import (MissingKeyError, PortError, ShapeMismatchError, UnexpectedKeyError,  # noqa: E402
                           UnsupportedLayerError, build_key_map, port_weights, to_torch_state_dict)


@pytest.fixture(scope="module")
def zoo():
    return {name: (port_zoo.randomize_norms(t), f, x, fs) for name, (t, f, x, fs) in port_zoo.zoo().items()}


@pytest.mark.parametrize("name", ["resnet", "mlp", "decoder", "seq"])
def test_round_trip_is_bitwise(zoo, name):
    """torch -> Flax -> torch gives every tensor back bit for bit (num_batches_tracked too),
    and the Flax tree has exactly the shapes and dtypes of the module's own init."""
    tm, fm, x, fs = zoo[name]
    km = build_key_map(tm, fm, x, flatten_shapes=fs)
    variables = port_weights(tm, fm, x, flatten_shapes=fs)
    fresh = jax.eval_shape(lambda: fm.init(jax.random.key(0), *km_inputs(km, x), **_mode(fm)))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), variables) == jax.tree.map(lambda a: (a.shape, a.dtype),
                                                                                  dict(fresh))
    back = to_torch_state_dict(variables, tm, fm, x, flatten_shapes=fs)
    sd = tm.state_dict()
    assert list(back) == list(sd)
    for k, v in sd.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    tm.load_state_dict(back, strict=True)


def km_inputs(km, x):
    from flaxport.port.weights import to_flax_input

    return [to_flax_input(x, km.input_channels_first)]


def _mode(fm):
    from flaxport.port.weights import mode_kwargs

    return mode_kwargs(fm, False)


def test_conversions_by_layer_type(zoo):
    """The layout rules, spelled out on the zoo's tensors."""
    tm, fm, x, fs = zoo["resnet"]
    v = port_weights(tm, fm, x, flatten_shapes=fs)
    w = tm.block.conv1.weight.detach().numpy()  # (O, I, kh, kw) -> (kh, kw, I, O)
    np.testing.assert_array_equal(v["params"]["block"]["conv1"]["kernel"], w.transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(v["batch_stats"]["block"]["shortcut_1"]["var"],
                                  tm.block.shortcut[1].running_var.numpy())
    fc = tm.fc.weight.detach().numpy()  # rows of a (C, H, W) flatten -> (H, W, C) order
    np.testing.assert_array_equal(v["params"]["fc"]["kernel"],
                                  fc.reshape(10, 16, 3, 3).transpose(2, 3, 1, 0).reshape(144, 10))
    naive = port_weights(tm, fm, x)  # no flatten_shapes: plain transpose (test_port_parity shows it is wrong)
    np.testing.assert_array_equal(naive["params"]["fc"]["kernel"], fc.T)

    tm, fm, x, _ = zoo["decoder"]
    v = port_weights(tm, fm, x)["params"]
    w1, w2, w3 = (m.weight.detach().numpy() for m in (tm.up1, tm.up2, tm.up3))  # (I, O, kh, kw)
    np.testing.assert_array_equal(v["up1"]["kernel"], w1.transpose(2, 3, 0, 1))  # flaxport.nn: (kh, kw, I, O)
    np.testing.assert_array_equal(v["up2"]["kernel"], w2.transpose(2, 3, 1, 0))  # transpose_kernel=True: (.., O, I)
    np.testing.assert_array_equal(v["up3"]["kernel"], w3.transpose(2, 3, 0, 1)[::-1, ::-1])  # stock: flipped

    tm, fm, x, _ = zoo["seq"]
    km = build_key_map(tm, fm, x)
    # Flax auto-names differ from torch's: paired by call order within each layer type
    assert [(p.torch_name, p.flax_name) for p in km.pairs] == [
        ("embed", "Embed_0"), ("conv", "Conv1d_0"), ("norm", "GroupNorm_0"), ("head", "Dense_0")]
    v = km.to_flax(tm.state_dict())["params"]
    np.testing.assert_array_equal(v["Embed_0"]["embedding"], tm.embed.weight.detach().numpy())
    np.testing.assert_array_equal(v["Conv1d_0"]["kernel"], tm.conv.weight.detach().numpy().transpose(2, 1, 0))
    np.testing.assert_array_equal(v["GroupNorm_0"]["scale"], tm.norm.weight.detach().numpy())


# --------------------------------------------------------------------------- strictness
class FlaxMLPWide(nn.Module):
    """FlaxMLP with fc1 of 24 units instead of torch's 32."""

    @nn.compact
    def __call__(self, x):
        h = fpnn.GELU(name="act")(fpnn.Dense(24, name="fc1")(fpnn.LayerNorm(name="norm")(x)))
        return fpnn.Dense(8, name="fc2")(h)


class TorchMLPExtra(port_zoo.TorchMLP):
    def __init__(self):
        super().__init__()
        self.extra = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.extra(super().forward(x))


def test_errors_name_both_sides(zoo):
    tm, fm, x, _ = zoo["mlp"]
    assert issubclass(PortError, UserError)

    # module level: a Flax layer with no torch layer, a torch layer with no Flax layer, a shape
    with pytest.raises(MissingKeyError, match=r"Flax 'params/norm/bias' has no torch counterpart in layer 'norm'"):
        port_weights(port_zoo.TorchMLP().apply(_drop_ln_bias), fm, x)
    with pytest.raises(UnexpectedKeyError, match=r"torch 'extra\.weight' \(Linear 'extra'\) has no Flax counterpart"):
        port_weights(TorchMLPExtra(), fm, x)
    with pytest.raises(ShapeMismatchError, match=r"torch 'fc1\.weight' \(32, 16\) -> \(16, 32\), but Flax "
                                                 r"'params/fc1/kernel' is \(16, 24\)"):
        port_weights(tm, FlaxMLPWide(), x)

    # state_dict level, against a built key map
    km = build_key_map(tm, fm, x)
    sd = tm.state_dict()
    with pytest.raises(MissingKeyError, match=r"lacks 'fc2\.bias' \(for Flax 'params/fc2/bias'\)"):
        km.to_flax({k: v for k, v in sd.items() if k != "fc2.bias"})
    with pytest.raises(UnexpectedKeyError, match=r"'fc3\.weight', which no Flax variable takes"):
        km.to_flax({**sd, "fc3.weight": torch.zeros(2, 2)})
    with pytest.raises(ShapeMismatchError, match=r"torch 'fc2\.weight' \(8, 31\) -> \(31, 8\), but Flax "
                                                 r"'params/fc2/kernel' is \(32, 8\)"):
        km.to_flax({**sd, "fc2.weight": torch.zeros(8, 31)})
    # and back: Flax variables with a missing / extra leaf
    v = km.to_flax(sd)
    with pytest.raises(MissingKeyError, match=r"lack 'params/fc1/bias' \(for torch 'fc1\.bias'\)"):
        km.to_torch({"params": {**v["params"], "fc1": {"kernel": v["params"]["fc1"]["kernel"]}}})
    with pytest.raises(UnexpectedKeyError, match=r"'params/fc9/kernel', which no torch tensor takes"):
        km.to_torch({"params": {**v["params"], "fc9": {"kernel": np.zeros(1)}}})


def _drop_ln_bias(m):
    if isinstance(m, torch.nn.LayerNorm):
        m.bias = None  # a LayerNorm(bias=False)


def test_flatten_and_layer_type_errors(zoo):
    tm, fm, x, _ = zoo["resnet"]
    with pytest.raises(ShapeMismatchError, match=r"flatten_shapes\['fc'\] = \(16, 2, 2\) has 64 features, "
                                                 r"torch 'fc\.weight' reads 144"):
        port_weights(tm, fm, x, flatten_shapes={"fc": (16, 2, 2)})
    with pytest.raises(PortError, match=r"flatten_shapes names 'stem', which is not a torch Linear"):
        port_weights(tm, fm, x, flatten_shapes={"stem": (16, 3, 3)})

    class WithPReLU(port_zoo.TorchMLP):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.PReLU()

    _, fm, x, _ = zoo["mlp"]
    with pytest.raises(UnsupportedLayerError, match=r"torch layer 'act' \(PReLU, tensor 'act\.weight'\)"):
        port_weights(WithPReLU(), fm, x)


def test_import_does_not_import_torch():
    code = ("import sys, flaxport, flaxport.nn, flaxport.port; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
