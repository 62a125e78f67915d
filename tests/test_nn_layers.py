"""flaxport.nn's torch-faithful layers against torch.nn, forward values (float32, eager).

Each case runs the torch layer on NCHW-style input and the Flax layer on the same data
moved to channels-last, with the torch weights copied in by hand (the port module has
its own tests), so a failure here is the layer's, not the porter's.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport import nn as fpnn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")
TOL = dict(rtol=1e-5, atol=1e-5)


def _cl(t):
    """torch (N, C, *S) tensor -> NumPy (N, *S, C)."""
    return np.moveaxis(t.detach().numpy(), 1, -1)


def _x(*shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


@pytest.mark.parametrize("shape,kw", [
    ((2, 3, 9, 9), dict(kernel_size=2)),  # stride defaults to the kernel, odd size floors
    ((2, 3, 8, 8), dict(kernel_size=3, stride=2, padding=1)),  # ResNet stem pool
    ((2, 3, 9, 7), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 6, 6), dict(kernel_size=(3, 2), stride=(2, 3), ceil_mode=True)),
    ((2, 3, 10), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True)),  # 1-D
    ((1, 2, 5, 5, 5), dict(kernel_size=2, ceil_mode=True)),  # 3-D
])
def test_pools(shape, kw):
    """MaxPool, AvgPool (count_include_pad True, torch's default, and False) in one jit."""
    x = _x(*shape)
    n = len(shape) - 2
    got = jax.jit(lambda x: (fpnn.MaxPool(**kw)(x), fpnn.AvgPool(**kw)(x),
                             fpnn.avg_pool(x, count_include_pad=False, **kw)))(_cl(x))
    want = (getattr(torch.nn, f"MaxPool{n}d")(**kw)(x), getattr(torch.nn, f"AvgPool{n}d")(**kw)(x),
            getattr(torch.nn, f"AvgPool{n}d")(count_include_pad=False, **kw)(x))
    for g, w, what in zip(got, want, ("max", "avg", "avg count_include_pad=False")):
        np.testing.assert_allclose(np.asarray(g), _cl(w), err_msg=what, **TOL)


def test_pool_rejects_torch_invalid_padding():
    with pytest.raises(ValueError, match="at most half"):
        fpnn.max_pool(jnp.zeros((1, 8, 8, 1)), 2, padding=2)


def test_gelu_exact_by_default_and_flax_default_is_not():
    x = _x(1000) * 3
    exact, tanh, flax_default = jax.jit(lambda x: (fpnn.gelu(x), fpnn.GELU(approximate="tanh")(x),
                                                   jax.nn.gelu(x)))(x.numpy())
    want = torch.nn.GELU()(x).numpy()
    np.testing.assert_allclose(np.asarray(exact), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(tanh), torch.nn.GELU(approximate="tanh")(x).numpy(), rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(flax_default) - want).max() > 1e-4  # the pitfall


def _affine(t):
    return {"params": {"scale": t.weight.detach().numpy(), "bias": t.bias.detach().numpy()}}


def test_layer_norm_eps():
    # rows whose variance (~1e-5) is near eps: torch's 1e-5 and Flax's 1e-6 give other numbers
    x = 0.5 + 3e-3 * _x(4, 16)
    t = torch.nn.LayerNorm(16)
    with torch.no_grad():
        t.weight.normal_(), t.bias.normal_()
    want = t(x).detach().numpy()
    got = jax.jit(fpnn.LayerNorm().apply)(_affine(t), x.numpy())
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-3)
    flax_default = jax.nn.standardize(x.numpy(), axis=-1, epsilon=1e-6) * t.weight.detach().numpy()
    assert np.abs(np.asarray(flax_default) + t.bias.detach().numpy() - want).max() > 0.1


@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 6, 4, 3)])
def test_group_norm(shape):
    x = _x(*shape) * 2 + 1
    t = torch.nn.GroupNorm(3, 6)
    with torch.no_grad():
        t.weight.normal_(), t.bias.normal_()
    got = jax.jit(fpnn.GroupNorm(3).apply)(_affine(t), _cl(x))
    np.testing.assert_allclose(np.asarray(got), _cl(t(x)), **TOL)


@pytest.mark.parametrize("n,kw", [
    (1, dict(kernel_size=3, stride=2, padding=1, groups=2)),
    (3, dict(kernel_size=(2, 3, 1), stride=1, padding=(1, 0, 0), dilation=(1, 2, 1))),
])
def test_conv_nd(n, kw):
    t = getattr(torch.nn, f"Conv{n}d")(4, 6, **kw)
    x = _x(2, 4, *(7,) * n)
    w = t.weight.detach().numpy()
    kernel = w.transpose(tuple(range(2, n + 2)) + (1, 0))
    flax_kw = {k: v for k, v in kw.items() if k != "kernel_size"}
    layer = (fpnn.Conv1d if n == 1 else fpnn.Conv3d)(6, kw["kernel_size"], **flax_kw)
    shapes = jax.eval_shape(layer.init, jax.random.key(0), _cl(x))
    assert shapes["params"]["kernel"].shape == kernel.shape
    got = layer.apply({"params": {"kernel": kernel, "bias": t.bias.detach().numpy()}}, _cl(x))
    np.testing.assert_allclose(np.asarray(got), _cl(t(x)), **TOL)


