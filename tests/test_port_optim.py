"""optax_from_torch: three steps of the translated optax optimizer track torch.optim.

A small Linear-Tanh-Linear regression in both frameworks (float64, the same weights,
the same batch), params compared after each step. The JAX side holds torch's tensors
by torch name and layout, so no port is involved: only the optimizer differs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.errors import UserError  # noqa: E402
from flaxport.port import UnsupportedOptimizerError, optax_from_torch, spec_from_torch  # noqa: E402

STEPS = 3


def _problem(dtype):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(dtype)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    return net, torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


SHAPES = {"0.weight": (5, 3), "0.bias": (5,), "2.weight": (2, 5), "2.bias": (2,)}


def _unflatten(flat):
    """One vector -> {torch name: array}. The optax side keeps all parameters in one vector:
    the optimizers are elementwise, and one shape means few op compiles (test time)."""
    out, i = {}, 0
    for k, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[k], i = flat[i:i + n].reshape(shape), i + n
    return out


def _jax_loss(flat, x, y):
    p = _unflatten(flat)
    h = jnp.tanh(x @ p["0.weight"].T + p["0.bias"])
    return jnp.mean((h @ p["2.weight"].T + p["2.bias"] - y) ** 2)


def _torch_steps(make_opt, dtype=torch.float64):
    """(params after each step [{name: array}], the optimizer)."""
    net, x, y = _problem(dtype)
    opt = make_opt(net.parameters())
    out = []
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        out.append({k: v.detach().numpy().copy() for k, v in net.named_parameters()})
    return out, opt


def _optax_steps(tx, dtype=torch.float64):
    """Params after each step of `tx` from the same start: [{torch name: jax array}]."""
    net, x, y = _problem(dtype)
    params = jnp.concatenate([jnp.asarray(v.detach().numpy()).ravel() for v in net.parameters()])
    state = tx.init(params)
    grad = jax.jit(jax.grad(_jax_loss))
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    out = []
    for _ in range(STEPS):
        updates, state = tx.update(grad(params, xj, yj), state, params)
        params = optax.apply_updates(params, updates)
        out.append(_unflatten(params))
    return out


def _run_both(make_opt, dtype=torch.float64):
    """[(torch params, optax params)] after each step; the optax side translated from the torch optimizer."""
    want, opt = _torch_steps(make_opt, dtype)
    return list(zip(want, _optax_steps(optax_from_torch(opt), dtype)))


CASES = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.05),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw_default_wd": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.3),
    "adam_decoupled": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.3, decoupled_weight_decay=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "rmsprop_centered_momentum_wd": lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-3, centered=True,
                                                                  momentum=0.5, weight_decay=0.1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_three_steps_float64(case):
    with jax.enable_x64(True):
        for step, (want, got) in enumerate(_run_both(CASES[case]), start=1):
            for k in want:
                assert got[k].dtype == jnp.float64
                np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-6, atol=1e-6,
                                           err_msg=f"{case} step {step} {k}")


def test_pitfalls_are_real():
    """What the translation avoids takes other steps: optax.adamw's default weight decay
    (1e-4; torch's is 1e-2) and optax.rmsprop's defaults (eps inside the square root)."""
    with jax.enable_x64(True):
        for case, naive in (("adamw_default_wd", optax.adamw(0.01)), ("rmsprop", optax.rmsprop(0.01, decay=0.99))):
            want = _torch_steps(CASES[case])[0][-1]
            got = _optax_steps(naive)[-1]
            assert max(np.abs(np.asarray(got[k]) - want[k]).max() for k in want) > 1e-5, case


def test_spec_and_errors():
    net, _, _ = _problem(torch.float64)
    assert spec_from_torch(torch.optim.AdamW(net.parameters()))["weight_decay"] == 0.01
    # a spec gets torch's defaults: AdamW's weight decay is 0.01
    assert isinstance(optax_from_torch({"name": "AdamW", "lr": 1e-3}), optax.GradientTransformation)
    assert issubclass(UnsupportedOptimizerError, UserError)
    bad = {
        r"amsgrad=True": torch.optim.Adam(net.parameters(), amsgrad=True),
        r"maximize=True": torch.optim.SGD(net.parameters(), lr=0.1, maximize=True),
        r"dampening": torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, dampening=0.1),
        r"'adagrad' is not translated": torch.optim.Adagrad(net.parameters()),
        r"param group 1 differs from group 0 in \['lr'\]": torch.optim.SGD(
            [{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.5}], lr=0.1),
        r"adam option 'foo' is not translated": {"name": "adam", "foo": 1},
    }
    for message, opt in bad.items():
        with pytest.raises(UnsupportedOptimizerError, match=message):
            optax_from_torch(opt)
