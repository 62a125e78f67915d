"""register_converter: an unknown torch layer is one registration away; the built-in layers go
through the same registry; a converter that gets a shape wrong fails in one line.
"""
import jax
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

from flaxport import nn as fpnn  # noqa: E402
from flaxport.port import (ShapeMismatchError, Slot, UnsupportedLayerError, build_key_map,  # noqa: E402
                           check_parity, port_weights, register_converter, to_torch_state_dict,
                           unregister_converter)
from flaxport.port.converters import converter_for  # noqa: E402


class Scale(torch.nn.Module):
    """A layer flaxport does not know: y = x * gamma + beta over the last axis, with a (1, C) beta."""

    def __init__(self, c):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.linspace(0.5, 1.5, c))
        self.beta = torch.nn.Parameter(torch.linspace(-1, 1, c)[None])

    def forward(self, x):
        return x * self.gamma + self.beta


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 6)
        self.scale = Scale(6)

    def forward(self, x):
        return self.scale(torch.tanh(self.fc(x)))


class FlaxScale(nn.Module):
    @nn.compact
    def __call__(self, x):
        c = x.shape[-1]
        return x * self.param("g", nn.initializers.ones, (c,)) + self.param("b", nn.initializers.zeros, (c,))


class FlaxNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        return FlaxScale(name="scale")(jax.numpy.tanh(fpnn.Dense(6, name="fc")(x)))


@pytest.fixture
def registry():
    """Registrations made in a test are removed after it."""
    made = []
    yield lambda *a, **kw: made.append(register_converter(*a, **kw)) or made[-1]
    for conv in made:
        unregister_converter(conv)


def _net():
    torch.manual_seed(0)
    return TorchNet(), FlaxNet(), torch.randn(3, 4)


def test_unknown_layer_is_one_registration_away(registry):
    tm, fm, x = _net()
    with pytest.raises(UnsupportedLayerError, match=r"torch layer 'scale' \(Scale, tensor 'scale.gamma'\) is not a "
                                                    r"type .*register_converter\(Scale, fn\)") as e:
        port_weights(tm, fm, x)
    assert "\n" not in str(e.value)
    registry(Scale, lambda t, f: {"gamma": "g", "beta": Slot("b", to_flax=lambda a: a.reshape(-1),
                                                               to_torch=lambda a: a.reshape(1, -1))})
    km = build_key_map(tm, fm, x)
    variables = km.to_flax(tm.state_dict())
    np.testing.assert_array_equal(variables["params"]["scale"]["b"], tm.scale.beta.detach().numpy()[0])
    report = check_parity(tm, fm, variables, x, train=True, key_map=km)
    assert report.strict_ok and "scale" in {r.torch_name for r in report.rows if r.phase == "forward"}, str(report)
    assert {"scale.gamma", "scale.beta"} <= {r.torch_name for r in report.rows if r.phase == "grad"}
    back = to_torch_state_dict(variables, tm, fm, x, key_map=km)
    assert all(torch.equal(back[k], v) for k, v in tm.state_dict().items())  # both ways, bit-exact


def test_a_converter_that_gets_the_shape_wrong_fails_in_one_line(registry):
    tm, fm, x = _net()
    registry(Scale, {"gamma": "g", "beta": "b"})  # beta is (1, 6) in torch, b is (6,) in Flax
    with pytest.raises(ShapeMismatchError, match=r"shape mismatch: torch 'scale.beta' \(1, 6\) -> \(1, 6\), but "
                                                 r"Flax 'params/scale/b' is \(6,\)") as e:
        port_weights(tm, fm, x)
    assert "\n" not in str(e.value)
    registry(Scale, lambda t, f: {"gamma": "g", "beta": Slot("b", to_flax=lambda a: a.T, to_torch=lambda a: a.T)})
    with pytest.raises(ShapeMismatchError, match=r"-> \(6, 1\) by the converter for Scale") as e:
        port_weights(tm, fm, x)
    assert "\n" not in str(e.value)
    registry(Scale, lambda t, f: {"gamma": "g", "beta": Slot("b", to_flax=lambda a: a.reshape(7))})
    with pytest.raises(Exception, match=r"the converter for Scale failed on torch 'scale.beta' \(1, 6\): "
                                        r"ValueError") as e:
        port_weights(tm, fm, x)
    assert "\n" not in str(e.value)


def test_builtin_layers_use_the_same_registry(registry):
    """nn.Linear's converter is a registry entry; a registration for it wins (here: a Flax layer
    that keeps torch's (out, in) weight), and removing it restores the built-in."""
    assert converter_for(torch.nn.Linear(2, 3)).builtin and converter_for(torch.nn.LSTM(2, 3)).kind == "lstm"

    class OutInDense(nn.Module):
        features: int

        @nn.compact
        def __call__(self, x):
            w = self.param("weight", nn.initializers.lecun_normal(), (self.features, x.shape[-1]))
            return x @ w.T + self.param("bias", nn.initializers.zeros, (self.features,))

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            return OutInDense(3, name="lin")(x)

    class Torch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x)

    tm, x = Torch(), torch.randn(2, 4)
    conv = registry(torch.nn.Linear, {"weight": "weight", "bias": "bias"}, flax_types=(OutInDense,))
    variables = port_weights(tm, Net(), x)
    np.testing.assert_array_equal(variables["params"]["lin"]["weight"], tm.lin.weight.detach().numpy())
    assert check_parity(tm, Net(), variables, x).strict_ok
    unregister_converter(conv)
    assert converter_for(torch.nn.Linear(2, 3)).builtin
