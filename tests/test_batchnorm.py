"""flaxport.nn.BatchNorm against torch.nn.BatchNorm1d/2d, step by step, and the stock-Flax pitfall."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from flaxport.nn import BatchNorm

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

TOL = dict(rtol=1e-6, atol=1e-6)


def _run_parity(torch_bn, shape, to_torch, eps, momentum, steps=4, seed=0):
    """Train `steps` batches of `shape` (channels last) through both, then eval; compare all."""
    rng = np.random.default_rng(seed)
    c = shape[-1]
    # Non-trivial affine parameters, the same in both.
    scale = rng.uniform(0.5, 1.5, c).astype(np.float32)
    bias = rng.normal(size=c).astype(np.float32)
    with torch.no_grad():
        torch_bn.weight.copy_(torch.from_numpy(scale))
        torch_bn.bias.copy_(torch.from_numpy(bias))
    torch_bn.train()

    bn = BatchNorm(momentum=momentum, epsilon=eps)
    variables = bn.init(jax.random.key(0), jnp.zeros(shape), use_running_average=False)
    np.testing.assert_array_equal(variables["batch_stats"]["mean"], np.zeros(c))
    np.testing.assert_array_equal(variables["batch_stats"]["var"], np.ones(c))
    variables = {"params": {"scale": jnp.asarray(scale), "bias": jnp.asarray(bias)},
                 "batch_stats": variables["batch_stats"]}
    apply_train = jax.jit(lambda v, x: bn.apply(v, x, use_running_average=False, mutable=["batch_stats"]))

    for _ in range(steps):
        # Shifted, scaled batches so the running statistics move far from 0 / 1.
        x = (rng.normal(size=shape) * rng.uniform(0.5, 3.0, c) + rng.normal(size=c) * 2).astype(np.float32)
        y, upd = apply_train(variables, x)
        variables = {**variables, "batch_stats": upd["batch_stats"]}
        with torch.no_grad():
            y_t = to_torch.out(torch_bn(to_torch.inp(torch.from_numpy(x))))
        np.testing.assert_allclose(np.asarray(y), y_t.numpy(), **TOL)
        np.testing.assert_allclose(np.asarray(variables["batch_stats"]["mean"]), torch_bn.running_mean.numpy(), **TOL)
        np.testing.assert_allclose(np.asarray(variables["batch_stats"]["var"]), torch_bn.running_var.numpy(), **TOL)

    torch_bn.eval()
    x = (rng.normal(size=shape) * 2 + 1).astype(np.float32)
    y = bn.apply(variables, x, use_running_average=True)
    with torch.no_grad():
        y_t = to_torch.out(torch_bn(to_torch.inp(torch.from_numpy(x))))
    np.testing.assert_allclose(np.asarray(y), y_t.numpy(), **TOL)
    return variables


class _Identity:
    inp = out = staticmethod(lambda t: t)


class _NHWC:
    inp = staticmethod(lambda t: t.permute(0, 3, 1, 2))  # NHWC -> NCHW
    out = staticmethod(lambda t: t.permute(0, 2, 3, 1))  # NCHW -> NHWC


@pytest.mark.parametrize("eps,momentum", [(0.8, 0.1), (1e-5, 0.3)])
def test_batchnorm1d_parity(eps, momentum):
    c = 16
    _run_parity(torch.nn.BatchNorm1d(c, eps=eps, momentum=momentum), (10, c), _Identity, eps, momentum)


@pytest.mark.parametrize("eps,momentum", [(0.8, 0.1), (1e-5, 0.3)])
def test_batchnorm2d_parity_nhwc(eps, momentum):
    c = 6
    _run_parity(torch.nn.BatchNorm2d(c, eps=eps, momentum=momentum), (4, 5, 3, c), _NHWC, eps, momentum)


def _one_step_stock_flax(momentum, x):
    bn = nn.BatchNorm(use_running_average=False, momentum=momentum, epsilon=1e-5)
    v = bn.init(jax.random.key(0), x)
    _, upd = bn.apply(v, x, mutable=["batch_stats"])
    return upd["batch_stats"]


def test_stock_flax_batchnorm_is_the_pitfall():
    """flax.linen.BatchNorm(momentum=0.1), a literal copy of torch's number, does not match torch.

    Flax's momentum weighs the *old* value, so 0.1 keeps 10% of it where torch keeps 90%.
    Even the converted momentum 0.9 still differs in the running variance: Flax stores the
    biased batch variance, torch the unbiased one (factor n/(n-1)).
    """
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(10, 8)) * 2 + 3).astype(np.float32)
    tbn = torch.nn.BatchNorm1d(8, eps=1e-5, momentum=0.1)
    with torch.no_grad():
        tbn(torch.from_numpy(x))
    t_mean, t_var = tbn.running_mean.numpy(), tbn.running_var.numpy()

    literal = _one_step_stock_flax(0.1, x)
    assert not np.allclose(literal["mean"], t_mean, atol=1e-3)
    assert not np.allclose(literal["var"], t_var, atol=1e-3)

    converted = _one_step_stock_flax(0.9, x)
    np.testing.assert_allclose(converted["mean"], t_mean, rtol=1e-5, atol=1e-6)
    assert not np.allclose(converted["var"], t_var, atol=1e-3)

    # flaxport.nn.BatchNorm with torch's own number matches.
    bn = BatchNorm(momentum=0.1, epsilon=1e-5)
    v = bn.init(jax.random.key(0), x, use_running_average=False)
    _, upd = bn.apply(v, x, use_running_average=False, mutable=["batch_stats"])
    np.testing.assert_allclose(upd["batch_stats"]["mean"], t_mean, **TOL)
    np.testing.assert_allclose(upd["batch_stats"]["var"], t_var, **TOL)


def test_batch_of_one_in_train_mode_raises():
    bn = BatchNorm()
    x = jnp.ones((1, 4))
    v = bn.init(jax.random.key(0), jnp.ones((2, 4)), use_running_average=False)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn.apply(v, x, use_running_average=False, mutable=["batch_stats"])
    with pytest.raises(ValueError, match="more than 1 value per channel"):  # torch agrees
        torch.nn.BatchNorm1d(4).train()(torch.ones(1, 4))
    # Eval mode with one row is fine.
    assert bn.apply(v, x, use_running_average=True).shape == (1, 4)