@pytest.mark.parametrize("n,kw", [
    (2, dict(kernel_size=4, stride=2, padding=1)),
    (2, dict(kernel_size=3, stride=2, padding=1, output_padding=1)),
    (1, dict(kernel_size=5, stride=3, padding=3, output_padding=2, dilation=1)),  # padding > k-1 side crops
    (3, dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=(0, 1, 2), dilation=(1, 1, 2))),
])
def test_conv_transpose(n, kw):
    t = getattr(torch.nn, f"ConvTranspose{n}d")(3, 5, **kw)
    x = _x(2, 3, *(5,) * n)
    kernel = t.weight.detach().numpy().transpose(tuple(range(2, n + 2)) + (0, 1))
    layer = fpnn.ConvTransposeNd(5, ndim=n, **kw)
    got = layer.apply({"params": {"kernel": kernel, "bias": t.bias.detach().numpy()}}, _cl(x))
    np.testing.assert_allclose(np.asarray(got), _cl(t(x)), **TOL)


def test_conv_transpose_init_law_matches_torch():
    """Kernel and bias ~ U(+-1/sqrt(out * prod(k))): torch's fan_in for a transposed conv is
    weight.size(1) * prod(k), not the input channels."""
    params = fpnn.ConvTranspose2d(4, 3).init(jax.random.key(0), jnp.zeros((1, 5, 5, 64)))["params"]
    assert params["kernel"].shape == (3, 3, 64, 4)
    bound = 1 / np.sqrt(4 * 9)  # with fan_in = 64 * 9 the largest |w| would be a third of this
    assert bound * 0.95 < np.abs(np.asarray(params["kernel"])).max() <= bound  # 2304 draws reach the edge
    assert np.abs(np.asarray(params["bias"])).max() <= bound  # 4 draws: only the bound is sure
    t = torch.nn.ConvTranspose2d(64, 4, 3)
    assert bound * 0.95 < t.weight.abs().max().item() <= bound  # the same law on the torch side


def test_one_copy_of_torchs_numerics():
    """The Linen layers run flaxport.runtime's functions, the ones a translated file carries: no
    second copy of BatchNorm's gradient, the recurrence, pooling or the transposed convolution."""
    import importlib
    import inspect

    from flaxport.runtime import functions

    # (flaxport.nn's own names shadow two of its modules: `conv_transpose` is also a function)
    batchnorm, conv, conv_transpose, pool, recurrent = (importlib.import_module(f"flaxport.nn.{name}") for name in
                                                        ("batchnorm", "conv", "conv_transpose", "pool", "recurrent"))

    assert batchnorm.batch_norm_train is functions.batch_norm_train
    assert recurrent.lstm_scan is functions.lstm_scan and recurrent.gru_scan is functions.gru_scan
    assert pool.functions is functions and conv.functions is functions and conv_transpose.functions is functions
    written_here = {batchnorm: ("custom_vjp", "rsqrt(var"), recurrent: ("lax.scan", "sigmoid"),
                    pool: ("reduce_window(", "lax.max"), conv: ("reduce_window(", ".max(axis"),
                    conv_transpose: ("conv_general_dilated", "slice(None, None, -1)")}
    for module, words in written_here.items():
        source = inspect.getsource(module)
        assert not [w for w in words if w in source], f"{module.__name__} computes what flaxport.runtime does"


@pytest.mark.parametrize("dims, c, o, groups, k, stride, padding, dilation", [
    (2, 8, 8, 8, 3, 1, 1, 1), (2, 8, 16, 8, 5, 2, 2, 1), (2, 12, 6, 3, 3, 2, 0, 2), (1, 6, 6, 6, 4, 3, 1, 1),
    (3, 4, 8, 2, 3, 1, 1, 1), (2, 6, 6, 6, 3, (2, 1), (1, 0), (1, 2))])
def test_a_grouped_float64_convolution_by_taps_is_torchs_with_its_gradients(dims, c, o, groups, k, stride, padding,
                                                                           dilation):
    """The runtime's grouped float64 convolution on a CPU (a sum over the kernel's taps: XLA would
    expand it to a dense kernel of (O, C, *K)) against torch in double, values and both gradients."""
    from flaxport.runtime.functions import conv

    torch.manual_seed(0)
    x = torch.randn(2, c, *([9] * dims), dtype=torch.float64, requires_grad=True)
    w = torch.randn(o, c // groups, *([k] * dims), dtype=torch.float64, requires_grad=True)
    f = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[dims - 1]
    want = f(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    cotangent = torch.randn_like(want)
    want.backward(cotangent)
    with jax.enable_x64(True):
        got, vjp = jax.vjp(lambda a, b: conv(a, b, stride=stride, padding=padding, dilation=dilation, groups=groups),
                           jnp.asarray(x.detach().numpy()), jnp.asarray(w.detach().numpy()))
        grad_x, grad_w = vjp(jnp.asarray(cotangent.numpy()))
        assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(grad_x), x.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(grad_w), w.grad.numpy(), rtol=1e-12, atol=1e-12)
